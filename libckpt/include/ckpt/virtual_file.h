// ckpt/virtual_file.h: an HDF5 file of virtual datasets, one per tensor, each mapping the
// tensor's chunks onto their datasets in a checkpoint's shards (what ckpt-merge --virtual
// writes), so that any HDF5 program reads the tensors whole while the shards are read in
// place. Packed chunks (FORMAT.md §5.7: slices of a uint8 pack, which no mapping can
// retype) are the exception: their bytes are copied into the virtual file (at most
// pack_bytes, 1 MiB, each).
//
// Threading: one VirtualFileWriter per thread.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/export.h"
#include "ckpt/metadata.h"

namespace ckpt {

class CKPT_API VirtualFileWriter {
 public:
  // Creates (truncates) `path` (stage it: files::StagedOutput). `label` names the output in
  // errors. kIO naming it.
  VirtualFileWriter(const std::filesystem::path& path, std::string label);
  ~VirtualFileWriter();
  VirtualFileWriter(const VirtualFileWriter&) = delete;
  VirtualFileWriter& operator=(const VirtualFileWriter&) = delete;

  // Reads packed chunk `chunk` of the tensor: its box's elements, in C order, into `out`
  // (the chunk's bytes).
  using ReadChunk = std::function<void(const ChunkMeta& chunk, void* out)>;

  // A dataset named after `key` (escaped as in a shard) of `dtype` and `shape`, whose
  // chunks are read from `source_dir / chunk.file` (a path relative to this file's
  // directory keeps the two movable together), dataset `chunk.dataset`. Packed chunks are
  // read with `read_packed` and stored in this file: a tensor all of whose chunks are
  // packed becomes an ordinary dataset; in one with some, each packed chunk is a dataset
  // ".ckpt_chunk.<n>" of this file (no escaped key begins with '.') that the mapping names.
  void AddTensor(const std::string& key, DType dtype, const Shape& shape, const std::vector<ChunkMeta>& chunks,
                 const std::filesystem::path& source_dir, const ReadChunk& read_packed);
  // A 0-D tensor: HDF5 has no virtual scalar datasets, so its one element is stored.
  void AddScalar(const std::string& key, DType dtype, const void* element);
  // Closes the file; kIO if that fails.
  void Close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt
