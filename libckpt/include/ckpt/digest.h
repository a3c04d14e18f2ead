// ckpt/digest.h: the checksum and statistics of a chunk (FORMAT.md §7), as a checkpoint
// stores them, for programs that write or check chunk bytes outside Save and Load: a
// converter that records digests beside its output, a tool that compares tensors by
// checksum, a reader of bytes it located with CheckpointReader::LocateChunk.
//
// The checksum is XXH3-64 (seed 0), spelled "xxh3-64:<16 lowercase hex digits>":
// - format v1: over the chunk's raw little-endian bytes;
// - format v2: the bytes are hashed in blocks of `block_bytes` (a power of two in
//   [kMinBlockBytes, kMaxBlockBytes]; the last block may be short), each block's digest is
//   kept ("blocks": 16 hex digits per block), and the checksum is XXH3-64 over the block
//   digests, each as 8 bytes little-endian.
// Statistics (ChunkStats: min, max, mean, l2 over the finite elements, NaN and Inf counts)
// are gathered for floating dtypes.
//
// Threading: a ChunkDigest is used by one thread at a time; the free functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/export.h"
#include "ckpt/metadata.h"

namespace ckpt {

// The block sizes FORMAT.md §7 allows, and the one libckpt's writers use.
inline constexpr uint64_t kMinBlockBytes = uint64_t{4} << 10;
inline constexpr uint64_t kMaxBlockBytes = uint64_t{64} << 20;
inline constexpr uint64_t kDefaultBlockBytes = uint64_t{64} << 10;

// Number of blocks of a chunk of `n` bytes: ceil(n / block_bytes), 0 for n == 0.
// REQUIRES: block_bytes > 0.
constexpr uint64_t BlockCount(uint64_t n, uint64_t block_bytes) {
  return n == 0 ? 0 : (n - 1) / block_bytes + 1;
}

// The digest of one chunk, fed its bytes in order.
class CKPT_API ChunkDigest {
 public:
  // Statistics are gathered when `with_stats` and `dtype` is floating. `block_bytes` 0: the
  // v1 checksum; otherwise the v2 one, in blocks of that size (kInvalidArgument unless a
  // power of two in [kMinBlockBytes, kMaxBlockBytes]).
  ChunkDigest(DType dtype, bool with_stats, uint64_t block_bytes = 0);
  ~ChunkDigest();
  ChunkDigest(ChunkDigest&&) noexcept;
  ChunkDigest& operator=(ChunkDigest&&) noexcept;

  // Feeds the next `n` bytes. Pieces may split elements and blocks anywhere.
  void Update(const void* data, std::size_t n);
  // "xxh3-64:<16 hex>" of the bytes so far.
  std::string Checksum() const;
  // The statistics of the elements so far; nullopt without statistics (see the constructor).
  std::optional<ChunkStats> Stats() const;
  // v2: every block's digest so far (the last, partial block included), and the same as
  // FORMAT.md's "blocks" hex string. Empty in v1.
  std::vector<uint64_t> BlockDigests() const;
  std::string Blocks() const;
  uint64_t block_bytes() const;

  // Throws kCorrupt unless the `n` bytes fed match `expected` (its checksum; in v2 its
  // blocks first, the first bad block named with its byte range). Messages start with
  // `what` (a file and key). REQUIRES: this digest's block size is expected.block_bytes.
  void Check(const ChunkMeta& expected, uint64_t n, std::string_view what) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// XXH3-64 (seed 0) of a buffer: one block's digest.
CKPT_API uint64_t HashBlock(const void* data, std::size_t n);
// "xxh3-64:%016x".
CKPT_API std::string FormatChecksum(uint64_t hash);
// The v2 checksum of a chunk from its "blocks" hex string (kCorrupt unless it is 16
// lowercase hex digits per block).
CKPT_API std::string ChecksumOfBlocks(std::string_view blocks_hex);

}  // namespace ckpt
