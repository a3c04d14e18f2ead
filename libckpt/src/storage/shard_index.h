// storage/shard_index.h: a shard's index (FORMAT.md §5.5) as the shard writer builds it: its
// text (format/shard_index.h) kept, or spilled to an unnamed temporary file. Its records,
// parser and digest are format/'s, named here as the shard code has always named them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "ckpt/metadata.h"
#include "format/shard_index.h"
#include "storage/fs.h"

namespace ckpt::storage {

using format::IndexDigest;
using format::ParseShardIndex;
using format::ShardIndex;
using format::ShardIndexEntry;

// Builds the index text entry by entry (kept as text, not as a JSON tree). Given a
// directory, the text beyond kSpillBytes goes to an unnamed temporary file there
// (O_TMPFILE, gone when closed), so a shard of millions of chunks holds at most that much
// of its index in memory until Finish reads it back.
class ShardIndexBuilder {
 public:
  static constexpr std::size_t kSpillBytes = std::size_t{1} << 20;
  ShardIndexBuilder() = default;
  explicit ShardIndexBuilder(std::filesystem::path spill_dir) : spill_dir_(std::move(spill_dir)) {}
  void Add(const ShardIndexEntry& entry);
  // The same record from its parts (`chunk.file` is not written: the record is inside it).
  void Add(const std::string& key, bool bytes, DType dtype, const Shape& shape, const ChunkMeta& chunk);
  // {"format": "ckpt-shard", "format_version": 2, "chunks": [...]}.
  std::string Finish();
  uint64_t spilled_bytes() const { return spilled_; }

 private:
  void Spill();
  std::string chunks_;
  bool any_ = false;
  std::filesystem::path spill_dir_;
  Fd spill_;
  uint64_t spilled_ = 0;
};

}  // namespace ckpt::storage
