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

// Whether `path` names a checkpoint on object storage ("s3://bucket/prefix"), which the
// calls below taking ObjectStoreOptions read or write, rather than a local directory.
CKPT_API bool IsObjectUrl(const std::filesystem::path& path);

// Where and how a checkpoint on S3-compatible object storage (`s3://bucket/prefix/step-100`)
// is written. Empty or unset fields come from the AWS environment (AWS_ENDPOINT_URL_S3,
// AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN, AWS_PROFILE) and the profile files (~/.aws/credentials, ~/.aws/config);
// a field set here overrides them. No secret appears in an error or in metadata.json.
//
// The write path on s3:// (the interim one: staging, then upload): each rank writes its
// shard into a local staging directory of its own under `staging_dir` (at most its one
// shard, removed once uploaded, whatever happens), uploads it as a new object whose name is
// unique to this save (`shard-RRRRR-of-WWWWW.<nonce>.h5`, named so in metadata.json's files[])
// in `part_bytes` parts, `upload_concurrency` at a time (memory: their product per rank),
// each part with Content-MD5, and checks it by HEAD (size and ETag). Then rank 0 commits
// by one conditional PUT of metadata.json: If-None-Match: * for a new checkpoint, If-Match
// with the ETag seen when the save began for overwrite. A writer that loses the race gets
// kAlreadyExists ("another writer committed first") on every rank; its objects are deleted
// or, where that fails, left for CleanLeftovers.
struct ObjectStoreOptions {
  std::string endpoint;  // "http://127.0.0.1:7480", "https://s3.eu-west-1.amazonaws.com"
  std::string region;
  std::string profile;  // of ~/.aws/credentials and ~/.aws/config
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;
  std::string addressing = "auto";  // "auto", "path" or "virtual"
  // PEM file of the CA certificates an https endpoint is checked against; empty:
  // AWS_CA_BUNDLE, else the profile's `ca_bundle`, else libcurl's default.
  std::string ca_bundle;
  // Each rank's local staging; empty: $TMPDIR (else /tmp) / "ckpt-s3-staging".
  std::filesystem::path staging_dir;
  uint64_t part_bytes = uint64_t{16} << 20;  // 5 MiB..5 GiB; a shard up to it goes in one PUT
  int upload_concurrency = 8;
  // A store whose conditional PUT does not work (storage probe at the start of each save)
  // is refused, as two writers could then both "win"; true accepts it, the user promising
  // that one writer at a time saves under this prefix.
  bool single_writer = false;
  // Leftovers (shard objects no committed metadata.json names, unfinished multipart
  // uploads) younger than this are never removed (a save may still be uploading them).
  int64_t leftover_grace_seconds = 3600;
  // Attempts of an idempotent request (retries with backoff on 5xx, 503 SlowDown, timeouts).
  int max_attempts = 8;
  // Load of an s3:// checkpoint that cannot be read by ranged GETs (compressed chunks, v1,
  // or saved before files[].index_offset): each rank downloads metadata.json and every file
  // it names into a directory of its own under staging_dir, loads it there and removes it. A
  // checkpoint whose files hold more than this is refused before any byte is fetched.
  uint64_t cache_max_bytes = uint64_t{64} << 30;
};

