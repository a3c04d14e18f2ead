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
