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

#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/export.h"

namespace ckpt::files {

// Creates `dir` and its missing parents; kIO naming the directory that could not be made.
CKPT_API void MakeDirs(const std::filesystem::path& dir);
// Reads a small regular file (never a FIFO, device or symbolic link), refusing more than
// `max_bytes`; kNotFound if it is absent.
CKPT_API std::string ReadSmallFile(const std::filesystem::path& path, uint64_t max_bytes);
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
