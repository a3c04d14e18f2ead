// storage/shard_reader.h: reads regions of chunks from one shard file (FORMAT.md §5).
//
// Every dataset is checked against what metadata says before a byte is read: its type,
// its shape, and (for contiguous datasets) that it lies inside the file; a v2 chunk whose
// (digest-checked) index record gives its data offset is read there, checked to lie inside
// the file. Contiguous, unfiltered datasets are then read with pread straight into the
// destination; others through HDF5 hyperslab selections (which run the zstd filter).
// Verified v2 reads fetch the blocks a region touches (FORMAT.md §7), hash each and
// compare it with the chunk's block digests before any byte is handed out.
//
// Threading: one ShardReader per thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "ckpt/metadata.h"
#include "storage/digest.h"
#include "storage/fs.h"
#include "storage/shard_index.h"

namespace ckpt::storage {

class ShardReader {
 public:
  // Opens `file_name` inside the open directory `dir` read-only (openat: the directory
  // the caller read metadata.json from, even if its path was renamed meanwhile); it must
  // be a regular file and readable HDF5. Errors name dir.path() / file_name.
  // With `use_index`, contiguous chunks are located through the shard index (FORMAT.md
  // §5: dtype, extent and data offset of every dataset, read once per file) instead of
  // opening each dataset through HDF5; a chunk the index does not describe exactly, or
  // whose data would lie outside the file, takes the HDF5 path. ckpt-verify turns it off
  // to check every dataset's HDF5 header, and so does a lone shard (no checksums: the
  // HDF5 checks are all there is); Index() still reads the index then, to describe it.
  // With `evict_on_close`, the file's HDF5 metadata cache is held at a small fixed size,
  // so the headers of datasets closed make room for the next (for a caller that opens each
  // dataset once: ckpt-verify), at a constant cost per dataset (HDF5 1.10's own
  // evict-on-close costs a pass over the whole cache at each close).
  ShardReader(const Dir& dir, const std::string& file_name, bool use_index = true, bool evict_on_close = false);
  // The same, opening the directory `dir` first.
  ShardReader(const std::filesystem::path& dir, const std::string& file_name, bool use_index = true,
              bool evict_on_close = false)
      : ShardReader(Dir::Open(dir), file_name, use_index, evict_on_close) {}
  // Reads the shard open as `fd` (any regular file: the shard fuzzer's is a memfd), named
  // `path` in errors. With `in_memory`, HDF5 reads it whole at open through its core
  // driver (H5Pset_fapl_core, no backing store), every later HDF5 read a copy in memory:
  // for small files read many times over.
  ShardReader(Fd fd, std::filesystem::path path, bool use_index, bool in_memory);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  // Reads `region` (global coordinates, inside chunk.box) of the chunk into `dst`, a
  // row-major buffer over `dst_box` (which contains `region`). With `verify`, every byte
  // handed out is checked before the call returns: for a v2 chunk (block_bytes > 0) by the
  // digests of the blocks the region touches (FORMAT.md §7: at most one extra block at each
  // end of a contiguous run is read), plus the chunk checksum over the block list when the
  // whole chunk is read; for a v1 chunk by its checksum, reading it whole when only part is
  // wanted. A mismatch is kCorrupt naming the file, key, chunk box and block.
  // A v2 chunk with `offset` (from a shard index whose digest the caller checked) is read
  // at that offset without opening its dataset. Returns the bytes read from the file.
  uint64_t Read(const std::string& key, DType dtype, const ChunkMeta& chunk, const Box& region,
                void* dst, const Box& dst_box, bool verify);

  // The chunks given to Read and Locate come from a v2 shard index whose digest the caller
  // checked (FORMAT.md §7.5), as a checkpoint reader's do: an empty chunk (no bytes, so no
  // offset) is then read as nothing without opening its dataset through HDF5.
  void TrustRecords();

  // Reads the interiors of large contiguous runs of v2 chunks with O_DIRECT under `policy`
  // (DirectReader: no page cache), where the file system allows; nullopt, the default: all
  // reads buffered. Set before the first Read.
  void UseDirectIo(std::optional<DirectReader::Policy> policy);
  // Bytes read with O_DIRECT so far.
  uint64_t bytes_read_direct() const;

  // Checks the whole chunk against its checksum (and block digests) without returning its
  // data: uncompressed chunks hashed from the page cache in bounded memory, compressed
  // ones decompressed. Throws kCorrupt naming file, key and block. Returns bytes read.
  uint64_t Verify(const std::string& key, DType dtype, const ChunkMeta& chunk);

