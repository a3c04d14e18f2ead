// checkpoint/files.cc: ckpt/files.h over storage's commit routine.
#include "ckpt/files.h"

#include "checkpoint/object_save.h"
#include "storage/commit.h"
#include "storage/fs.h"

namespace ckpt::files {

void MakeDirs(const std::filesystem::path& dir) { storage::MakeDirs(dir); }

std::string ReadSmallFile(const std::filesystem::path& path, uint64_t max_bytes) {
  return storage::ReadFileLimited(path, max_bytes);
}

void CommitFile(const std::filesystem::path& target, std::string_view data) { storage::CommitFile(target, data); }

void RemoveCheckpoint(const std::filesystem::path& dir) { storage::RemoveCommitted(dir); }

std::size_t CleanLeftovers(const std::filesystem::path& parent,
                           const std::function<bool(std::string_view)>& is_target) {
  return storage::CleanLeftovers(parent, is_target);
}

std::size_t CleanObjectLeftovers(const std::string& url, const ObjectStoreOptions& options) {
  return internal::CleanObjectLeftovers(url, options);
}

std::vector<std::string> ListObjectCheckpoints(const std::string& url, const ObjectStoreOptions& options) {
  return internal::ListCommittedObjects(url, options);
}

void RemoveObjectCheckpoint(const std::string& url, const ObjectStoreOptions& options) {
  internal::RemoveObjectCheckpoint(url, options);
}

void DownloadObjectCheckpoint(const std::string& url, const ObjectStoreOptions& options,
                              const std::filesystem::path& dir, uint64_t max_bytes) {
  internal::DownloadObjectCheckpoint(url, options, dir, max_bytes);
}

}  // namespace ckpt::files
