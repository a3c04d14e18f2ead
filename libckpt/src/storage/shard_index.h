// storage/shard_index.h: the shard index (FORMAT.md §5.5), the root attribute by which a
// shard describes itself. Written and parsed here only: one spelling of its keys, one
// strict parser for every reader.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/metadata.h"

namespace ckpt::storage {

// One dataset of a shard as its index lists it.
struct ShardIndexEntry {
  std::string key;
  bool bytes = false;            // a bytes entry (dtype "bytes"): dtype uint8, box {0}/{size}
  DType dtype = DType::kUInt8;
  Shape shape;                   // the tensor's global shape (a bytes entry: {size})
  Box box;                       // the chunk's offsets and sizes
  std::string dataset;
  std::optional<uint64_t> offset;  // of its data in the file, when contiguous with data
};

// Builds the index text entry by entry (kept as text, not as a JSON tree).
class ShardIndexBuilder {
 public:
  void Add(const ShardIndexEntry& entry);
  // {"format": "ckpt-shard", "format_version": ..., "chunks": [...]}.
  std::string Finish() const;

 private:
  std::string chunks_;
};

// Parses index text strictly: any malformed member, an unknown dtype, a bad rank, a chunk
// outside its shape or an overflowing extent is kCorrupt (kUnsupported for an unknown
// dtype or a newer format_version), the message starting with `where`.
std::vector<ShardIndexEntry> ParseShardIndex(std::string_view text, const std::string& where);

}  // namespace ckpt::storage
