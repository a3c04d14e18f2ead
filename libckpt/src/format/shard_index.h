// format/shard_index.h: the shard index (FORMAT.md §5.5), the text by which a shard
// describes itself: one writer of its records, one strict parser for every reader. Its
// storage (the HDF5 attribute, the writer's spill file) is storage/'s.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/metadata.h"

namespace ckpt::format {

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

// The text of an index: ShardIndexHead(), the records separated by ',', ShardIndexTail().
std::string ShardIndexHead();  // {"format":"ckpt-shard","format_version":2,"chunks":[
inline constexpr std::string_view kShardIndexTail = "]}";
// Appends one record (`chunk.file` is not written: the record is inside it).
void AppendShardRecord(std::string& out, const std::string& key, bool bytes, DType dtype, const Shape& shape,
                       const ChunkMeta& chunk);

// Parses index text strictly: any malformed member, an unknown dtype, a bad rank, a chunk
// outside its shape or an overflowing extent is kCorrupt (kUnsupported for an unknown
// dtype or a newer format_version), the message starting with `where`.
ShardIndex ParseShardIndex(std::string_view text, const std::string& where);

// "xxh3-64:<16 hex>" of the index text exactly as stored: what metadata.json's
// files[i].index records (FORMAT.md §3.1).
std::string IndexDigest(std::string_view text);

// The byte size of `shape` must not overflow (FORMAT.md §8.4): kCorrupt starting with `what`.
void CheckExtent(const Shape& shape, std::size_t itemsize, const std::string& what);

}  // namespace ckpt::format
