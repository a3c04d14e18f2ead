// ckpt/checkpoint.h: save and load checkpoints; read and write them piece by piece.
//
// A checkpoint is a directory with one HDF5 shard per writing rank and metadata.json,
// which appears last and atomically (schemas/FORMAT.md §2). A directory without
// metadata.json is not a checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/comm.h"
#include "ckpt/error.h"
#include "ckpt/metadata.h"
#include "ckpt/tensor.h"

namespace ckpt {

inline constexpr const char* kMetadataFileName = "metadata.json";

struct SaveOptions {
  StateDictType state_dict_type = StateDictType::kSharded;
  // Replace a committed checkpoint at the target. The swap is atomic: readers see the
  // old checkpoint or the new one, never neither.
  bool overwrite = false;
  // Ranks that hold the same region of a tensor hash their copies; copies that differ
  // are an error naming the key and ranks (a data-parallel desync).
  bool check_replicas = true;
  Compression compression;
  std::string user_metadata = "{}";  // JSON object
  std::string mesh = "null";         // JSON: device mesh and placements
};

// COLLECTIVE. Saves `state` (this rank's part of it) to `dir`. Every rank passes the same
// dir and options. Tensor regions claimed by several ranks must be identical boxes
// (replicas, written once); partially overlapping claims, or ranks that disagree on a
// key's kind, dtype or global shape, are an error before anything is written. If any
// rank fails, no rank commits, every rank throws, and whatever was at `dir` is untouched.
// Only what was at `dir` when the save began is replaced: if another writer commits there
// meanwhile, this save fails with kAlreadyExists (of two saves to one new path, one wins).
CKPT_API void Save(const std::filesystem::path& dir, const StateDict& state, Comm& comm,
          const SaveOptions& options = {});

struct LoadOptions {
  // How the caller holds its state. FULL and SHARDED checkpoints load into either;
  // LOCAL loads only into LOCAL with the identical layout, and the reverse.
  StateDictType state_dict_type = StateDictType::kSharded;
  // Missing keys (in target, not in checkpoint), unexpected keys (in checkpoint, not in
  // target) and mismatches (kind, dtype, shape) are an error; if false, they are
  // reported in LoadReport and the rest loads.
  bool strict = true;
  // Verify every byte read (FORMAT.md §7): a v2 chunk read in part by the digests of the
  // blocks it touches, in full also by its checksum; a v1 chunk by its checksum, read whole
  // when only part of it is wanted. Off only when asked: nothing read is then checked.
  bool verify_checksums = true;
  // Threads per rank reading chunks in parallel (more requests in flight for the disk,
  // hashing on every core). 1 reads serially.
  int io_threads = 4;
};

struct LoadReport {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
  std::vector<std::string> mismatched;  // "key: dtype float32 in checkpoint, float16 in target"
  uint64_t bytes_read = 0;
  bool ok() const { return missing_keys.empty() && unexpected_keys.empty() && mismatched.empty(); }
};

// COLLECTIVE. Fills `target` from the checkpoint at `dir`: for each tensor, every chunk
// of the target gets exactly its region of the global tensor, whatever layout and world
// size saved it. Scalars, bytes and JSON entries in `target` are overwritten.
CKPT_API LoadReport Load(const std::filesystem::path& dir, StateDict& target, Comm& comm,
                const LoadOptions& options = {});

// Reads the metadata of a checkpoint directory (parsed and validated, its digest checked).
// With `resolve` (the default), a v2 checkpoint's chunk records are read from every shard
// index (each checked against metadata.json) so that every EntryMeta::chunks is filled;
// without, only metadata.json is read (keys, dtypes, shapes, layouts, aggregate stats).
CKPT_API Metadata ReadMetadata(const std::filesystem::path& dir, bool resolve = true);

// A byte range of a file: where a stored chunk's bytes lie (CheckpointReader::LocateChunk),
// or bytes a chunk being written copies (CheckpointWriter::ChunkStream::Copy).
struct FileRange {
  std::filesystem::path file;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Random access to a committed checkpoint, for tools and loaders. Not collective.
// Thread-safety: one reader per thread.
class CKPT_API CheckpointReader {
 public:
  // With `resolve` false, a v2 checkpoint's shard indexes are read as chunks are first
  // wanted (each once, checked against its digest) instead of all when opening.
  static std::unique_ptr<CheckpointReader> Open(const std::filesystem::path& dir, bool resolve = true);
  virtual ~CheckpointReader() = default;

  virtual const Metadata& metadata() const = 0;
  virtual const std::filesystem::path& dir() const = 0;