struct SaveOptions {
  StateDictType state_dict_type = StateDictType::kSharded;
  // Replace a committed checkpoint at the target. The swap is atomic: readers see the
  // old checkpoint or the new one, never neither.
  bool overwrite = false;
  // Ranks that hold the same region of a tensor hash their copies; copies that differ
  // are an error naming the key and ranks (a data-parallel desync).
  bool check_replicas = true;
  Compression compression;
  // Uncompressed host chunks of at most this many bytes are packed (FORMAT.md §5.7): no
  // HDF5 dataset each, their bytes back to back in shared pack datasets of the shard, so
  // that many small tensors cost a few datasets, not one each (packs hold at most 1 MiB: a
  // larger value acts as 1 MiB). 0: every chunk its own.
  uint64_t pack_bytes = uint64_t{64} << 10;
  std::string user_metadata = "{}";  // JSON object
  std::string mesh = "null";         // JSON: device mesh and placements
  // For an s3:// target (ObjectStoreOptions above); ignored for a local directory.
  ObjectStoreOptions s3;
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

// ---- Asynchronous save ------------------------------------------------------------
//
// SaveAsync returns once a consistent snapshot of the state is copied into staging memory;
// planning, writing, fsync and the commit then run on a background thread (one per rank,
// over its own Dup of the Comm: comm.h), with Save's protocol and its guarantees: if any
// rank fails, no rank commits and whatever was at `dir` is untouched.

namespace internal {
struct AsyncJob;
struct StagingAccess;
}  // namespace internal

// Memory the snapshots are copied into, kept from one save to the next (pages already
// faulted in copy several times faster than fresh ones). A snapshot takes one buffer of its
// size (rounded up to a page); a free buffer that fits is reused, free ones too small for
// it are released. At most `capacity_bytes` are held at once: a snapshot that does not fit
// beside the buffers in use is an error (kInvalidArgument), never a wait.
// Thread-safe. Give each rank its own pool (or the default): ranks of one group sharing a
// pool can fail each other's saves for want of room.
class CKPT_API StagingPool {
 public:
  static constexpr uint64_t kUnbounded = ~uint64_t{0};
  explicit StagingPool(uint64_t capacity_bytes = kUnbounded);
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  uint64_t capacity_bytes() const;
  uint64_t reserved_bytes() const;  // held now: in use by saves in flight, or kept for reuse
  uint64_t in_use_bytes() const;
  void Trim();  // releases the buffers no save is using

  struct Impl;  // checkpoint/async.cc

 private:
  friend struct internal::StagingAccess;
  std::shared_ptr<Impl> impl_;
};

struct AsyncSaveOptions : SaveOptions {
  // Saves of this rank in flight (snapshotted, not yet finished) at most: a SaveAsync that
  // would exceed it first waits for the oldest to finish. >= 1.
  int max_in_flight = 1;
  // Where snapshots are staged; null: the Comm's own pool, unbounded, which therefore holds
  // at most max_in_flight snapshots.
  std::shared_ptr<StagingPool> staging;
  // Run on the background thread after a successful commit, on every rank, with the
  // background group (collectives allowed there; never on the caller's Comm). Its failure
  // is the save's. (The checkpoint manager moves `latest` and prunes here.)
  std::function<void(Comm& background)> on_commit;
};

// One asynchronous save. Copyable (copies refer to the same save); an empty handle (default
// constructed) refers to none. Thread-safe.
class CKPT_API SaveHandle {
 public:
  SaveHandle() = default;
  bool valid() const { return job_ != nullptr; }
  // True once the save has finished: committed, failed or cancelled (Poll). Never blocks.
  bool Done() const;
  // Blocks until the save has finished; throws its failure (kCancelled if Cancel stopped it).
  // Every call reports the same outcome. A failure Wait() has thrown is this rank's to
  // handle: no later SaveAsync or WaitForSaves throws it again.
  void Wait() const;
  // Blocks until the save has finished and reports nothing: a failure stays pending for the
  // next SaveAsync (for destructors that must not throw).
  void WaitQuietly() const;
  // Asks the save to stop, without waiting. A save cancelled before its commit never
  // commits, on any rank (the ranks agree), and leaves `dir` as it was; one that had
  // committed already is unaffected. Wait() tells which. Cancelling on one rank suffices.
  void Cancel() const;
  const std::filesystem::path& dir() const;
  uint64_t staging_bytes() const;  // of this rank's snapshot
  double blocked_seconds() const;  // how long SaveAsync held the caller (FORMAT.md §3.8)

