// storage/fs.h: the file-system steps of the commit protocol (FORMAT.md §2) and safe
// opening of files named by metadata (§8). POSIX; errors name the path.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace ckpt::storage {

namespace fs = std::filesystem;

// An open file descriptor, closed on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  ~Fd();
  int get() const { return fd_; }
  // Gives up ownership: the caller closes it.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  explicit operator bool() const { return fd_ >= 0; }
  // Closes and reports failure as kIO naming `path`.
  void Close(const fs::path& path);

 private:
  int fd_ = -1;
};

// Opens `path` for reading only if it is a regular file (not a symlink, FIFO or device).
Fd OpenRegularFile(const fs::path& path);
// Size of an open file.
uint64_t FileSize(int fd, const fs::path& path);

// pread/pwrite of exactly n bytes, retrying short transfers; kIO (or kCorrupt for a read
// past the end of file) naming `path`.
void ReadExact(int fd, void* buf, std::size_t n, uint64_t offset, const fs::path& path);
void WriteExact(int fd, const void* buf, std::size_t n, uint64_t offset, const fs::path& path);

// A read-only view of `n` bytes at `offset` of an open file, mapped (MAP_SHARED): the
// page cache's own pages, no copy. Populate() a range before reading it, so a file that
// shrank meanwhile is an error rather than SIGBUS.
class MappedRange {
 public:
  MappedRange(int fd, uint64_t offset, std::size_t n, const fs::path& path);
  MappedRange(const MappedRange&) = delete;
  MappedRange& operator=(const MappedRange&) = delete;
  ~MappedRange();
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  // Faults in bytes [pos, pos + n) before they are read (MADV_POPULATE_READ): one call
  // instead of a fault per page, and an error (kCorrupt "truncated?") where touching
  // them would raise SIGBUS because the file shrank since it was checked. A no-op on
  // kernels without it (before 5.14).
  void Populate(std::size_t pos, std::size_t n) const;
  // Tells the kernel the pages before `pos` will not be read again.
  void Release(std::size_t pos);

 private:
  void* base_ = nullptr;
  std::size_t map_len_ = 0;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t released_ = 0;
  uint64_t offset_ = 0;
  fs::path path_;
};

// Copies n bytes from `in_fd` at `in_offset` to `out_fd` at `out_offset` inside the kernel
// (copy_file_range: a reflink or an in-kernel copy, never through user memory), falling
// back to pread/pwrite through a 1 MiB buffer where the file systems cannot. kIO naming
// the paths; kCorrupt if the input ends early.
void CopyRange(int in_fd, uint64_t in_offset, int out_fd, uint64_t out_offset, std::size_t n,
               const fs::path& in_path, const fs::path& out_path);

// Starts writeback of a written range without waiting for it, so the final fsync finds
// most of the file on disk already (best effort; errors surface at that fsync).
void StartWriteback(int fd, uint64_t offset, uint64_t n);

void FsyncFd(int fd, const fs::path& path);
void FsyncPath(const fs::path& path);  // a file or a directory

// Reads a whole small file, refusing more than `max_bytes`.
std::string ReadFileLimited(const fs::path& path, uint64_t max_bytes);
// Writes `path` with `data` and fsyncs it.
void WriteFileSynced(const fs::path& path, std::string_view data);

// A unique sibling of `target`: "<parent>/.<name><infix><random>".
fs::path SiblingPath(const fs::path& target, std::string_view infix);

// Moves `from` into place at `to`. If `to` exists it is exchanged atomically
// (renameat2 RENAME_EXCHANGE) and the old content ends up at `from`; returns true then.
// The parent directory is fsynced.
bool RenameIntoPlace(const fs::path& from, const fs::path& to);

// Best-effort recursive removal (never throws).
void RemoveAllQuietly(const fs::path& path);

}  // namespace ckpt::storage
