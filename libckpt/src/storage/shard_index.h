// storage/shard_index.h: the shard index (FORMAT.md §5.5), the root attribute by which a
// shard describes itself. Written and parsed here only: one spelling of its keys, one
// strict parser for every reader.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/metadata.h"
#include "storage/fs.h"

namespace ckpt::storage {

// One dataset of a shard as its index lists it. In a v2 index (FORMAT.md §5.5) the record
// is the chunk's whole description: `chunk` carries box, dataset, offset, checksum,
// stored_bytes, compression, block_bytes, blocks and stats (not `file`). A v1 index
// carries only box, dataset and offset.
struct ShardIndexEntry {
  std::string key;
  bool bytes = false;            // a bytes entry (dtype "bytes"): dtype uint8, box {0}/{size}
  DType dtype = DType::kUInt8;
  Shape shape;                   // the tensor's global shape (a bytes entry: {size})
  ChunkMeta chunk;
};

// A parsed index: its version and its records, in the order the writer added them.
struct ShardIndex {
  int format_version = 0;
  std::vector<ShardIndexEntry> entries;
};

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

// Parses index text strictly: any malformed member, an unknown dtype, a bad rank, a chunk
// outside its shape or an overflowing extent is kCorrupt (kUnsupported for an unknown
// dtype or a newer format_version), the message starting with `where`.
ShardIndex ParseShardIndex(std::string_view text, const std::string& where);

// "xxh3-64:<16 hex>" of the index text exactly as stored: what metadata.json's
// files[i].index records (FORMAT.md §3.1).
std::string IndexDigest(std::string_view text);

}  // namespace ckpt::storage
