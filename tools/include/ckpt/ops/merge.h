// ckpt/ops/merge.h: ckpt-merge and ckpt-convert as library calls. Streams any source
// (checkpoint directory, lone shard holding whole tensors, safetensors file) into
//   - a FULL checkpoint with one file (default),
//   - a SHARDED checkpoint of `world` files, every tensor split along `dim`,
//   - one .safetensors file (when the destination ends in .safetensors),
//   - the Hub's sharded safetensors (a destination ending in .safetensors.index.json, or
//     .safetensors with max_shard_size: see WriteShardedSafetensors in merge.cc and
//     ckpt/ops/safetensors.h), or
//   - one HDF5 file of virtual datasets stitching each full tensor from the source's
//     shards (`virtual_file`): no byte copied.
// Memory is bounded by `max_memory` whatever the size of the checkpoint. Where a tensor's
// bytes stay as they are (no cast, no compression, an uncompressed source), each output
// part (the whole tensor, or its slab with `world`) is one chunk copied file to file
// inside the kernel, hashed as it goes and never through a buffer; otherwise tensors pass
// through memory in blocks of at most `chunk_bytes`, and larger ones are stored as
// several chunks. Every source chunk's checksum is checked on the way (a merge never
// turns corrupt bytes into a fresh, valid checksum). The output is written to a temporary
// sibling, verified, and only then renamed into place.
//
// Thread-safety: Merge is reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/metadata.h"

namespace ckpt::ops {

struct MergeOptions {
  int world = 0;  // 0: FULL, one file; M >= 1: SHARDED into M files
  int dim = 0;    // the dimension tensors are split along when world > 0
  std::vector<std::string> keys;     // include globs (empty: all)
  std::vector<std::string> exclude;  // exclude globs
  std::optional<DType> cast;         // cast floating tensors to this dtype
  Compression compression;
  // Chunks of at most this many bytes that pass through memory are packed in the output
  // (FORMAT.md §5.7; CheckpointWriter::Options::pack_bytes). 0: each its own dataset.
  uint64_t pack_bytes = 0;
  uint64_t max_memory = uint64_t{1} << 30;
  // Tensors larger than this are copied, and stored, as several chunks of whole rows.
  // Small blocks stay in the CPU cache between read and write; a larger value (up to
  // max_memory / 8) gives one dataset per tensor for readers that want that.
  uint64_t chunk_bytes = uint64_t{16} << 20;
  // Parts smaller than this go through memory even when they could be copied file to
  // file (one read and one write cost less than setting up a copy).
  uint64_t copy_min_bytes = uint64_t{1} << 20;
  bool force = false;         // replace an existing destination
  bool virtual_file = false;  // write HDF5 virtual datasets instead of copies
  bool verify_data = false;   // also re-read and checksum the output before committing it
  // A safetensors tensor of a dtype ckpt lacks is skipped (named in MergeReport::skipped)
  // instead of refusing the whole file.
  bool skip_unsupported = false;
  bool progress = false;
  // Safetensors output in shards of at most this many tensor bytes, as save_pretrained's
  // max_shard_size (a larger tensor gets a shard of its own). 0: one file for a .safetensors
  // destination, kDefaultMaxShardSize for a .safetensors.index.json one.
  uint64_t max_shard_size = 0;
};

inline constexpr uint64_t kDefaultMaxShardSize = uint64_t{5} * 1000 * 1000 * 1000;  // "5GB", as transformers

struct MergeReport {
  std::string src, dst;
  std::string output;  // "checkpoint", "safetensors" or "virtual"
  std::size_t tensors = 0, other_entries = 0, chunks = 0, files = 0;
  uint64_t bytes = 0;         // logical tensor bytes written
  uint64_t bytes_copied = 0;  // of which copied file to file (no cast, no compression)
  double seconds = 0;
  std::vector<std::string> notes;  // entries that could not be carried over, and why
  // Selected tensors left out by skip_unsupported: "'name' (dtype 'F4')".
  std::vector<std::string> skipped;
};

// Throws kAlreadyExists (dst exists without force), kInvalidArgument (bad options, a
// partial tensor in a lone shard), or the source's errors (naming file and key).
CKPT_API MergeReport Merge(const std::filesystem::path& src, const std::filesystem::path& dst,
                  const MergeOptions& options);

CKPT_API std::string RenderMergeText(const MergeReport& report);
CKPT_API std::string RenderMergeJson(const MergeReport& report);

}  // namespace ckpt::ops
