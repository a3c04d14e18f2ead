// storage/digest.h: the checksum (XXH3-64) and statistics of a chunk, computed in one
// streaming pass over its bytes (FORMAT.md §7): v1 over the bytes themselves, v2 over the
// digests of its blocks (each block of `block_bytes` hashed on its own).
//
// Threading: a Digest is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/error.h"
#include "ckpt/metadata.h"

namespace ckpt::storage {

// The block size v2 writers use. Measured with ckpt-bench-blocks (bench/core/bench_blocks.cc)
// on a 256 MiB float32 tensor; see kDefaultBlockBytes's comment in digest.cc's header note.
//
// 1 MiB: block-mode hashing costs nothing measurable against v1 from 64 KiB up (smaller
// blocks pay a per-block reset), the index holds 16 hex digits per block, 16 KiB per GB
// (4 KiB blocks would put 4 MiB per GB into every shard index, and metadata-free planning
// reads those indexes), and the extra read a partial run pays is at most one block at each
// end: 2 MiB around a row slice, which a warm or cold read of a slice of a few MiB absorbs
// (see the table in the bench's output and in the block-size note of FORMAT.md §7).
inline constexpr uint64_t kDefaultBlockBytes = uint64_t{1} << 20;
inline constexpr uint64_t kMinBlockBytes = uint64_t{4} << 10;   // FORMAT.md §7: 4 KiB..64 MiB
inline constexpr uint64_t kMaxBlockBytes = uint64_t{64} << 20;

class Digest {
 public:
  // Statistics are gathered for floating dtypes when `with_stats`. With `block_bytes` > 0
  // (a power of two), the bytes are hashed in blocks of that size (format v2): Checksum()
  // is then the hash of the block digests, Blocks() their hex list.
  Digest(DType dtype, bool with_stats, uint64_t block_bytes = 0);
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  // Feeds bytes in order. Pieces may split elements; statistics handle that.
  void Update(const void* data, std::size_t n);
  // "xxh3-64:<16 hex>".
  std::string Checksum() const;
  std::optional<ChunkStats> Stats() const;
  // Block mode: every block's digest so far, the last (partial) one included; and the
  // same as FORMAT.md's "blocks" hex string.
  std::vector<uint64_t> BlockDigests() const;
  std::string Blocks() const;
  uint64_t block_bytes() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One-shot checksum of a buffer (v1: over the bytes).
std::string ChecksumOf(const void* data, std::size_t n);

// XXH3-64 (seed 0) of a buffer, the AVX2 build where the CPU has it: one block's digest.
uint64_t HashBlock(const void* data, std::size_t n);
// "xxh3-64:%016x".
std::string FormatChecksum(uint64_t hash);
// The v2 chunk checksum over block digests (each 8 bytes little-endian), from the list or
// from its hex string (REQUIRES: 16 lowercase hex digits per block).
std::string ChecksumOfBlocks(const std::vector<uint64_t>& digests);
std::string ChecksumOfBlocks(std::string_view hex);
// Digest `i` of a "blocks" hex string; the hex string of digests.
uint64_t BlockDigestAt(std::string_view hex, std::size_t i);
std::string BlocksHex(const std::vector<uint64_t>& digests);
// Throws kCorrupt unless `got` (the digest of a whole chunk's `n` bytes, in the chunk's own
// block size) matches `expected`: v2 block by block, the first bad block named with its
// byte range, then the checksum; v1 the checksum. Messages start with `what`.
void CheckDigest(const Digest& got, const ChunkMeta& expected, uint64_t n, std::string_view what);
// The error for block `i` (of `block_bytes`, in a chunk of `n` bytes) hashing to `got`
// where the index says `want`.
Error BlockMismatch(std::string_view what, uint64_t i, uint64_t block_bytes, uint64_t n, uint64_t want, uint64_t got);

// Number of blocks of a chunk of `n` bytes: ceil(n / block_bytes) (0 for n == 0).
inline uint64_t BlockCount(uint64_t n, uint64_t block_bytes) { return n == 0 ? 0 : (n - 1) / block_bytes + 1; }

}  // namespace ckpt::storage