 private:
  friend struct internal::AsyncJob;
  explicit SaveHandle(std::shared_ptr<internal::AsyncJob> job) : job_(std::move(job)) {}
  std::shared_ptr<internal::AsyncJob> job_;
};

// COLLECTIVE (every rank calls it, in the same order as its other SaveAsync calls; it
// exchanges no messages itself except at the first call on a Comm, which Dup()s it).
// Snapshots `state` (tensor chunks and bytes entries copied into the staging pool, so the
// caller may change its buffers as soon as this returns) and saves it to `dir` in the
// background, as Save would.
// Failures are reported once per rank. A save that failed in the background fails on every
// rank; on each, its Wait() throws the failure, and if no Wait() has thrown it by then, the
// next SaveAsync (or WaitForSaves) on the same Comm throws it instead (several such failures
// at once: one Error naming each, with the first one's code). Ranks that differ (one waited,
// another did not) therefore disagree on that next SaveAsync, which then fails on every rank:
// the throwing ranks have reported it, the others' Wait() does. A save that failed because
// SaveAsync threw on some rank (that throw reported it there), or that was cancelled, is
// reported by Wait() only. A failure (not a cancellation) reported by none of these is
// printed to stderr when the last reference to the save goes (its last SaveHandle, or the
// Comm's list of pending failures when the Comm is destroyed, which first waits for its
// saves).
CKPT_API SaveHandle SaveAsync(const std::filesystem::path& dir, const StateDict& state, Comm& comm,
                              const AsyncSaveOptions& options = {});
// Waits for every save of this rank in flight on `comm`, then throws (and so reports) the
// failures the next SaveAsync would have thrown, if any. Not collective.
CKPT_API void WaitForSaves(Comm& comm);

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
  // hashing on more cores). 1 reads serially. Contiguous chunks are read in file order, so
  // fewer readers are fewer streams for the disk: 1-2 can suit a disk that serves one stream
  // best (bench/core's ckpt-bench-readers measures it; figures in docs/benchmarks.md).
  int io_threads = 4;
  // How the bulk of contiguous chunks is read: through the page cache (kOff, the default),
  // or with O_DIRECT, the disk writing straight into this process's memory with no
  // page-cache page allocated, filled and copied from (the bytes then go through a small
  // aligned buffer and one memcpy, and are verified as buffered ones are). kAuto: direct
  // on a local disk's file system (ext2/3/4, XFS, btrfs, f2fs, ZFS; not tmpfs, overlayfs,
  // NFS, Lustre, GPFS, CephFS or FUSE), unless the page cache already holds most of a shard
  // (a load just after a save stays a memcpy); kOn: direct wherever the file system allows it.
  // Compressed chunks, and small reads, are buffered whatever the mode. Direct reads cost
  // less CPU, not always less time (docs/benchmarks.md). Try kAuto for loads much larger
  // than the page cache, on hosts whose page cache is costly, or to keep a load from
  // evicting others' cached files; on network file systems direct reads may skip the
  // client's read-ahead.
  // LoadReport::bytes_read_direct says how much was read direct.
  enum class DirectIo { kAuto, kOn, kOff };
  DirectIo direct_io = DirectIo::kOff;
  // For an s3:// checkpoint (ObjectStoreOptions above: endpoint, credentials, retries; the
  // staging and upload fields are unused here); ignored for a local directory. The load
  // opens no HDF5: one GET of metadata.json, one ranged GET of each shard index it needs
  // (files[i].index_offset), then ranged GETs of the blocks its chunks touch, in parallel,
  // every block checked against its digest. A checkpoint ranges cannot read (compressed
  // chunks, v1, saved before files[].index_offset) is downloaded (cache_max_bytes above).
  ObjectStoreOptions s3;
};

