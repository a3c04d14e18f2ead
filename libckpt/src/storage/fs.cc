// storage/fs.cc
#include "storage/fs.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>
#include <vector>

#include "ckpt/error.h"

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace ckpt::storage {
namespace {

[[noreturn]] void Fail(const fs::path& path, const std::string& what, int err) {
  throw Error(ErrorCode::kIO, path.string() + ": " + what + ": " + std::strerror(err));
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

void Fd::Close(const fs::path& path) {
  if (fd_ < 0) return;
  const int r = ::close(fd_);
  fd_ = -1;
  if (r != 0) Fail(path, "close", errno);
}

Fd OpenRegularFile(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) throw Error(ErrorCode::kNotFound, path.string() + ": no such file");
    if (err == ELOOP) throw Error(ErrorCode::kCorrupt, path.string() + ": is a symbolic link, refusing to follow it");
    Fail(path, "open", err);
  }
  Fd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) Fail(path, "fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kCorrupt, path.string() + ": not a regular file");
  }
  // O_NONBLOCK only kept a FIFO from blocking the open; clear it for normal reads.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return owned;
}

uint64_t FileSize(int fd, const fs::path& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) Fail(path, "fstat", errno);
  return static_cast<uint64_t>(st.st_size);
}

void ReadExact(int fd, void* buf, std::size_t n, uint64_t offset, const fs::path& path) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      Fail(path, "read at offset " + std::to_string(offset), errno);
    }
    if (got == 0) {
      throw Error(ErrorCode::kCorrupt, path.string() + ": unexpected end of file at offset " +
                                           std::to_string(offset) + " (truncated?)");
    }
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

void WriteExact(int fd, const void* buf, std::size_t n, uint64_t offset, const fs::path& path) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t put = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (put < 0) {
      if (errno == EINTR) continue;
      Fail(path, "write at offset " + std::to_string(offset), errno);
    }
    p += put;
    n -= static_cast<std::size_t>(put);
    offset += static_cast<uint64_t>(put);
  }
}

MappedRange::MappedRange(int fd, uint64_t offset, std::size_t n, const fs::path& path)
    : size_(n), offset_(offset), path_(path) {
  if (n == 0) return;
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset - offset % page;
  map_len_ = static_cast<std::size_t>(offset - start) + n;
  base_ = ::mmap(nullptr, map_len_, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    Fail(path, "mmap of " + std::to_string(n) + " bytes at offset " + std::to_string(offset), errno);
  }
  data_ = static_cast<const unsigned char*>(base_) + (offset - start);
}

void MappedRange::Populate(std::size_t pos, std::size_t n) const {
#ifdef MADV_POPULATE_READ
  if (n == 0) return;
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto* from = data_ + pos;
  auto* first = const_cast<unsigned char*>(from - reinterpret_cast<uintptr_t>(from) % page);
  const std::size_t len = static_cast<std::size_t>(from - first) + n;
  if (::madvise(first, len, MADV_POPULATE_READ) == 0 || errno == EINVAL) return;  // EINVAL: kernel < 5.14
  const int err = errno;
  if (err == EFAULT) {
    throw Error(ErrorCode::kCorrupt, path_.string() + ": " + std::to_string(n) + " bytes at offset " +
                                         std::to_string(offset_ + pos) +
                                         " cannot be read: the file is shorter than when it was checked (truncated?)");
  }
  Fail(path_, "reading " + std::to_string(n) + " bytes at offset " + std::to_string(offset_ + pos), err);
#else
  (void)pos;
  (void)n;
#endif
}

MappedRange::~MappedRange() {
  if (base_) ::munmap(base_, map_len_);
}

void MappedRange::Release(std::size_t pos) {
  static const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const std::size_t lead = static_cast<std::size_t>(data_ - static_cast<const unsigned char*>(base_));
  const std::size_t until = (lead + pos) / page * page;
  if (until <= released_) return;
  ::madvise(static_cast<char*>(base_) + released_, until - released_, MADV_DONTNEED);
  released_ = until;
}

