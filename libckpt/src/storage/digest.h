// storage/digest.h: the checksum (XXH3-64) and statistics of a chunk, computed in one
// streaming pass over its bytes (FORMAT.md §7): v1 over the bytes themselves, v2 over the
// digests of its blocks (each block of `block_bytes` hashed on its own).
//
// Threading: a Digest is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/digest.h"
#include "ckpt/dtype.h"
#include "ckpt/error.h"
#include "ckpt/metadata.h"
#include "format/checksum.h"

namespace ckpt::storage {

// The block size v2 writers use: 64 KiB, chosen with ckpt-bench-blocks (bench/core/
// bench_blocks.cc; 256 MiB float32 [16384, 4096], 2-core VM, figures in its header note):
// - hashing in blocks costs the same as v1 at every size from 4 KiB to 16 MiB (XXH3's
//   per-call setup is noise even at 4 KiB), so throughput does not decide;
// - the shard index holds 16 hex digits per block: 3.7 MiB per GB of data at 4 KiB,
//   240 KiB at 64 KiB (0.02 % of the data, parsed by every rank that reads the shard),
//   16 KiB at 1 MiB;
// - a read pays up to one extra block at each end of every contiguous run (on average one
//   block per run): a 64 KiB row slice reads in ~10 us warm up to 128 KiB blocks, 130 us
//   at 1 MiB, 8 ms at 16 MiB; a resharded load of a model with a few hundred tensors makes
//   a few hundred runs per rank, ~20 MB extra at 64 KiB against ~300 MB at 1 MiB;
// - large slices (a third of the rows), column slices and whole chunks take the same time
//   at every block size (column slices with rows under a block read every block anyway).
// 64 KiB is the smallest size whose index stays well under a thousandth of the data.
using ckpt::kDefaultBlockBytes;  // ckpt/digest.h
using ckpt::kMaxBlockBytes;  // FORMAT.md §7: 4 KiB..64 MiB
using ckpt::kMinBlockBytes;

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
  // Update(data, n) with the same result, bit for bit, its work spread over the worker pool
  // (storage/pool.h) when the bytes are large and start on a block boundary (block mode):
  // segments of them are hashed and summed on different cores, then combined in order.
  // Every byte is handed to `also(piece, length, position)` (position counted from `data`),
  // in order, one piece at a time on one thread: spread over the pool, the pool's task 0
  // hands over pieces of 8 MiB (or one block where blocks are larger) while the other tasks
  // digest, so a file written there is written by one thread, in order, in large writes;
  // on the caller alone (small, or mid-block), each 256 KiB piece is handed over and then
  // digested while it is in cache. An exception from `also` propagates (the digest is then
  // incomplete).
  using PieceFn = std::function<void(const unsigned char*, std::size_t, std::size_t)>;
  void UpdateParallel(const void* data, std::size_t n, const PieceFn& also = {});
  // True in block mode at a block boundary without statistics: then AdoptBlocks(d, k) has
  // the effect of feeding the `k` whole blocks whose digests are d[0..k) (computed
  // elsewhere: a copied chunk's own, checked against its index).
  bool CanAdoptBlocks() const;
  void AdoptBlocks(const uint64_t* digests, std::size_t count);
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

using ckpt::BlockCount;  // ceil(n / block_bytes) (ckpt/digest.h)

}  // namespace ckpt::storage
