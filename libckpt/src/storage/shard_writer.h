// storage/shard_writer.h: writes one shard file (FORMAT.md §5).
//
// Uncompressed chunks are contiguous datasets whose space HDF5 allocates at creation
// (no fill); their bytes are then streamed with pwrite straight from the caller's memory
// at the dataset's file offset, a cache-sized piece at a time, each piece digested
// (checksum and statistics) right after its write, from the cache: one pass over memory, no
// copy, no HDF5 lock held. A large chunk is shared out in segments over the worker pool
// (storage/pool.h), so hashing and statistics run on every core.
// Compressed chunks go through HDF5's filter pipeline (shuffle, then zstd id 32015).
//
// Threading: one ShardWriter per thread; different writers may run concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/metadata.h"
#include "storage/digest.h"

namespace ckpt::storage {

class ShardWriter {
 public:
  // Creates (truncates) `dir/file_name`. Chunks are hashed in blocks of `block_bytes`
  // (FORMAT.md §7; a power of two in [kMinBlockBytes, kMaxBlockBytes]). Uncompressed
  // chunks of at most `pack_threshold` bytes (0: none) given to WriteChunk are packed
  // (FORMAT.md §5.7): no dataset each, their bytes back to back in a shared pack dataset
  // (an unreserved one's bytes are copied and wait, at most 1 MiB of them, until its pack
  // is full or Finish; the ChunkMeta returned for it then has no `offset`).
  ShardWriter(const std::filesystem::path& dir, std::string file_name, Compression compression,
              uint64_t block_bytes = kDefaultBlockBytes, uint64_t pack_threshold = 0);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Announces a chunk that WriteChunk will write, so that its dataset is made ahead, in a
  // batch with the next ones: one hold of the process's HDF5 batch lock per batch instead
  // of a handover of HDF5's global lock per call, when several writers share the process.
  // With `data` (the bytes WriteChunk will be given, unchanged until then), a small chunk's
  // bytes are written with its dataset, and WriteChunk only digests them. Reserved chunks
  // MUST then be written by WriteChunk, all of them, as reserved and in the order reserved
  // (kInternal otherwise); WriteBytes and Begin are not affected. A no-op for a
  // compressing shard.
  void Reserve(const std::string& key, DType dtype, const Shape& shape, const Box& box,
               const void* data = nullptr);
  // Writes one chunk of tensor `key` (global shape `shape`); `data` holds box.NumElements()
  // row-major elements. Returns the chunk's metadata with file, dataset, checksum, stats.
  ChunkMeta WriteChunk(const std::string& key, DType dtype, const Shape& shape, const Box& box,
                       const void* data);
  // A chunk written in pieces, in row-major order of its box, stored contiguous and
  // uncompressed whatever the shard's compression: bytes from memory (Write) or copied
  // from another file (Copy). Memory stays bounded whatever the chunk's size. The
  // ShardWriter must outlive it; Finish() records the chunk.
  class Stream {
   public:
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    void Write(const void* data, std::size_t n);
    // Appends `n` bytes at `offset` of the open file `fd` (named `path`), copied file to
    // file. With `expected`, those bytes alone are that stored chunk being carried over
    // (`what` names it) and must match its checksum and block digests, else kCorrupt.
    void Copy(int fd, uint64_t offset, std::size_t n, const std::filesystem::path& path,
              const ChunkMeta* expected, std::string_view what);
    // All bytes given: returns the chunk's metadata (checksum and statistics of its bytes).
    ChunkMeta Finish();

   private:
    friend class ShardWriter;
    struct State;
    explicit Stream(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
  };
  // `stats`, when given, are recorded instead of computed.
  std::unique_ptr<Stream> Begin(const std::string& key, DType dtype, const Shape& shape, const Box& box,
                                const std::optional<ChunkStats>& stats = std::nullopt);

  // Writes a bytes entry as a 1-D uint8 dataset.
  ChunkMeta WriteBytes(const std::string& key, const void* data, std::size_t n);
  // Writes the shard index, closes and fsyncs the file.
  struct Written {
    uint64_t bytes = 0;  // the file's size
    std::string index;   // IndexDigest of the index text written (metadata.json files[i].index)
    // Where HDF5 placed that text in the file (files[i].index_offset / index_bytes, FORMAT.md
    // §3.1): found after the close in the file's tail; index_bytes 0 when it was not found
    // there whole (then not recorded: readers go through the attribute).
    uint64_t index_offset = 0;
    uint64_t index_bytes = 0;
    double fsync_seconds = 0;  // the file's fsync (the save's recorded timings, FORMAT.md §3.8)
  };
  Written Finish();
  // The file is a staging copy (an s3:// save's, uploaded and removed after Finish): no
  // writeback is started while it is written, and Finish does not fsync it (it reports 0 s).
  // The disk is then left alone; the upload reads the bytes back from the page cache.
  void SetTransient();
  // `observer(offset, n)` is called, from whichever thread wrote them (the caller's, the
  // worker pool's or the copier's, possibly at once), for each range of bytes this writer
  // wrote itself into a dataset's space: those bytes are final, never written again, and
  // already in the file (the page cache). Other bytes (HDF5's metadata, the superblock,
  // small datasets HDF5 writes, compressed chunks) are final only after Finish. An s3://
  // save uploads the parts made only of final bytes while the rest is written. Set it
  // before the first chunk.
  using FinalBytes = std::function<void(uint64_t offset, uint64_t n)>;
  void OnFinalBytes(FinalBytes observer);

  const std::string& file_name() const { return file_name_; }

  // Where the last copy of `text` lies in the last bytes of the file at `path`, `size`
  // bytes long (Finish: the index attribute's text); nullopt when it is not there.
  static std::optional<uint64_t> FindTail(const std::filesystem::path& path, uint64_t size, const std::string& text);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string file_name_;
};

}  // namespace ckpt::storage
