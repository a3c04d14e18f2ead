// ckpt/files.h: the file steps of the commit protocol (FORMAT.md §2), for programs that keep
// files of their own beside checkpoints: a training runtime's `latest` pointer, its rotation.
// Every step goes through libckpt's file-system seam, so it gets the same guarantees (and the
// same fault injection in tests) as a checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/export.h"

namespace ckpt::files {

// Creates `dir` and its missing parents; kIO naming the directory that could not be made.
CKPT_API void MakeDirs(const std::filesystem::path& dir);
// Reads a small regular file (never a FIFO or device), refusing more than `max_bytes`
// (kCorrupt, before reading any); kNotFound if it is absent. A symbolic link is followed only
// with `follow_symlinks` (a path a user named, not one a checkpoint names).
CKPT_API std::string ReadSmallFile(const std::filesystem::path& path, uint64_t max_bytes,
                                   bool follow_symlinks = false);
// Writes a small file atomically: staged beside `target`, fsynced, renamed into place, the
// parent fsynced. A reader sees the old content or the new, never a part.
CKPT_API void CommitFile(const std::filesystem::path& target, std::string_view data);
// Removes the checkpoint at `dir`: un-commits it first (renamed away, parent fsynced), then
// deletes its files, so no moment shows a `dir` that looks committed but has lost files.
CKPT_API void RemoveCheckpoint(const std::filesystem::path& dir);
// Removes in `parent` what killed saves left beside every target whose name satisfies
// `is_target`, unless another writer is at work in `parent` now. Returns how many it removed.
CKPT_API std::size_t CleanLeftovers(const std::filesystem::path& parent,
                                    const std::function<bool(std::string_view)>& is_target);

// ---- Staged outputs (FORMAT.md §2's commit, for any file or directory) -----------------
// An output is written in full at a staging sibling of its target
// (".<name>.ckpt-tmp-<random>"), fsynced, then committed by one atomic rename; the parent
// directory is fsynced before any old content is removed. A commit that fails leaves the
// target as it was. Leftovers of killed writers are removed by the next staging for the
// same target (never a live writer's: writers hold a shared lock on the parent).

// What a commit may replace at its target.
enum class Replace {
  kNever,     // nothing: a target that exists is kAlreadyExists
  kExpected,  // exactly what was at the target when staging began (nothing, an empty
              // directory, or the checkpoint the caller checked); anything else there now
              // is kAlreadyExists: another writer got there first
  kExisting,  // what is there now: a file by a file; a directory by a directory, which must
              // be empty or a committed checkpoint (holding metadata.json)
};

// One output being staged. Destroying it uncommitted discards the staging (never throws).
class CKPT_API StagedOutput {
 public:
  // Reserves a fresh staging path beside `target` (made as an empty directory when
  // `directory`), creating the parent directory if needed. kInvalidArgument where the
  // parent's file system cannot rename atomically (a FUSE mount of an object store).
  StagedOutput(const std::filesystem::path& target, bool directory);
  ~StagedOutput();
  StagedOutput(StagedOutput&& other) noexcept;
  StagedOutput& operator=(StagedOutput&& other) noexcept;
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  // Where to write the output; the target it will be committed at.
  const std::filesystem::path& path() const { return staging_; }
  const std::filesystem::path& target() const { return target_; }
  // Commits the output, which the caller has written in full and fsynced (File::Sync,
  // files::Fsync), at target(). Errors (kAlreadyExists, kIO) name the target; the staging is
  // then still there, discarded with this object. REQUIRES: not committed or discarded.
  void Commit(Replace replace);
  // Removes the staging now (never throws); idempotent.
  void Discard() noexcept;
  bool committed() const { return committed_; }

  // Commits several outputs all or nothing, in order (put last the one readers look for,
  // such as an index naming the others): if any rename or fsync fails, the ones done are
  // undone, last first, and every target is left as it was.
  static void CommitAll(const std::vector<StagedOutput*>& outputs, Replace replace);

 private:
  std::filesystem::path staging_, target_;
  bool committed_ = false;
};

// fsync of a file or a directory; kIO naming it.
CKPT_API void Fsync(const std::filesystem::path& path);

// ---- Files read and written in place, through libckpt's file-system seam ----------------
// An open file, closed when destroyed. Errors (kIO; kNotFound where absent) name the path.
// Threading: ReadAt, Scan and WriteAt of disjoint ranges may run on several threads.
class CKPT_API File {
 public:
  File() = default;
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  // Opens a regular file for reading; a FIFO, device or directory is kCorrupt (and a FIFO
  // does not block the open). A symbolic link is followed only with `follow_symlinks` (a
  // path a user named, not one a checkpoint names).
  static File OpenForRead(const std::filesystem::path& path, bool follow_symlinks = false);
  // Creates a new file (kAlreadyExists if `path` exists) for reading and writing.
  static File Create(const std::filesystem::path& path);

  bool is_open() const { return fd_ >= 0; }
  const std::filesystem::path& path() const { return path_; }
  // The descriptor, owned by this File (for FileRange::fd and CopyFrom).
  int fd() const { return fd_; }

