// storage/shard_writer.h: writes one shard file (FORMAT.md §5).
//
// Uncompressed chunks are contiguous datasets whose space HDF5 allocates at creation
// (no fill); their bytes are then streamed with pwrite straight from the caller's memory
// at the dataset's file offset, in blocks, while the checksum and statistics are
// computed over each block as it goes out: one pass, no copy, no HDF5 lock held.
// Compressed chunks go through HDF5's filter pipeline (shuffle, then zstd id 32015).
//
// Threading: one ShardWriter per thread; different writers may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "ckpt/metadata.h"

namespace ckpt::storage {

class ShardWriter {
 public:
  // Creates (truncates) `dir/file_name`.
  ShardWriter(const std::filesystem::path& dir, std::string file_name, Compression compression);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Writes one chunk of tensor `key` (global shape `shape`); `data` holds box.NumElements()
  // row-major elements. Returns the chunk's metadata with file, dataset, checksum, stats.
  ChunkMeta WriteChunk(const std::string& key, DType dtype, const Shape& shape, const Box& box,
                       const void* data);
  // Writes a bytes entry as a 1-D uint8 dataset.
  ChunkMeta WriteBytes(const std::string& key, const void* data, std::size_t n);
  // Writes the shard index, closes and fsyncs the file. Returns its size in bytes.
  uint64_t Finish();

  const std::string& file_name() const { return file_name_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string file_name_;
};

}  // namespace ckpt::storage
