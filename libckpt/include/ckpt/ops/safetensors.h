// ckpt/ops/safetensors.h: a reader and a writer for Hugging Face .safetensors files.
//
// The format: 8 bytes little-endian header length N, N bytes of a JSON object
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the byte buffer; offsets are relative to the start of the buffer. The reader
// treats every file as hostile: each rule broken is one clear kCorrupt / kUnsupported
// error naming the file and the tensor.
//
// Thread-safety: a SafetensorsReader is immutable after Open; ReadRange is pread and
// may be called from several threads. A SafetensorsWriter is used by one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/dtype.h"
#include "ckpt/tensor.h"

namespace ckpt::ops {

// "F32" <-> DType::kFloat32, "F8_E4M3" <-> kFloat8E4M3FN, "BOOL" <-> kBool, "U16" <-> kUInt16,
// "F8_E8M0" <-> kFloat8E8M0FNU, "F4" <-> kFloat4E2M1FNx2 ...
//
// F4 shapes: safetensors counts 4-bit values, ckpt (as torch's float4_e2m1fn_x2) counts
// bytes of two values, so a header's F4 [..., 2k] is ckpt's [..., k]. An F4 tensor of
// rank 0 or an odd last dimension (valid in safetensors if its value count is even) has no
// float4_e2m1fn_x2 shape: the reader refuses it (kUnsupported, or skips it), and the writer
// refuses a rank-0 float4_e2m1fn_x2 (kInvalidArgument). SafetensorsTensor::shape and
// TensorSpec::shape are ckpt's.
CKPT_API std::optional<DType> DTypeFromSafetensors(std::string_view name);
CKPT_API std::string_view SafetensorsDTypeName(DType dtype);

// Hard limits against hostile files.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;  // as upstream
inline constexpr int kSafetensorsMaxRank = 32;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data buffer
  uint64_t end = 0;
};

class CKPT_API SafetensorsReader {
 public:
  // Opens and validates `path`. Throws kNotFound / kIO if it cannot be read, kCorrupt for
  // a malformed header (length past the end of the file, invalid JSON, duplicate keys,
  // shape x itemsize != byte length, overlapping, non-contiguous or out-of-range offsets)
  // and kUnsupported for an unknown dtype. With `skip_unsupported`, a tensor of a dtype
  // ckpt lacks is left out of tensors() (listed in skipped()) instead; its offsets are
  // still checked.
  static std::unique_ptr<SafetensorsReader> Open(const std::filesystem::path& path,
                                                 bool skip_unsupported = false);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // In the order of their data offsets.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // O(log n): by name, nullptr if none.
  const SafetensorsTensor* Find(std::string_view name) const;
  // Tensors left out by skip_unsupported: (name, dtype as the file spells it).
  const std::vector<std::pair<std::string, std::string>>& skipped() const { return skipped_; }
  // The "__metadata__" object, as (key, value) pairs in file order.
  const std::vector<std::pair<std::string, std::string>>& metadata() const { return metadata_; }
  uint64_t file_size() const { return file_size_; }
  // File offset of the data buffer (tensor bytes start at data_start() + begin).
  uint64_t data_start() const { return data_start_; }

  // Reads `length` bytes at `offset` inside tensor `t`'s bytes. REQUIRES: in range.
  void ReadRange(const SafetensorsTensor& t, uint64_t offset, uint64_t length, void* out) const;
  // Reads the region `box` (coordinates in t.shape) into `out`, row-major over box.sizes.
  void ReadRegion(const SafetensorsTensor& t, const Box& box, void* out) const;

 private:
  SafetensorsReader() = default;
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::vector<std::size_t> by_name_;  // indices of tensors_, in name order
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::vector<std::pair<std::string, std::string>> skipped_;
};

