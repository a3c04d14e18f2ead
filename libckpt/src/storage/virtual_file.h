// storage/virtual_file.h: an HDF5 file of virtual datasets, one per tensor, each mapping
// the tensor's chunks onto their datasets in the checkpoint's shards (ckpt-merge
// --virtual): the shards are read in place, nothing is copied.
//
// Threading: one VirtualFileWriter per thread.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/metadata.h"

namespace ckpt::storage {

class VirtualFileWriter {
 public:
  // Creates (truncates) `path`. `label` names the output in errors.
  VirtualFileWriter(const std::filesystem::path& path, std::string label);
  ~VirtualFileWriter();
  VirtualFileWriter(const VirtualFileWriter&) = delete;
  VirtualFileWriter& operator=(const VirtualFileWriter&) = delete;

  // A dataset named after `key` (escaped as in a shard) of `dtype` and `shape`, whose
  // chunks are read from `source_dir / chunk.file` (a path relative to this file's
  // directory keeps the two movable together), dataset `chunk.dataset`.
  void AddTensor(const std::string& key, DType dtype, const Shape& shape, const std::vector<ChunkMeta>& chunks,
                 const std::filesystem::path& source_dir);
  // A 0-D tensor: HDF5 has no virtual scalar datasets, so its one element is stored.
  void AddScalar(const std::string& key, DType dtype, const void* element);
  // Closes the file; kIO if that fails.
  void Close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::storage
