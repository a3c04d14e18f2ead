// format/metadata_model.h: what metadata.json's reader and writer share of the model.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/metadata.h"

namespace ckpt::format {

// A file's name -> its position in 'files'.
using FileIndex = std::unordered_map<std::string, int32_t>;

// The layout of `chunks` (a v1 entry's, or a save's resolved ones) into m, and the
// aggregate of their stats and stored bytes.
void DeriveLayout(EntryMeta& m, const std::vector<ChunkMeta>& chunks, const FileIndex& files);

// Ranks and world sizes beyond this are corruption, not a job (FORMAT.md §8).
inline constexpr int64_t kMaxRanks = int64_t{1} << 30;

}  // namespace ckpt::format
