// tests/fault/fault_fs.h: a FileSystem (storage/fs.h) for tests: counts the operations
// ckpt performs (open, pwrite, copy_file_range, fsync, close, rename, mkdir, remove, lstat,
// directory listings, the flock calls on a commit's parent directory, and the statfs and
// mount-table look-ups of its file-system check) and makes the N-th one fail with a chosen
// errno (EIO, ENOSPC, ...), as a disk would. A failing close still closes (as close(2) does); a failing write writes
// nothing.
#pragma once

#include <cerrno>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "storage/fs.h"

namespace ckpt_test {

namespace fs = std::filesystem;

class FaultFs : public ckpt::storage::FileSystem {
 public:
  // Fails the `fail_at`-th counted operation (1-based; 0: none) with `err`. With `only`,
  // only operations on a path containing it are counted.
  explicit FaultFs(long fail_at = 0, int err = EIO, std::string only = {})
      : fail_at_(fail_at), err_(err), only_(std::move(only)) {}

  long count() const {
    std::lock_guard lock(mu_);
    return count_;
  }
  bool fired() const {
    std::lock_guard lock(mu_);
    return !failed_.empty();
  }
  // Counted operations of one kind so far ("flock", "rename", ...).
  long count(const std::string& op) const {
    std::lock_guard lock(mu_);
    const auto it = by_op_.find(op);
    return it == by_op_.end() ? 0 : it->second;
  }
  // "fsync /path/to/file" of the operation made to fail.
  std::string failed() const {
    std::lock_guard lock(mu_);
    return failed_;
  }
  fs::path failed_path() const {
    std::lock_guard lock(mu_);
    return failed_path_;
  }

  int Open(const fs::path& path, int flags, mode_t mode, int dirfd) override {
    if (Hit("open", path)) return -1;
    return FileSystem::Open(path, flags, mode, dirfd);
  }
  ssize_t Pwrite(int fd, const void* buf, std::size_t n, off_t offset, const fs::path& path) override {
    if (Hit("pwrite", path)) return -1;
    return FileSystem::Pwrite(fd, buf, n, offset, path);
  }
  ssize_t CopyFileRange(int in_fd, loff_t* in_offset, int out_fd, loff_t* out_offset, std::size_t n,
                        const fs::path& out_path) override {
    if (Hit("copy_file_range", out_path)) return -1;
    return FileSystem::CopyFileRange(in_fd, in_offset, out_fd, out_offset, n, out_path);
  }
  int Fsync(int fd, const fs::path& path) override {
    if (Hit("fsync", path)) return -1;
    return FileSystem::Fsync(fd, path);
  }
  int Close(int fd, const fs::path& path) override {
    const bool hit = Hit("close", path);
    const int r = FileSystem::Close(fd, path);
    if (hit) errno = err_;
    return hit ? -1 : r;
  }
  int Rename(const fs::path& from, const fs::path& to, ckpt::storage::RenameMode mode) override {
    if (Hit("rename", to)) return -1;
    return FileSystem::Rename(from, to, mode);
  }
  int Mkdir(const fs::path& path, mode_t mode) override {
    if (Hit("mkdir", path)) return -1;
    return FileSystem::Mkdir(path, mode);
  }
  int Remove(const fs::path& path, bool directory) override {
    if (Hit("remove", path)) return -1;
    return FileSystem::Remove(path, directory);
  }
  int Flock(int fd, int operation, const fs::path& path) override {
    if (Hit("flock", path)) return -1;
    return FileSystem::Flock(fd, operation, path);
  }
  int Lstat(const fs::path& path, struct stat* st) override {
    if (Hit("lstat", path)) return -1;
    return FileSystem::Lstat(path, st);
  }
  int ListDir(const fs::path& path, std::vector<std::string>& names) override {
    if (Hit("listdir", path)) return -1;
    return FileSystem::ListDir(path, names);
  }
  int Statfs(const fs::path& path, struct statfs* st) override {
    if (Hit("statfs", path)) return -1;
    return FileSystem::Statfs(path, st);
  }
  int MountOf(const fs::path& path, ckpt::storage::MountEntry* entry) override {
    if (Hit("mountinfo", path)) return -1;
    return FileSystem::MountOf(path, entry);
  }

 private:
  bool Hit(const char* op, const fs::path& path) {
    std::lock_guard lock(mu_);
    if (!only_.empty() && path.string().find(only_) == std::string::npos) return false;
    ++by_op_[op];
    if (++count_ != fail_at_) return false;
    failed_ = std::string(op) + " " + path.string();
    failed_path_ = path;
    errno = err_;
    return true;
  }

  mutable std::mutex mu_;
  long count_ = 0;
  std::map<std::string, long> by_op_;
  const long fail_at_;
  const int err_;
  const std::string only_;
  std::string failed_;
  fs::path failed_path_;
};

// Holds every write of chunk data into a staging shard (a save in progress) until Open():
// a background save kept running for as long as a test needs, without timing anything.
class GateFs : public ckpt::storage::FileSystem {
 public:
  ssize_t Pwrite(int fd, const void* buf, std::size_t n, off_t offset, const fs::path& path) override {
    const std::string p = path.string();
    if (p.find(".ckpt-tmp-") != std::string::npos && p.find("shard-") != std::string::npos) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return open_; });
    }
    return FileSystem::Pwrite(fd, buf, n, offset, path);
  }
  void Open() {
    std::lock_guard lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Installs a FileSystem for the scope.
class Installed {
 public:
  explicit Installed(ckpt::storage::FileSystem& fs) : prev_(ckpt::storage::SetFileSystem(&fs)) {}
  ~Installed() { ckpt::storage::SetFileSystem(prev_); }
  Installed(const Installed&) = delete;
  Installed& operator=(const Installed&) = delete;

 private:
  ckpt::storage::FileSystem* prev_;
};

}  // namespace ckpt_test
