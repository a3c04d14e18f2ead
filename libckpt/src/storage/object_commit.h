// storage/object_commit.h: publishing a checkpoint to an object store without rename.
//
// A save stages its files locally under names unique to that save (UniqueObjectName: the
// shard name with the save's nonce), so that no object a committed checkpoint names is ever
// written again. PublishDirectory then uploads every staged file but metadata.json as
// objects under the checkpoint's prefix (multipart, parts in parallel, Content-MD5 on each;
// each object checked by HEAD after completion: its size, and its ETag against the MD5s of
// the parts sent), and commits by one conditional PUT of metadata.json:
//   - a new checkpoint: If-None-Match: *  (the key must not exist)
//   - a replacement:    If-Match: <the ETag of the metadata.json the writer saw at its start>
// A 412 is kAlreadyExists, "another writer committed first": of racing writers exactly one
// commits, and a replacement never overwrites a commit it did not see. The loser's objects
// stay behind as garbage that no metadata.json names (collected by a later cleaning).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "storage/object_store.h"

namespace ckpt::storage {

// 16 random hex digits, one per save.
std::string SaveNonce();
// "shard-00000-of-00002.h5" -> "shard-00000-of-00002.<nonce>.h5" (before the last extension;
// at the end for a name without one).
std::string UniqueObjectName(const std::string& name, const std::string& nonce);

struct UploadOptions {
  uint64_t part_bytes = 16ull << 20;  // >= 5 MiB (S3's minimum part); files up to it go in one PUT
  int parallel = 8;                   // parts in flight; memory is parallel * part_bytes
};

// Uploads the local file `path` as `key` and checks it by HEAD. A file up to part_bytes goes
// in one PutIfAbsent (an existing key is kAlreadyExists), a larger one as a multipart upload,
// aborted on failure. Returns the object's HEAD.
ObjectInfo UploadFile(ObjectStore& store, const std::string& bucket, const std::string& key,
                      const std::filesystem::path& path, const UploadOptions& options = {});

// A file uploaded while it is being written. Final(offset, n) says that those bytes of the
// file are written and will not change (ShardWriter::OnFinalBytes); every part of
// options.part_bytes made only of such bytes is sent at once, on up to options.parallel
// threads of the upload's own (the multipart upload begins with the first such part).
// Finish, once the file is complete, sends the parts left (those that held bytes written
// later, such as HDF5's metadata, and the last one), completes and checks the object as
// UploadFile does; a file of at most part_bytes with no part sent early goes in one
// PutIfAbsent. Memory: parallel * part_bytes. Destroyed unfinished (a failed save): its
// threads stop and the multipart upload is aborted (best effort; else a leftover). A
// failed part fails Finish, naming the object; the parts after it are not sent.
class StreamingUpload {
 public:
  StreamingUpload(ObjectStore& store, std::string bucket, std::string key, std::filesystem::path path,
                  const UploadOptions& options = {});
  ~StreamingUpload();
  StreamingUpload(const StreamingUpload&) = delete;
  StreamingUpload& operator=(const StreamingUpload&) = delete;
  // Thread-safe. Each byte must be reported at most once.
  void Final(uint64_t offset, uint64_t n);
  ObjectInfo Finish();
  // Parts sent before Finish (for tests and the save's report).
  std::size_t early_parts() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The ETag of `prefix`/metadata.json now, or nullopt when there is none (a new checkpoint).
std::optional<std::string> CommittedEtag(ObjectStore& store, const std::string& bucket, const std::string& prefix);

// Uploads the staged checkpoint in `dir` to `prefix` and commits it (above). `expected_etag`:
// nullopt for a new checkpoint, else what CommittedEtag said at the start of the save. Every
// staged name must be free under the prefix (kAlreadyExists naming it otherwise: names unique
// to the save never collide). Returns the committed metadata.json's ETag.
std::string PublishDirectory(ObjectStore& store, const std::filesystem::path& dir, const std::string& bucket,
                             const std::string& prefix, const std::optional<std::string>& expected_etag,
                             const UploadOptions& options = {});

}  // namespace ckpt::storage
