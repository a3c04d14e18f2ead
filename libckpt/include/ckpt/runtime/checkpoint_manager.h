// ckpt/runtime/checkpoint_manager.h: periodic checkpoints, the last N kept, and resume.
//
// Layout under `root`: one checkpoint directory per save, "step-<8 digits>", and a file
// "latest" naming the newest committed one (replaced atomically after each save). A
// directory without metadata.json (a save that crashed) is never resumed from and never
// counted among the N kept.
//
// Asynchronous saves (SaveAsync) write in the background; `latest` moves, and the oldest
// checkpoints are pruned, only after the new one has committed. At most one is in flight:
// every other call (Save, SaveAsync, Resume) first waits for it.
//
// On object storage (`root` = s3://bucket/prefix, reached with the ObjectStoreOptions given
// at construction, which override SaveStateOptions::s3): the same layout of prefixes
// "<root>/step-<8 digits>/", committed when their metadata.json is there. No `latest`
// object is kept: Latest() is the newest committed step (one LIST). Pruning deletes a
// checkpoint's metadata.json first, then its objects. Before each save, leftovers under the
// root older than ObjectStoreOptions::leftover_grace_seconds are removed
// (files::CleanObjectLeftovers). Resume loads through Load's interim s3:// path (each rank
// downloads the checkpoint: ObjectStoreOptions::cache_max_bytes).
//
// Threading: one manager per rank; Save, SaveAsync and Resume are COLLECTIVE.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "ckpt/runtime/accelerator.h"

namespace ckpt::runtime {

class CheckpointManager {
 public:
  CheckpointManager(Accelerator& accel, std::filesystem::path root, int keep_last = 3,
                    ObjectStoreOptions s3 = {});
  // Waits for the save in flight (its failure, if any, is then the next SaveAsync's on the
  // world Comm, or printed when that goes too: call Wait() to see it).
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // COLLECTIVE. Saves the accelerator's state as root/step-<step>, marks it latest and
  // removes the oldest committed checkpoints beyond keep_last. Returns its directory.
  std::filesystem::path Save(int64_t step, const SaveStateOptions& options = {});
  // COLLECTIVE. Save in the background: returns once the state is snapshotted (the caller
  // may train on). The handle tells when root/step-<step> has committed, `latest` moved and
  // the pruning is done, and throws what failed.
  SaveHandle SaveAsync(int64_t step, const SaveStateOptions& options = {});
  // Waits for the save in flight, if any; throws its failure. Not collective.
  void Wait();
  // COLLECTIVE. Loads the latest complete checkpoint; its step, or nullopt when none.
  std::optional<int64_t> Resume(const LoadStateOptions& options = {});

  // Committed checkpoints, oldest first (by step).
  std::vector<std::pair<int64_t, std::filesystem::path>> Committed() const;
  // The one "latest" names when it is committed, else the newest committed one.
  std::optional<std::pair<int64_t, std::filesystem::path>> Latest() const;
  static std::filesystem::path DirFor(const std::filesystem::path& root, int64_t step);

 private:
  // Before a save: the root made, leftovers of killed saves removed (rank 0, agreed).
  void PrepareRoot();
  Accelerator* accel_;
  std::filesystem::path root_;
  int keep_last_;
  ObjectStoreOptions s3_;
  SaveHandle in_flight_;
};

}  // namespace ckpt::runtime
