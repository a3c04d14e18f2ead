// ckpt/ops/source.h: one read-only view over anything the tools accept as input: a
// checkpoint directory, a single ckpt shard (.h5, described by its ckpt_shard_index
// attribute, FORMAT.md §5.5), a .safetensors file or a Hub model directory (sharded: a
// *.safetensors.index.json, or the directory holding it; or one model.safetensors). Each is presented as a Metadata
// (synthesised for shards and safetensors) plus region reads by key.
//
// Thread-safety: one Source per thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/metadata.h"
#include "ckpt/tensor.h"

namespace ckpt::ops {

enum class SourceKind { kCheckpoint, kShard, kSafetensors };
CKPT_API std::string_view SourceKindName(SourceKind kind);  // "checkpoint", "shard", "safetensors"

class CKPT_API Source {
 public:
  // Detects the kind: a directory is a checkpoint (or, without metadata.json, sharded
  // a Hub model directory if it holds an index or a model.safetensors, see FindHubModel); a file is safetensors if
  // its name ends in .safetensors, a safetensors index if in .safetensors.index.json (each
  // tensor must be in the file its weight_map names, and each file's tensors in the
  // weight_map: kCorrupt otherwise), an HDF5 shard if it starts with the HDF5 signature. Reads metadata
  // only. Throws kNotFound / kIO / kCorrupt / kUnsupported naming the path.
  // `skip_unsupported`: a safetensors tensor of a dtype ckpt lacks is left out (and listed
  // in skipped()) instead of refusing the file.
  // `resolve` false: a v2 checkpoint's metadata() is metadata.json alone (layouts and
  // aggregate stats, EntryMeta::chunks empty: Metadata::resolved false), no shard opened.
  static std::unique_ptr<Source> Open(const std::filesystem::path& path, bool skip_unsupported = false,
                                      bool resolve = true);
  virtual ~Source() = default;

  virtual SourceKind kind() const = 0;
  // Another Source over the same input, for another thread. A checkpoint's reads the very
  // checkpoint this one reads (the same directory handle and metadata), whatever has been
  // committed at its path since; a file is opened again by its path.
  virtual std::unique_ptr<Source> Reopen() const;
  // A path that names the file `name` of the very checkpoint this source reads (for stat
  // or open: "/proc/self/fd/<directory>/<name>", not in messages); empty for other inputs.
  virtual std::filesystem::path PinnedFile(const std::string& name) const { (void)name; return {}; }
  // Throws kChanged where the checkpoint this source reads is no longer at path() (replaced
  // or removed since it was opened): for a caller whose problems found may be only its
  // files removed meanwhile. Nothing for other inputs.
  virtual void ThrowIfReplaced() const {}
  const std::filesystem::path& path() const { return path_; }
  const Metadata& metadata() const { return metadata_; }
  // Tensors left out by skip_unsupported: (name, dtype as the source spells it).
  const std::vector<std::pair<std::string, std::string>>& skipped() const { return skipped_; }

  // Reads `region` (global coordinates) of tensor `key` into `out`, row-major over
  // region.sizes. Chunks of a checkpoint read whole have their checksum verified.
  // Throws kNotFound for a key not here, kCorrupt naming file and key on bad data, and
  // kInvalidArgument if the region is not wholly held (a lone shard's partial tensor).
  virtual void ReadRegion(std::string_view key, const Box& region, void* out) = 0;
  // The blob of a bytes entry.
  virtual std::vector<uint8_t> ReadBytes(std::string_view key) = 0;
  // Where chunk `chunk` of tensor `key` lies as raw bytes (row-major over its box, as in
  // memory), for copying it file to file; nullopt where its stored bytes differ
  // (compressed). Checks the chunk's dataset like a read would; reads no data.
  virtual std::optional<FileRange> Locate(std::string_view key, std::size_t chunk) = 0;
  // Checks the chunk against the checksum its metadata records (kCorrupt naming file and
  // key), in bounded memory; nothing to check where none is recorded (safetensors, a
  // lone shard's index).
  virtual void VerifyChunk(std::string_view key, std::size_t chunk) = 0;
  // Total payload bytes read so far.
  virtual uint64_t bytes_read() const = 0;

  // Whether the chunks of tensor `key` cover its whole shape (false only for a lone
  // shard holding part of a tensor).
  bool HoldsWhole(std::string_view key) const;

 protected:
  std::filesystem::path path_;
  Metadata metadata_;
  std::vector<std::pair<std::string, std::string>> skipped_;
};

}  // namespace ckpt::ops
