// checkpoint/files.cc: ckpt/files.h over storage's commit routine.
#include "ckpt/files.h"

#include <fcntl.h>

#include <map>

#include "checkpoint/object_save.h"
#include "format/names.h"
#include "storage/commit.h"
#include "storage/file_hasher.h"
#include "storage/fs.h"

namespace ckpt::files {

void MakeDirs(const std::filesystem::path& dir) { storage::MakeDirs(dir); }

std::string ReadSmallFile(const std::filesystem::path& path, uint64_t max_bytes, bool follow_symlinks) {
  return storage::ReadFileLimited(path, max_bytes,
                                  follow_symlinks ? storage::Symlinks::kFollow : storage::Symlinks::kRefuse);
}

void CommitFile(const std::filesystem::path& target, std::string_view data) { storage::CommitFile(target, data); }

void RemoveCheckpoint(const std::filesystem::path& dir) { storage::RemoveCommitted(dir); }

std::size_t CleanLeftovers(const std::filesystem::path& parent,
                           const std::function<bool(std::string_view)>& is_target) {
  return storage::CleanLeftovers(parent, is_target);
}

// ---- Staged outputs ----

StagedOutput::StagedOutput(const std::filesystem::path& target, bool directory)
    : staging_(storage::BeginStaging(target, directory)), target_(target) {}

StagedOutput::~StagedOutput() { Discard(); }

StagedOutput::StagedOutput(StagedOutput&& other) noexcept
    : staging_(std::move(other.staging_)), target_(std::move(other.target_)), committed_(other.committed_) {
  other.staging_.clear();
}

StagedOutput& StagedOutput::operator=(StagedOutput&& other) noexcept {
  if (this != &other) {
    Discard();
    staging_ = std::move(other.staging_);
    target_ = std::move(other.target_);
    committed_ = other.committed_;
    other.staging_.clear();
  }
  return *this;
}

void StagedOutput::Commit(Replace replace) {
  if (committed_ || staging_.empty())
    throw Error(ErrorCode::kInvalidArgument, target_.string() + ": staged output already committed or discarded");
  storage::CommitStaged(staging_, target_, replace);
  committed_ = true;
}

void StagedOutput::Discard() noexcept {
  if (!committed_ && !staging_.empty()) storage::DiscardStaged(staging_);
  staging_.clear();
}

void StagedOutput::CommitAll(const std::vector<StagedOutput*>& outputs, Replace replace) {
  std::vector<std::pair<std::filesystem::path, std::filesystem::path>> staged;
  for (const StagedOutput* o : outputs) {
    if (o->committed_ || o->staging_.empty())
      throw Error(ErrorCode::kInvalidArgument, o->target_.string() + ": staged output already committed or discarded");
    staged.emplace_back(o->staging_, o->target_);
  }
  storage::CommitStagedGroup(staged, replace);
  for (StagedOutput* o : outputs) o->committed_ = true;
}

void Fsync(const std::filesystem::path& path) { storage::FsyncPath(path); }

// ---- Files ----

File::~File() {
  if (fd_ >= 0) storage::Fd{fd_};  // closes it, errors ignored (Close reports them)
}

File::File(File&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) storage::Fd{fd_};
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    other.fd_ = -1;
  }
  return *this;
}

File File::OpenForRead(const std::filesystem::path& path, bool follow_symlinks) {
  return File(
      storage::OpenRegularFile(path, follow_symlinks ? storage::Symlinks::kFollow : storage::Symlinks::kRefuse)
          .release(),
      path);
}

File File::Create(const std::filesystem::path& path) {
  try {
    return File(storage::OpenFile(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644).release(), path);
  } catch (const Error& e) {
    std::error_code ec;
    if (e.code() == ErrorCode::kIO && std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
      throw Error(ErrorCode::kAlreadyExists, path.string() + ": already exists");
    throw;
  }
}

namespace {
int OpenFd(int fd, const std::filesystem::path& path) {
  if (fd < 0) throw Error(ErrorCode::kInvalidArgument, path.string() + ": file is not open");
  return fd;
}
}  // namespace

uint64_t File::Size() const { return storage::FileSize(OpenFd(fd_, path_), path_); }

void File::ReadAt(void* buf, std::size_t n, uint64_t offset) const {
  storage::ReadExact(OpenFd(fd_, path_), buf, n, offset, path_);
}

void File::Scan(uint64_t offset, uint64_t n, const Consumer& consume) const {
  storage::FileHasher(OpenFd(fd_, path_), path_).Scan(offset, n, consume);
}

void File::WriteAt(const void* buf, std::size_t n, uint64_t offset) {
  storage::WriteExact(OpenFd(fd_, path_), buf, n, offset, path_);
}

void File::CopyFrom(int src_fd, const std::filesystem::path& src_path, uint64_t src_offset, uint64_t offset,
                    std::size_t n) {
  storage::CopyRange(src_fd, src_offset, OpenFd(fd_, path_), offset, n, src_path, path_);
}

void File::StartWriteback() { storage::StartWriteback(OpenFd(fd_, path_), 0, 0); }

void File::Sync() { storage::FsyncFd(OpenFd(fd_, path_), path_); }

void File::Close() {
  if (fd_ < 0) return;
  storage::Fd fd(fd_);
  fd_ = -1;
  fd.Close(path_);
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

bool ckpt::IsObjectUrl(const std::filesystem::path& path) { return internal::IsObjectUrl(path); }