void CopyRange(int in_fd, uint64_t in_offset, int out_fd, uint64_t out_offset, std::size_t n,
               const fs::path& in_path, const fs::path& out_path) {
  auto in = static_cast<loff_t>(in_offset), out = static_cast<loff_t>(out_offset);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::copy_file_range(in_fd, &in, out_fd, &out, n - done, 0);
    if (got > 0) {
      done += static_cast<std::size_t>(got);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got == 0)
      throw Error(ErrorCode::kCorrupt, in_path.string() + ": copy at offset " + std::to_string(in) +
                                           ": the file ends early (truncated?)");
    if (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP || errno == EBADF) {
      std::vector<char> buf(std::min<std::size_t>(n - done, std::size_t{1} << 20));
      for (; done < n;) {
        const std::size_t len = std::min(buf.size(), n - done);
        ReadExact(in_fd, buf.data(), len, in_offset + done, in_path);
        WriteExact(out_fd, buf.data(), len, out_offset + done, out_path);
        done += len;
      }
      return;
    }
    Fail(out_path, "copy from " + in_path.string() + " at offset " + std::to_string(in), errno);
  }
}

void StartWriteback(int fd, uint64_t offset, uint64_t n) {
  ::sync_file_range(fd, static_cast<off64_t>(offset), static_cast<off64_t>(n), SYNC_FILE_RANGE_WRITE);
}

void FsyncFd(int fd, const fs::path& path) {
  if (::fsync(fd) != 0) Fail(path, "fsync", errno);
}

void FsyncPath(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Fail(path, "open for fsync", errno);
  Fd owned(fd);
  FsyncFd(fd, path);
}

std::string ReadFileLimited(const fs::path& path, uint64_t max_bytes) {
  Fd fd = OpenRegularFile(path);
  const uint64_t size = FileSize(fd.get(), path);
  if (size > max_bytes) {
    throw Error(ErrorCode::kCorrupt, path.string() + ": " + std::to_string(size) +
                                         " bytes exceeds the limit of " + std::to_string(max_bytes));
  }
  std::string data(size, '\0');
  ReadExact(fd.get(), data.data(), size, 0, path);
  return data;
}

void WriteFileSynced(const fs::path& path, std::string_view data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Fail(path, "create", errno);
  Fd owned(fd);
  WriteExact(fd, data.data(), data.size(), 0, path);
  FsyncFd(fd, path);
  owned.Close(path);
}

fs::path SiblingPath(const fs::path& target, std::string_view infix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  fs::path t = target;
  if (!t.has_filename()) t = t.parent_path();
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
  fs::path parent = t.parent_path();
  if (parent.empty()) parent = ".";
  return parent / ("." + t.filename().string() + std::string(infix) + suffix);
}

bool RenameIntoPlace(const fs::path& from, const fs::path& to) {
  fs::path parent = to.parent_path();
  if (parent.empty()) parent = ".";
  bool exchanged = false;
  struct stat st;
  if (::lstat(to.c_str(), &st) == 0) {
    if (::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) != 0) {
      const int err = errno;
      if (err != EINVAL && err != ENOSYS) Fail(to, "atomic exchange with " + from.string(), err);
      // A file system without RENAME_EXCHANGE: move the old one aside first. There is a
      // moment without a checkpoint at `to`, but never a half-written one.
      const fs::path aside = SiblingPath(to, ".ckpt-aside-");
      if (::rename(to.c_str(), aside.c_str()) != 0) Fail(to, "rename aside", errno);
      if (::rename(from.c_str(), to.c_str()) != 0) {
        const int e2 = errno;
        ::rename(aside.c_str(), to.c_str());
        Fail(to, "rename into place", e2);
      }
      if (::rename(aside.c_str(), from.c_str()) != 0) RemoveAllQuietly(aside);
    }
    exchanged = true;
  } else if (::rename(from.c_str(), to.c_str()) != 0) {
    Fail(to, "rename from " + from.string(), errno);
  }
  FsyncPath(parent);
  return exchanged;
}

void RemoveAllQuietly(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

}  // namespace ckpt::storage