  // The file offset of the chunk's bytes (chunk.box row-major, uncompressed) when it is
  // stored contiguous and unfiltered, after the same checks as Read; nullopt when it is
  // filtered (its bytes are not the tensor's). For copying a chunk file to file.
  // `by_header`: from the dataset's own HDF5 header even where the chunk's record or the
  // shard index gives the offset (ckpt-verify compares the two).
  // `address`: where the chunk's dataset is, as ScanRoot gave it (by_header only): opened
  // there, without a lookup of its name.
  std::optional<uint64_t> Locate(const std::string& key, DType dtype, const ChunkMeta& chunk, bool by_header = false,
                                 const uint64_t* address = nullptr);

  // A pack dataset (FORMAT.md §5.7) as its HDF5 header gives it: the file offset of its
  // data and its byte size, after checking that it is a 1-D uint8 contiguous dataset of the
  // root group, named as a pack, lying inside the file (kCorrupt naming `where` otherwise).
  struct PackExtent {
    uint64_t base = 0;
    uint64_t bytes = 0;
  };
  PackExtent Pack(const std::string& dataset, const std::string& where);

  // The shard index (FORMAT.md §5.5), parsed strictly once per reader; kCorrupt (or
  // kUnsupported) naming the file when it is missing or malformed. A v1 index only speeds
  // up locating chunks; a v2 index is the chunks' description, trusted once IndexText()
  // hashes to what metadata.json records (the caller checks).
  const ShardIndex& Index();
  // The index attribute's text exactly as stored ("" when there is none), read without
  // parsing it (a caller checking its digest parses it once itself).
  const std::string& IndexText();

  // Each link of the root group that is not a dataset of the shard's own (a soft,
  // external or user-defined link: FORMAT.md §5.6), at most `limit`: its name and a
  // message naming the file and the link. For ckpt-verify: readers refuse such a link
  // when a chunk names it, and follow none.
  std::vector<std::pair<std::string, std::string>> ForeignLinks(std::size_t limit);

  uint64_t file_size() const;
  const std::filesystem::path& path() const;
  // The descriptor the shard is open on (owned by the reader): the very file, whatever
  // has been renamed or removed since.
  int fd() const;

  // Datasets (hard links) of the root group for which `named(name)` is false, at most
  // `limit`: for ckpt-verify, what no record names (FORMAT.md §5.6).
  std::vector<std::string> UnnamedObjects(const std::function<bool(const std::string&)>& named, std::size_t limit);

  // One pass over the root group's links, for a caller that opens every dataset
  // (ckpt-verify): hard(name, address) for each dataset (hard link), whose address Locate
  // then takes instead of looking the name up; returns the other links as ForeignLinks
  // does, at most `limit`.
  std::vector<std::pair<std::string, std::string>> ScanRoot(const std::function<void(const char*, uint64_t)>& hard,
                                                            std::size_t limit);

 private:
  ShardReader(Fd fd, std::filesystem::path path, bool use_index, bool evict_on_close, bool in_memory,
              const Dir* dir);
  struct Located;
  Located Find(const std::string& key, DType dtype, const ChunkMeta& chunk, bool by_header = false,
               const uint64_t* address = nullptr);
  Located FindPacked(const std::string& key, const ChunkMeta& chunk, uint64_t chunk_bytes);
  // Find's steps: located without an HDF5 header (the index record, an empty chunk, the
  // shard's own index), true if so; else the dataset opened and checked through HDF5.
  bool FindWithoutHeader(const std::string& key, DType dtype, const ChunkMeta& chunk, bool by_header, Located& at);
  void FindThroughHeader(const std::string& key, DType dtype, const ChunkMeta& chunk, bool by_header,
                         const uint64_t* address, Located& at);
  void ReadIndexText();
  void LoadIndex();
  // Unverified reads (or v1 ones fed to `digest`), contiguous or through HDF5.
  uint64_t ReadRaw(const Located& at, const std::string& key, DType dtype, const ChunkMeta& chunk,
                   const Box& region, void* dst, const Box& dst_box, Digest* digest);
  uint64_t ReadContiguous(const ChunkMeta& chunk, uint64_t base, uint64_t chunk_bytes,
                          std::size_t item, const Box& region, void* dst, const Box& dst_box, Digest* digest);
  // A v2 chunk's region, every block it touches read, hashed and compared first.
  uint64_t ReadBlocks(const Located& at, const std::string& key, DType dtype, const ChunkMeta& chunk,
                      const Box& region, void* dst, const Box& dst_box);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};


}  // namespace ckpt::storage
