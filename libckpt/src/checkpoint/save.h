// checkpoint/save.h: the collective save with what SaveAsync adds around it (its snapshot
// and blocked times, cancellation), and the per-phase timings it records (FORMAT.md §3.8).
#pragma once

#include <array>
#include <filesystem>
#include <functional>
#include <iterator>
#include <span>
#include <vector>

#include "ckpt/checkpoint.h"

namespace ckpt::internal {

// Seconds per phase of one rank, in kSavePhaseNames order.
using PhaseSeconds = std::array<double, std::size(kSavePhaseNames)>;

struct SaveContext {
  bool async = false;
  double snapshot_seconds = 0;
  double blocked_seconds = 0;  // async: the caller's; a sync save measures its own
  // Called between chunks, after the write and (rank 0) before the commit; throws to stop
  // the save, which then fails on every rank and commits nothing.
  std::function<void()> check;
  // SaveAsync's snapshot: the bytes of each bytes entry, by entry index (state order), staged
  // in its pool; the snapshot's Bytes entries themselves are left empty. Empty: every entry's
  // own bytes.
  std::span<const std::span<const uint8_t>> staged_bytes;
  // Step 1's fast path (layout/save_plan.h, KeyTable): off, every rank describes every entry
  // (for tests, which prove the checkpoint is the same either way). The same on every rank.
  bool fast_plan = true;
};

// COLLECTIVE. Save (checkpoint.h) under `context`.
void SaveWithContext(const std::filesystem::path& dir, const StateDict& state, Comm& comm,
                     const SaveOptions& options, const SaveContext& context);

// The ranks' seconds (in rank order) summarised: min, median, max and the slowest rank.
SaveTimings SummarizeTimings(bool async, const std::vector<PhaseSeconds>& ranks);

}  // namespace ckpt::internal
