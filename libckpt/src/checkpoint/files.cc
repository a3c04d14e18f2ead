// checkpoint/files.cc: ckpt/files.h over storage's commit routine.
#include "ckpt/files.h"

#include <map>

#include "checkpoint/object_save.h"
#include "format/names.h"
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

struct CheckpointPublisher::Impl {
  std::string url;
  std::unique_ptr<internal::ObjectSave> save;
  bool published = false;
};

CheckpointPublisher::CheckpointPublisher(const std::string& url, const ObjectStoreOptions& options, bool overwrite)
    : impl_(std::make_unique<Impl>()) {
  if (!internal::IsObjectUrl(url)) {
    throw Error(ErrorCode::kInvalidArgument, url + ": not an object-store URL (s3://bucket/prefix)");
  }
  impl_->url = url;
  impl_->save = internal::ObjectSave::Begin(url, options, overwrite);
}

CheckpointPublisher::~CheckpointPublisher() = default;

const std::string& CheckpointPublisher::url() const { return impl_->url; }

const std::filesystem::path& CheckpointPublisher::staging() { return impl_->save->LocalStaging("publish"); }

std::vector<std::string> CheckpointPublisher::Publish(const std::filesystem::path& dir) {
  if (impl_->published) throw Error(ErrorCode::kInvalidArgument, impl_->url + ": this publisher has published already");
  impl_->published = true;
  constexpr uint64_t kMaxMetadataBytes = uint64_t{1} << 30;
  const std::filesystem::path meta_path = dir / names::kMetadataFile;
  Metadata m = ParseMetadata(storage::ReadFileLimited(meta_path, kMaxMetadataBytes), meta_path.string());
  // Every file as metadata.json records it before a byte goes out.
  for (const FileMeta& f : m.files) {
    const std::filesystem::path path = dir / f.name;
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) throw Error(ErrorCode::kNotFound, path.string() + ": named in metadata.json, " + ec.message());
    if (size != f.bytes) {
      throw Error(ErrorCode::kCorrupt, path.string() + ": " + std::to_string(size) + " bytes, metadata.json records " +
                                           std::to_string(f.bytes));
    }
  }
  internal::ObjectSave& save = *impl_->save;
  std::map<std::string, std::string> renamed;
  std::vector<std::string> objects;
  try {
    for (FileMeta& f : m.files) {
      const std::string name = save.ObjectName(f.name);
      save.UploadFrom(dir / f.name, name);
      renamed[f.name] = name;
      objects.push_back(name);
      f.name = name;
    }
    for (auto& [key, entry] : m.entries) {  // a v1 checkpoint's chunks name their files
      for (ChunkMeta& c : entry.chunks) {
        if (auto it = renamed.find(c.file); it != renamed.end()) c.file = it->second;
      }
    }
    save.Commit(m);
  } catch (...) {
    save.DiscardUploads();
    throw;
  }
  return objects;
}

}  // namespace ckpt::files
