// storage/file_hasher.cc
#include "storage/file_hasher.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "ckpt/error.h"

namespace ckpt::storage {
namespace {

constexpr std::size_t kPiece = std::size_t{256} << 10;     // read and hashed at a time
constexpr uint64_t kMapMin = uint64_t{1} << 20;            // smaller ranges are read
constexpr std::size_t kMapWindow = std::size_t{32} << 20;  // mapped at a time
constexpr uint64_t kReadAhead = uint64_t{64} << 20;        // fetched ahead of hashing

}  // namespace

FileHasher::FileHasher(const Dir& dir, const std::string& name) : path_(dir.path() / name), dir_(dir), name_(name) {}
FileHasher::FileHasher(int fd, std::filesystem::path path) : path_(std::move(path)), fd_(fd) {}

int FileHasher::Fd() {
  if (fd_ < 0) {
    owned_ = OpenRegularFileAt(dir_, name_);
    fd_ = owned_.get();
  }
  return fd_;
}

void FileHasher::Advise(uint64_t from, uint64_t until) {
  if (advised_ >= until + kReadAhead / 2) return;
  const uint64_t to = until + kReadAhead;
  from = std::max(advised_, from);
  ::posix_fadvise(Fd(), static_cast<off_t>(from), static_cast<off_t>(to - from), POSIX_FADV_WILLNEED);
  advised_ = to;
}

void FileHasher::Scan(uint64_t offset, uint64_t n, const Consumer& consume, std::string_view what) {
  const int fd = Fd();
  if (n < kMapMin) {
    buf_.resize(kPiece);
    for (uint64_t pos = 0; pos < n;) {
      const auto len = static_cast<std::size_t>(std::min<uint64_t>(kPiece, n - pos));
      Advise(offset + pos, offset + pos + len);
      ReadExact(fd, buf_.data(), len, offset + pos, path_);
      consume(buf_.data(), len, pos);
      pos += len;
    }
    return;
  }
  // MADV_POPULATE_READ fails with an error where touching the pages would raise SIGBUS.
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (uint64_t pos = 0; pos < n;) {
    const uint64_t at = offset + pos;
    uint64_t len = std::min<uint64_t>(n - pos, kMapWindow);
    if (len < n - pos) len -= (at + len) % page;  // windows end on page boundaries
    Advise(at, at + len);
    const MappedRange map(fd, at, static_cast<std::size_t>(len), path_);
    try {
      map.Populate(0, static_cast<std::size_t>(len));
    } catch (const Error& e) {
      if (what.empty()) throw;
      throw Error(e.code(), std::string(what) + ": " + e.what());
    }
    consume(map.data(), static_cast<std::size_t>(len), pos);
    pos += len;
  }
}

void FileHasher::Hash(uint64_t offset, uint64_t n, Digest& digest, const std::function<void(uint64_t)>& done,
                      std::string_view what) {
  Scan(
      offset, n,
      [&](const unsigned char* p, std::size_t len, uint64_t) {
        digest.Update(p, len);
        if (done) done(len);
      },
      what);
}

bool PrefetchFile(const Dir& dir, const std::string& name) {
  static const uint64_t budget =
      static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) / 8;
  try {
    const storage::Fd fd = OpenRegularFileAt(dir, name);
    const uint64_t size = FileSize(fd.get(), dir.path() / name);
    ::posix_fadvise(fd.get(), 0, static_cast<off_t>(size <= budget ? size : kReadAhead), POSIX_FADV_WILLNEED);
    return size <= budget;
  } catch (const std::exception&) {
    return false;  // only a hint
  }
}

}  // namespace ckpt::storage
