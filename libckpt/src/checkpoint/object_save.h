// checkpoint/object_save.h: the s3:// side of Save, SaveAsync and CheckpointWriter (issue 30
// §2), over the ObjectStore seam (storage/object_store.h).
//
// One save to s3://bucket/prefix, on each rank:
//   - rank 0 begins it (Begin): resolves the store, probes once per bucket that it honours
//     conditional PUT (refused otherwise, unless ObjectStoreOptions::single_writer), checks
//     the target (HEAD prefix/metadata.json: absent, or with overwrite its ETag kept for the
//     commit), collects the prefix's leftovers older than the grace period, and picks the
//     save's nonce, which it sends the others in the plan;
//   - every rank (JoinSave on the others) stages its shard in a local directory of its own
//     (flock'ed while the save lives; those of killed saves, unlocked and older than the
//     grace period, are removed by the next save's LocalStaging and by CleanObjectLeftovers),
//     named ObjectName(shard) (unique to the save), and uploads it (Upload: multipart in
//     parallel, Content-MD5, checked by HEAD); the staged file goes once uploaded;
//   - rank 0 commits (Commit): one PUT of metadata.json, If-None-Match: * or If-Match with
//     the ETag seen at Begin. A 412 is kAlreadyExists, "another writer committed first",
//     and the objects metadata.json named are deleted (best effort: what stays is a leftover).
// Nothing but a successful commit makes anything of the save visible as a checkpoint.
#pragma once

#include <cstdint>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/config.h"

namespace ckpt::storage {
class ObjectStore;
namespace s3 {
struct S3Options;
}
}  // namespace ckpt::storage

namespace ckpt::internal {

#if CKPT_HAVE_S3
// The S3 client's settings from the user's options (unset fields: the AWS environment);
// kInvalidArgument for an addressing or max_attempts out of range.
storage::s3::S3Options ToS3Options(const ObjectStoreOptions& options);
#endif

// Whether `dir` names an object-store checkpoint ("s3://...").
bool IsObjectUrl(const std::filesystem::path& dir);

class ObjectSave {
 public:
  // Rank 0 (or a CheckpointWriter), at the start of the save (above).
  static std::unique_ptr<ObjectSave> Begin(const std::string& url, const ObjectStoreOptions& options, bool overwrite);
  // Another rank, with the nonce rank 0 chose.
  static std::unique_ptr<ObjectSave> Join(const std::string& url, const ObjectStoreOptions& options,
                                          const std::string& nonce);
  ~ObjectSave();  // the local staging directory removed
  ObjectSave(const ObjectSave&) = delete;
  ObjectSave& operator=(const ObjectSave&) = delete;

  const std::string& nonce() const { return nonce_; }
  // "shard-00000-of-00004.h5" -> "shard-00000-of-00004.<nonce>.h5"
  std::string ObjectName(const std::string& file) const;
  // This rank's local staging directory (`tag` tells ranks apart), made on first use.
  const std::filesystem::path& LocalStaging(const std::string& tag);
  // Begins the upload of LocalStaging()/name while it is being written: the observer to
  // give its ShardWriter (OnFinalBytes), which sends each part made only of final bytes
  // at once (storage::StreamingUpload). Upload(name) then sends the rest.
  std::function<void(uint64_t, uint64_t)> StreamUpload(const std::string& name);
  // Uploads LocalStaging()/name as prefix/name (what StreamUpload did not send), checked by
  // HEAD; the local file is removed after, uploaded or not.
  void Upload(const std::string& name);
  // Uploads the local file `path` (kept) as prefix/name, checked by HEAD: the publish of a
  // checkpoint built elsewhere (files::CheckpointPublisher).
  void UploadFrom(const std::filesystem::path& path, const std::string& name);
  // Rank 0: commits `m` (its files[] uploaded by every rank) as prefix/metadata.json.
  void Commit(const Metadata& m);
  // Deletes what this rank uploaded (a failed save's), best effort.
  void DiscardUploads() noexcept;

 private:
  struct Impl;
  explicit ObjectSave(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  std::string nonce_;
};

// Leftovers under `url` (a checkpoint's prefix or a manager's root: every "directory" below
// it): objects named like a save's unique shard names (shard-RRRRR-of-WWWWW.<16 hex>.h5)
// that no metadata.json beside them names, and unfinished multipart uploads of such names,
// older than `options.leftover_grace_seconds` by the server's clock as this machine reads it,
// and the conditional-PUT probe's objects (.ckpt-probe-<16 hex>) a killed save left. Also
// removes this machine's staging directories under options.staging_dir that no live save
// holds and that are older than the grace period. Returns how many objects it deleted plus
// uploads it aborted.
std::size_t CleanObjectLeftovers(const std::string& url, const ObjectStoreOptions& options);

// The committed checkpoints directly under `url` ("<url>/<name>/metadata.json"), by name.
std::vector<std::string> ListCommittedObjects(const std::string& url, const ObjectStoreOptions& options);

// Removes the checkpoint at `url`: its metadata.json first (un-committed), then the objects
// it named.
void RemoveObjectCheckpoint(const std::string& url, const ObjectStoreOptions& options);

// Called with the error `e` of a read of an object that metadata.json (the text whose
// std::hash is `text_hash`, at `metadata_key`) named: when metadata.json is no longer that
// text, the checkpoint was replaced or removed while it was read (and the version read is
// being collected), and this throws kChanged saying so; otherwise (or when the store cannot
// tell) it returns, and the caller rethrows `e`.
void ThrowIfCommitChanged(storage::ObjectStore& store, const std::string& bucket, const std::string& metadata_key,
                          const std::string& url, uint64_t text_hash, const Error& e);

// Downloads the committed checkpoint at `url` (metadata.json and every file it names) into
// the local directory `dir` (made; must be absent or empty). Files larger than `max_bytes`
// in all are refused before any is fetched. A checkpoint replaced and collected meanwhile is
// kChanged (ThrowIfCommitChanged).
void DownloadObjectCheckpoint(const std::string& url, const ObjectStoreOptions& options,
                              const std::filesystem::path& dir, uint64_t max_bytes);

// A Load's download cache directory, flock'ed while this lives (so that only a killed
// load's is collected, as a save's staging directories are: the next save, the next such
// load, CleanObjectLeftovers) and removed when it goes.
class CacheDir {
 public:
  CacheDir(std::filesystem::path path, int lock) : path_(std::move(path)), lock_(lock) {}
  ~CacheDir();
  CacheDir(const CacheDir&) = delete;
  CacheDir& operator=(const CacheDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int lock_ = -1;
};

// Load's interim path: DownloadObjectCheckpoint into a fresh directory
// "load-<nonce>-r<rank>" under options.staging_dir (bounded by options.cache_max_bytes).
std::unique_ptr<CacheDir> DownloadToCache(const std::string& url, const ObjectStoreOptions& options, int rank);

// The store of `options` (an S3Store), through the test wrapper below if one is set: what
// saves, leftover cleaning, downloads and ranged reads of s3:// use. Its configuration errors
// (no credentials, ...) name `url`, what it is opened for.
std::shared_ptr<storage::ObjectStore> OpenObjectStore(const ObjectStoreOptions& options, const std::string& url);

// For tests: wraps every store s3:// opens from now on (saves and reads; nullptr: none).
void SetObjectStoreWrapperForTest(
    std::function<std::shared_ptr<storage::ObjectStore>(std::shared_ptr<storage::ObjectStore>)> wrap);

}  // namespace ckpt::internal
