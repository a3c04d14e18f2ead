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

// "F32" <-> DType::kFloat32, "F8_E4M3" <-> kFloat8E4M3FN, "BOOL" <-> kBool ...
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
  std::filesystem::path path_, tmp_path_;
  int fd_ = -1;
  bool overwrite_ = false;
  uint64_t data_total_ = 0, written_ = 0, file_pos_ = 0;
  uint64_t unflushed_ = 0;  // bytes since writeback was last started
  int source_fd_ = -1;      // the file AppendCopy last copied from, kept open
  std::filesystem::path source_path_;
  void Wrote(uint64_t bytes);
};

}  // namespace ckpt::ops