struct LoadReport {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
  std::vector<std::string> mismatched;  // "key: dtype float32 in checkpoint, float16 in target"
  uint64_t bytes_read = 0;
  uint64_t bytes_read_direct = 0;  // of bytes_read, read with O_DIRECT (LoadOptions::direct_io)
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
// An s3:// checkpoint is read as CheckpointReader::Open reads it, the store from the AWS
// environment.
CKPT_API Metadata ReadMetadata(const std::filesystem::path& dir, bool resolve = true);

// A byte range of a file: where a stored chunk's bytes lie (CheckpointReader::LocateChunk),
// or bytes a chunk being written copies (CheckpointWriter::ChunkStream::Copy).
struct FileRange {
  std::filesystem::path file;
  uint64_t offset = 0;
  uint64_t length = 0;
  // A descriptor open on `file`, not owned, valid while what returned the range lives (a
  // CheckpointReader's shard: the file of the checkpoint it reads, even after a replace
  // removed it from its path); -1: `file` is opened by name.
  int fd = -1;
};

// Random access to a committed checkpoint, for tools and loaders. Not collective.
// Thread-safety: one reader per thread.
// How CheckpointReader::Open reads a checkpoint.
struct ReaderOptions {
  // false: a v2 checkpoint's shard indexes are read as chunks are first wanted (each once,
  // checked against its digest) instead of all when opening (Metadata::resolved false).
  bool resolve = true;
  // Refuse at open (kCorrupt) a checkpoint whose structure is unsound, as Load does (see
  // StructureProblems). false: open it anyway, to look at a broken checkpoint; reads stay
  // safe (a region its chunks do not fill is kCorrupt, never unwritten memory).
  bool check_structure = true;
  // For an s3:// checkpoint: how to reach the store (ignored for a local directory).
  ObjectStoreOptions s3;
};

class CKPT_API CheckpointReader {
 public:
  // A checkpoint directory or an s3:// checkpoint, read as `options` say. A directory is
  // pinned (FORMAT.md §2.7): every file is opened through one handle on it, so the reader
  // reads this one checkpoint to its last read, or fails with kChanged.
  static std::unique_ptr<CheckpointReader> Open(const std::filesystem::path& dir, const ReaderOptions& options);
  // With `resolve` false, a v2 checkpoint's shard indexes are read as chunks are first
  // wanted (each once, checked against its digest) instead of all when opening.
  static std::unique_ptr<CheckpointReader> Open(const std::filesystem::path& dir, bool resolve = true);
  // The same for an s3:// checkpoint (a local `dir` ignores `s3`), read as Load reads it
  // (LoadOptions::s3); LocateChunk gives nullopt (no local file). One that ranged reads
  // cannot read (compressed chunks, v1, saved before files[].index_offset) is downloaded
  // into a cache directory under s3.staging_dir (bounded by s3.cache_max_bytes, kInvalidArgument
  // above it) that lives as long as the reader and those Reopen makes, and read there.
  static std::unique_ptr<CheckpointReader> Open(const std::filesystem::path& dir, const ObjectStoreOptions& s3,
                                                bool resolve = false);
  // One shard file (shard-*.h5) on its own, outside its checkpoint: its tensors as its
  // ckpt_shard_index attribute lists them (bytes entries left out), each chunk's dataset
  // checked as a read checks it. A lone shard records no checksums (they are in
  // metadata.json), so `verify` checks nothing and VerifyChunk does nothing; a tensor may be
  // only partly in the file (ReadRegion of a part it lacks is kInvalidArgument).
  static std::unique_ptr<CheckpointReader> OpenShard(const std::filesystem::path& file);
  virtual ~CheckpointReader() = default;

  // Another reader of the same checkpoint, for another thread (a reader is used by one
  // thread at a time): the same pinned directory, object source or shard, and the same
  // metadata, never a checkpoint written at dir() since this one was opened.
  virtual std::unique_ptr<CheckpointReader> Reopen() const = 0;
  // A path that names file `name` of the checkpoint this reader reads, through its pinned
  // directory (valid while this reader lives), for a program that opens the files itself;
  // nullopt where there is no such path (object storage, a lone shard).
  virtual std::optional<std::filesystem::path> PinnedPath(std::string_view name) const = 0;
  // Throws kChanged where the checkpoint at dir() was replaced or removed since it was
  // opened (its files are then no longer all there for later reads).
  virtual void ThrowIfReplaced() const = 0;
  // What makes the checkpoint's structure unsound, one message per problem naming the key
  // (empty when sound): chunks that do not tile their tensor -- out of bounds, overlapping,
  // leaving elements uncovered (FORMAT.md §8.5) -- and, once every chunk record is read
  // (Metadata::resolved), an entry whose stored_bytes is not its records' sum (§3.5).
  virtual std::vector<std::string> StructureProblems() const = 0;
  // Throws kCorrupt, naming metadata.json and listing them, where StructureProblems() finds
  // any: what Open checks unless ReaderOptions::check_structure is false.
  virtual void CheckStructure() const = 0;

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
// 1 MiB a shard): tests/unit/writer_memory_test.cc holds the heap's growth under 32 B a
// chunk. Commit reads each shard's index back
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
    // Uncompressed chunks of at most this many bytes given to WriteChunk are packed
    // (FORMAT.md §5.7), each shard holding up to 1 MiB of them in memory until their pack
    // is written. 0 (the default): every chunk its own dataset.
    uint64_t pack_bytes = 0;
    std::string user_metadata = "{}";
    std::string mesh = "null";
    // For an s3:// target: the files are staged locally and uploaded at Commit, which
    // then commits metadata.json by one conditional PUT (ObjectStoreOptions).
    ObjectStoreOptions s3;
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