// Writes a safetensors file in one pass: the header is fixed up front (every tensor's
// name, dtype and shape, in the order the data will be appended), then the bytes are
// appended in that order, in as many pieces as the caller likes. Nothing appears at
// `path` until Commit(), which checks every byte was written, fsyncs, parses the header back and renames.
class CKPT_API SafetensorsWriter {
 public:
  struct TensorSpec {
    std::string name;
    DType dtype;
    Shape shape;
  };
  // Throws kAlreadyExists if `path` exists and !overwrite.
  SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorSpec> tensors,
                    const std::vector<std::pair<std::string, std::string>>& metadata,
                    bool overwrite = false);
  ~SafetensorsWriter();  // removes the temporary file if not committed
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Appends bytes of the current tensor (moving to the next when one is complete).
  void Append(const void* data, uint64_t bytes);
  // Appends the bytes of a file range, copied file to file inside the kernel.
  void AppendCopy(const FileRange& range);
  void Commit();

 private:
  friend void CommitSafetensorsShards(const std::vector<SafetensorsWriter*>& shards,
                                      const std::filesystem::path& index_file, uint64_t total_size,
                                      const std::vector<std::pair<std::string, std::string>>& weight_map);
  // Commit() short of the rename: checks every byte was written, fsyncs, closes and parses
  // the header back; the staging file is left for the caller to commit (tmp_path_).
  void Seal();
  std::filesystem::path path_, tmp_path_;
  int fd_ = -1;
  bool overwrite_ = false;
  uint64_t data_total_ = 0, written_ = 0, file_pos_ = 0;
  uint64_t unflushed_ = 0;  // bytes since writeback was last started
  int source_fd_ = -1;      // the file AppendCopy last copied from, kept open
  std::filesystem::path source_path_;
  void Wrote(uint64_t bytes);
};

// The Hugging Face Hub's sharded layout (what transformers' save_pretrained writes past
// max_shard_size): `<stem>.safetensors.index.json`, {"metadata": {"total_size": <tensor
// bytes>}, "weight_map": {tensor: file}}, beside the files it names,
// `<stem>-00001-of-00003.safetensors` ... (stem "model" for model.safetensors).
inline constexpr std::string_view kSafetensorsIndexSuffix = ".safetensors.index.json";

struct SafetensorsIndex {
  std::filesystem::path path;  // the index file
  std::optional<uint64_t> total_size;
  // (tensor, file) in the order of the index; files are plain names in the index's directory.
  std::vector<std::pair<std::string, std::string>> weight_map;
  std::vector<std::string> files;  // each file once, in order of first mention
};

// `path` itself if it names an index file (a name ending in kSafetensorsIndexSuffix); for a
// directory, its model.safetensors.index.json, else its only *.safetensors.index.json; else
// nullopt. Reads nothing.
CKPT_API std::optional<std::filesystem::path> FindSafetensorsIndex(const std::filesystem::path& path);
// Reads and checks an index: JSON without duplicate keys, a "weight_map" object of
// non-empty tensor names to plain file names (no directory part), total_size (if present)
// a non-negative integer. kCorrupt naming the file and the entry.
CKPT_API SafetensorsIndex ReadSafetensorsIndex(const std::filesystem::path& index_file);
// Writes an index atomically (staged, fsynced, renamed), as transformers does: keys sorted,
// indent 2, {"metadata": {"total_size": total_size}, "weight_map": ...}.
CKPT_API void WriteSafetensorsIndex(const std::filesystem::path& index_file, uint64_t total_size,
                                    const std::vector<std::pair<std::string, std::string>>& weight_map);
// Commits the Hub's sharded layout all or nothing: `shards` (each appended in full, not
// committed) and then their index `index_file` (WriteSafetensorsIndex's JSON) in one group
// commit (storage/commit.h; the index renamed last). If anything fails, every shard name and
// the index are as they were (absent, or an earlier save's when the writers overwrite) and
// the staged files are removed with the writers. Replaces existing files only if every
// writer was made with overwrite.
CKPT_API void CommitSafetensorsShards(const std::vector<SafetensorsWriter*>& shards,
                                      const std::filesystem::path& index_file, uint64_t total_size,
                                      const std::vector<std::pair<std::string, std::string>>& weight_map);

// Groups tensors of `bytes[i]` bytes, in order, into shards of at most `max_shard_bytes`
// as huggingface_hub's split_torch_state_dict_into_shards does (save_pretrained): a shard is
// closed when the next tensor would take it past the cap, and a tensor larger than the cap
// is a shard of its own, placed where it is met (before the shard being filled). Every
// group is non-empty; no tensors give no group. REQUIRES: max_shard_bytes > 0.
CKPT_API std::vector<std::vector<std::size_t>> PlanSafetensorsShards(const std::vector<uint64_t>& bytes,
                                                                     uint64_t max_shard_bytes);
// "model-00002-of-00005.safetensors" for stem "model", shard 1 (from 0) of 5.
CKPT_API std::string SafetensorsShardName(std::string_view stem, std::size_t shard, std::size_t shards);

}  // namespace ckpt::ops