  uint64_t Size() const;
  // Reads exactly `n` bytes at `offset`; kCorrupt naming the file where it ends early.
  void ReadAt(void* buf, std::size_t n, uint64_t offset) const;
  // Hands the `n` bytes at `offset` to `consume(data, length, position)` piece by piece, in
  // order (position counted from `offset`), in bounded memory (large ranges straight from
  // the page cache); a piece is valid during the call only. kCorrupt where the file ends early.
  using Consumer = std::function<void(const unsigned char*, std::size_t, uint64_t)>;
  void Scan(uint64_t offset, uint64_t n, const Consumer& consume) const;
  void WriteAt(const void* buf, std::size_t n, uint64_t offset);
  // Copies `n` bytes at `src_offset` of the open file `src_fd` (named `src_path` in errors)
  // to `offset` of this file, inside the kernel where the file systems allow (a reflink or
  // copy_file_range), else through a bounded buffer. kCorrupt if the source ends early.
  void CopyFrom(int src_fd, const std::filesystem::path& src_path, uint64_t src_offset, uint64_t offset,
                std::size_t n);
  // Starts writing back what was written without waiting (a hint, so that Sync has little
  // left); errors surface at Sync.
  void StartWriteback();
  // fsync; then Close reports a failed close.
  void Sync();
  void Close();

 private:
  File(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::filesystem::path path_;
};

// ---- Checkpoints on object storage (s3://bucket/prefix) --------------------------------
// `options` say how to reach the store (ckpt/checkpoint.h, ObjectStoreOptions).

// Removes under `url` (a checkpoint's prefix or a root holding several) the leftovers of
// saves that lost a race, failed or were killed, and of replaced checkpoints: objects named
// like a save's shards (shard-RRRRR-of-WWWWW.<nonce>.h5) that no metadata.json beside them
// names, and unfinished multipart uploads of such names, once older than
// options.leftover_grace_seconds (younger ones may belong to a save still uploading, or be
// read by a reader of a checkpoint just replaced). Nothing else is touched. Returns how many
// it removed. Every s3:// save runs it on its own prefix first.
CKPT_API std::size_t CleanObjectLeftovers(const std::string& url, const ObjectStoreOptions& options);
// The names of the committed checkpoints directly under `url` (those "<url>/<name>/" that
// hold a metadata.json), in the store's key order.
CKPT_API std::vector<std::string> ListObjectCheckpoints(const std::string& url, const ObjectStoreOptions& options);
// Removes the checkpoint at `url`: metadata.json first (un-committed: a reader still running
// gets an error, never a mix), then the objects it named. Absent: nothing to do.
CKPT_API void RemoveObjectCheckpoint(const std::string& url, const ObjectStoreOptions& options);
// Downloads the committed checkpoint at `url` into the local directory `dir` (made if
// absent), metadata.json last, so that Load(dir) reads it; refused (kInvalidArgument) before
// any byte is fetched when its files hold more than `max_bytes`. The interim way to read an
// s3:// checkpoint until Load reads object storage with ranged GETs.
CKPT_API void DownloadObjectCheckpoint(const std::string& url, const ObjectStoreOptions& options,
                                       const std::filesystem::path& dir, uint64_t max_bytes);

// Publishes a checkpoint committed in a local directory to `url` with the commit of an
// s3:// Save (ckpt/checkpoint.h, ObjectStoreOptions): what ckpt-merge and ckpt-convert do
// with an s3:// destination, the checkpoint built and verified locally first.
//
//   files::CheckpointPublisher pub(url, options, overwrite);  // the destination checked now
//   BuildCheckpoint(pub.staging() / "out");                      // any local writer
//   pub.Publish(pub.staging() / "out");                          // uploaded, then committed
class CKPT_API CheckpointPublisher {
 public:
  // Checks the destination before any work: the store probed once per bucket for
  // conditional PUT (refused, kInvalidArgument, unless options.single_writer); a checkpoint
  // already at `url` is kAlreadyExists unless `overwrite`, which keeps its metadata.json's
  // ETag for the commit; the prefix's old leftovers collected (CleanObjectLeftovers).
  CheckpointPublisher(const std::string& url, const ObjectStoreOptions& options, bool overwrite);
  ~CheckpointPublisher();  // the staging directory removed
  CheckpointPublisher(const CheckpointPublisher&) = delete;
  CheckpointPublisher& operator=(const CheckpointPublisher&) = delete;

  const std::string& url() const;
  // A fresh local directory of this publisher's own, under options.staging_dir (empty:
  // $TMPDIR or /tmp, then "ckpt-s3-staging"), made on first use, removed with the publisher.
  const std::filesystem::path& staging();
  // Uploads every file `dir`/metadata.json names (each checked against its recorded size
  // first, kCorrupt naming it otherwise) as a new object whose name is unique to this
  // publish ("shard-00000-of-00004.h5" -> "shard-00000-of-00004.<nonce>.h5"; multipart,
  // Content-MD5, checked by HEAD), then commits a metadata.json naming them by one
  // conditional PUT: If-None-Match: * for a new checkpoint, If-Match with the ETag seen by
  // the constructor for a replacement. A 412 is kAlreadyExists, "another writer committed
  // first". On any failure nothing of this publish is visible: its objects are deleted
  // (best effort; what stays is a leftover). Returns the object names, in files[] order.
  std::vector<std::string> Publish(const std::filesystem::path& dir);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::files
