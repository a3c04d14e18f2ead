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
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/dtype.h"
#include "ckpt/files.h"
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

// ckpt's block digests in a safetensors file's "__metadata__" (strings only, as the format
// requires; docs in schemas/FORMAT.md §11), written by ckpt-convert's export and checked by
// every ckpt reader when present (other readers ignore them):
//   "ckpt.block_bytes": B, the block size (a power of two, 4 KiB .. 64 MiB; 65536 written);
//   "ckpt.blocks.<tensor>": the tensor's bytes hashed in blocks of B as FORMAT.md §7.1's
//       "blocks" (16 lowercase hex digits of XXH3-64 per block; "" for an empty tensor);
//   "ckpt.digest": "xxh3-64:<16 hex>" of the header with this one key removed, as
//       nlohmann::json dumps it (compact, keys sorted): the names, dtypes, shapes, offsets
//       and every other metadata value are proved, and the blocks prove the bytes.
inline constexpr std::string_view kSafetensorsDigestKey = "ckpt.digest";
inline constexpr std::string_view kSafetensorsBlockBytesKey = "ckpt.block_bytes";
inline constexpr std::string_view kSafetensorsBlocksPrefix = "ckpt.blocks.";
// One of the keys above (which describe the file they are in, not the model).
CKPT_API bool IsSafetensorsDigestKey(std::string_view key);

// Hard limits against hostile files.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = uint64_t{100} << 20;  // as upstream
inline constexpr int kSafetensorsMaxRank = 32;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data buffer
  uint64_t end = 0;
  std::string blocks;  // ckpt's block digests (FORMAT.md §7.1 "blocks"), when the file has them
};

class CKPT_API SafetensorsReader {
 public:
  // Opens and validates `path`. Throws kNotFound / kIO if it cannot be read, kCorrupt for
  // a malformed header (length past the end of the file, invalid JSON, duplicate keys,
  // shape x itemsize != byte length, overlapping, non-contiguous or out-of-range offsets)
  // and kUnsupported for an unknown dtype. ckpt's digest keys, when present, are checked:
  // "ckpt.digest" against the header, every tensor's "ckpt.blocks.<name>" present and of
  // its byte length's block count (kCorrupt naming the file and tensor); the data is
  // checked by the caller against them. With `skip_unsupported`, a tensor of a dtype
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
  // The open file (owned by the reader): every read of it goes through this descriptor.
  int fd() const { return file_.fd(); }
  // File offset of the data buffer (tensor bytes start at data_start() + begin).
  uint64_t data_start() const { return data_start_; }
  // ckpt's digest block size ("ckpt.block_bytes"); 0 when the file carries no digests.
  uint64_t block_bytes() const { return block_bytes_; }

  // Reads `length` bytes at `offset` inside tensor `t`'s bytes. REQUIRES: in range.
  void ReadRange(const SafetensorsTensor& t, uint64_t offset, uint64_t length, void* out) const;
  // Reads the region `box` (coordinates in t.shape) into `out`, row-major over box.sizes.
  void ReadRegion(const SafetensorsTensor& t, const Box& box, void* out) const;
  // Hands tensor `t`'s bytes to `consume(data, length)` piece by piece, in order, in bounded
  // memory (large tensors straight from the page cache). kCorrupt naming the file and the
  // tensor where the file ends early (it shrank since it was opened).
  void ScanTensor(const SafetensorsTensor& t,
                  const std::function<void(const unsigned char*, std::size_t)>& consume) const;

 private:
  SafetensorsReader() = default;
  std::filesystem::path path_;
  files::File file_;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;
  uint64_t block_bytes_ = 0;
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
  // Throws kAlreadyExists if `path` exists and !overwrite. With `digests`, the header also
  // carries ckpt's block digests (kSafetensorsDigestKey ...; any such keys in `metadata`
  // are replaced), hashed as the bytes are appended and written into the header, whose
  // length they do not change, before the file is synced.
  SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorSpec> tensors,
                    const std::vector<std::pair<std::string, std::string>>& metadata,
                    bool overwrite = false, bool digests = false);
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
                                      const std::vector<std::pair<std::string, std::string>>& weight_map,
                                      std::optional<uint64_t> total_parameters);
  // Commit() short of the rename: checks every byte was written, fsyncs, closes and parses
  // the header back; the staged file is left for the caller to commit (staged_).
  void Seal();
  std::filesystem::path path_;
  std::optional<files::StagedOutput> staged_;  // discarded unless committed
  files::File out_;                            // staged_'s file, open until sealed
  bool overwrite_ = false;
  uint64_t data_total_ = 0, written_ = 0, file_pos_ = 0;
  uint64_t unflushed_ = 0;  // bytes since writeback was last started
  files::File source_;      // the file AppendCopy last copied from, kept open
  struct Digests;  // the header and the block digests so far (with `digests`)
  std::unique_ptr<Digests> digests_;
  void Wrote(uint64_t bytes);
  void Hash(const void* data, uint64_t bytes);
  void WriteDigests();
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
// What a Hub model directory `dir` holds, as transformers' save_pretrained writes it: its
// index (FindSafetensorsIndex) when it has one, else its lone `model.safetensors` (the
// unsharded layout, written for a model under max_shard_size); nullopt if neither, or if
// `dir` is not a directory. Reads nothing.
CKPT_API std::optional<std::filesystem::path> FindHubModel(const std::filesystem::path& dir);
// Reads and checks an index: JSON without duplicate keys, a "weight_map" object of
// non-empty tensor names to plain file names (no directory part), total_size (if present)
// a non-negative integer. kCorrupt naming the file and the entry.
CKPT_API SafetensorsIndex ReadSafetensorsIndex(const std::filesystem::path& index_file);
// Writes an index atomically (staged, fsynced, renamed), as transformers does: keys sorted,
// indent 2, {"metadata": {"total_size": total_size}, "weight_map": ...}, with
// "total_parameters" beside total_size when given (transformers 5 writes the model's
// parameter count there; ckpt writes the element count of the tensors the shards hold).
CKPT_API void WriteSafetensorsIndex(const std::filesystem::path& index_file, uint64_t total_size,
                                    const std::vector<std::pair<std::string, std::string>>& weight_map,
                                    std::optional<uint64_t> total_parameters = std::nullopt);
// Commits the Hub's sharded layout all or nothing: `shards` (each appended in full, not
// committed) and then their index `index_file` (WriteSafetensorsIndex's JSON) in one group
// commit (storage/commit.h; the index renamed last). If anything fails, every shard name and
// the index are as they were (absent, or an earlier save's when the writers overwrite) and
// the staged files are removed with the writers. Replaces existing files only if every
// writer was made with overwrite.
CKPT_API void CommitSafetensorsShards(const std::vector<SafetensorsWriter*>& shards,
                                      const std::filesystem::path& index_file, uint64_t total_size,
                                      const std::vector<std::pair<std::string, std::string>>& weight_map,
                                      std::optional<uint64_t> total_parameters = std::nullopt);

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