  // Reads `region` (global coordinates) of tensor `key` into `out`, row-major over
  // region.sizes. Chunks read in full have their checksum verified when `verify`.
  virtual void ReadRegion(std::string_view key, const Box& region, void* out,
                          bool verify = true) = 0;
  // Reads one stored chunk whole into `out` and verifies its checksum when `verify`.
  virtual void ReadChunk(std::string_view key, std::size_t chunk_index, void* out,
                         bool verify = true) = 0;
  virtual std::vector<uint8_t> ReadBytes(std::string_view key, bool verify = true) = 0;
  // Where chunk `chunk_index` of tensor or bytes entry `key` lies in its shard file: its
  // bytes, row-major over its box, exactly as in memory. The dataset is checked against
  // the metadata first (dtype, shape, inside the file), as a read would. nullopt when the
  // chunk is compressed or empty (its stored bytes are not the tensor's). Reads no data.
  virtual std::optional<FileRange> LocateChunk(std::string_view key, std::size_t chunk_index) = 0;
  // Checks chunk `chunk_index` of `key` against its checksum without returning its data:
  // an uncompressed chunk is hashed straight from the page cache, in bounded memory (a
  // compressed one is decompressed whole). Throws kCorrupt naming file and key.
  virtual void VerifyChunk(std::string_view key, std::size_t chunk_index) = 0;
  // Total bytes read from shard files so far.
  virtual uint64_t bytes_read() const = 0;
};

// Writes a checkpoint from one process, tensor by tensor: what the tools (merge,
// convert, reshard) and a FULL export use. Memory grows with keys, not chunks: one chunk's
// data at a time; per key its layout so far (4 B a chunk while its chunks form a grid: a
// file position per cell; a key that is no grid keeps its boxes) and running statistics;
// per shard at most 1 MiB of its index, the rest spilled to an unnamed temporary file
// beside it until Commit; and what HDF5 keeps per dataset (its metadata cache is fixed at
// 1 MiB a shard). Measured: 65-85 B a chunk in all, against the 375 B index record each
// chunk adds (tests/unit/writer_memory_test.cc). Commit reads each shard's index back
// once to store it, and returns the Metadata as written: format v2, unresolved (each
// entry's layout and aggregates; the chunk records are in the shard indexes).
// Nothing is visible at `dir` until Commit(); destroying an uncommitted writer removes
// its temporary directory.
class CKPT_API CheckpointWriter {
 public:
  struct Options {
    StateDictType state_dict_type = StateDictType::kFull;
    int world_size = 1;   // recorded; files are named shard-<i>-of-<num_files>
    int num_files = 1;
    bool overwrite = false;
    Compression compression;
    std::string user_metadata = "{}";
    std::string mesh = "null";
  };
  static std::unique_ptr<CheckpointWriter> Create(const std::filesystem::path& dir,
                                                  const Options& options);
  virtual ~CheckpointWriter() = default;

  // Writes one chunk of tensor `key` into file `file_index`. The first chunk of a key
  // fixes its dtype and shape; later chunks must agree.
  virtual void WriteChunk(std::string_view key, DType dtype, const Shape& shape, const Box& box,
                          const void* data, int file_index = 0) = 0;
  // A chunk whose bytes arrive in pieces, in row-major order of its box: from memory, or
  // copied file to file (no user-space copy where the file system allows), so a chunk of
  // any size is written in bounded memory. Streamed chunks are stored uncompressed.
  class ChunkStream {
   public:
    virtual ~ChunkStream() = default;
    virtual void Write(const void* data, std::size_t n) = 0;
    // Appends the bytes of `range`. With `expected` (the stored chunk being carried over, as
    // its reader describes it: checksum, and for v2 its block digests) the range must be that
    // whole chunk: its bytes are checked as they go, and a mismatch throws kCorrupt naming
    // the file and block.
    virtual void Copy(const FileRange& range, const ChunkMeta* expected = nullptr) = 0;
    // Records the chunk; throws kInvalidArgument unless exactly all its bytes were given.
    // A stream destroyed without Close() leaves a gap that Commit() refuses.
    virtual void Close() = 0;
  };
  // The writer must outlive the stream. `stats`, when the caller knows them (e.g. combined
  // from the verified chunks it copies), are recorded instead of being recomputed.
  virtual std::unique_ptr<ChunkStream> OpenChunk(std::string_view key, DType dtype, const Shape& shape,
                                                 const Box& box, int file_index = 0,
                                                 const std::optional<ChunkStats>& stats = std::nullopt) = 0;
  virtual void WriteScalar(std::string_view key, const Scalar& value) = 0;
  virtual void WriteBytes(std::string_view key, std::span<const uint8_t> data,
                          int file_index = 0) = 0;
  virtual void WriteJson(std::string_view key, std::string_view json_text) = 0;
  // Checks that every tensor's chunks tile it exactly, writes metadata.json, fsyncs and
  // renames the directory into place. Throws (and leaves `dir` untouched) on failure.
  virtual Metadata Commit() = 0;
};

}  // namespace ckpt
