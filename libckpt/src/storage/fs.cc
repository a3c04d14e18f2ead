// storage/fs.cc
#include "storage/fs.h"

#include <fcntl.h>
#include <dirent.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <future>
#include <iterator>
#include <random>
#include <vector>

#include "ckpt/error.h"
#include "storage/commit.h"
#include "storage/pool.h"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace ckpt::storage {
namespace {

[[noreturn]] void Fail(const fs::path& path, const std::string& what, int err) {
  throw Error(ErrorCode::kIO, path.string() + ": " + what + ": " + std::strerror(err));
}

// Never destroyed: files may still be closed during static destruction.
FileSystem& Posix() {
  static FileSystem* posix = new FileSystem();
  return *posix;
}
std::atomic<FileSystem*> g_fs{nullptr};

}  // namespace

int FileSystem::Open(const fs::path& path, int flags, mode_t mode, int dirfd) {
  return ::openat(dirfd, path.c_str(), flags, mode);
}
ssize_t FileSystem::Pwrite(int fd, const void* buf, std::size_t n, off_t offset, const fs::path&) {
  return ::pwrite(fd, buf, n, offset);
}
ssize_t FileSystem::CopyFileRange(int in_fd, loff_t* in_offset, int out_fd, loff_t* out_offset, std::size_t n,
                                  const fs::path&) {
  return ::copy_file_range(in_fd, in_offset, out_fd, out_offset, n, 0);
}
int FileSystem::Fsync(int fd, const fs::path&) { return ::fsync(fd); }
int FileSystem::Close(int fd, const fs::path&) { return ::close(fd); }
int FileSystem::Rename(const fs::path& from, const fs::path& to, RenameMode mode) {
  if (mode == RenameMode::kReplace) return ::rename(from.c_str(), to.c_str());
  const unsigned flags = mode == RenameMode::kExchange ? RENAME_EXCHANGE : RENAME_NOREPLACE;
  return static_cast<int>(::syscall(SYS_renameat2, AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), flags));
}
int FileSystem::Mkdir(const fs::path& path, mode_t mode) { return ::mkdir(path.c_str(), mode); }
int FileSystem::Remove(const fs::path& path, bool directory) {
  return directory ? ::rmdir(path.c_str()) : ::unlink(path.c_str());
}
int FileSystem::Flock(int fd, int operation, const fs::path&) { return ::flock(fd, operation); }
int FileSystem::Lstat(const fs::path& path, struct stat* st) { return ::lstat(path.c_str(), st); }
int FileSystem::ListDir(const fs::path& path, std::vector<std::string>& names) {
  DIR* d = ::opendir(path.c_str());
  if (!d) return -1;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view n = e->d_name;
    if (n != "." && n != "..") names.emplace_back(n);
    errno = 0;
  }
  const int err = errno;
  ::closedir(d);
  errno = err;
  return err ? -1 : 0;
}

int FileSystem::Statfs(const fs::path& path, struct statfs* st) { return ::statfs(path.c_str(), st); }
int FileSystem::MountOf(const fs::path& path, MountEntry* entry) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return -1;
  std::ifstream in("/proc/self/mountinfo");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (FindMount(text, st.st_dev, entry)) return 0;
  errno = ENOENT;
  return -1;
}

namespace {

// A mountinfo field with its octal escapes ("\040" for a space) decoded.
std::string Unescape(std::string_view field) {
  std::string out;
  for (std::size_t i = 0; i < field.size(); ++i) {
    const auto octal = [&](std::size_t k) { return field[k] >= '0' && field[k] <= '7'; };
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 + (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

}  // namespace

bool FindMount(std::string_view mountinfo, dev_t dev, MountEntry* entry) {
  // "36 35 98:0 /root /mnt rw,noatime master:1 - ext3 /dev/root rw": ID, parent ID,
  // major:minor, root, mount point, options, optional fields, "-", type, source, options.
  const std::string want = std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
  while (!mountinfo.empty()) {
    const std::size_t eol = mountinfo.find('\n');
    const std::string_view line = mountinfo.substr(0, eol);
    mountinfo = eol == std::string_view::npos ? std::string_view() : mountinfo.substr(eol + 1);
    std::vector<std::string_view> f;
    for (std::size_t at = 0; at <= line.size();) {
      const std::size_t sp = std::min(line.find(' ', at), line.size());
      if (sp > at) f.push_back(line.substr(at, sp - at));
      at = sp + 1;
    }
    if (f.size() < 3 || f[2] != want) continue;
    const auto dash = std::find(f.begin() + std::min<std::ptrdiff_t>(6, static_cast<std::ptrdiff_t>(f.size())), f.end(), "-");
    if (f.end() - dash < 3) continue;
    entry->type = Unescape(dash[1]);
    entry->source = Unescape(dash[2]);
    return true;
  }
  return false;
}

FileSystem& Fs() {
  FileSystem* fs = g_fs.load(std::memory_order_acquire);
  return fs ? *fs : Posix();
}

FileSystem* SetFileSystem(FileSystem* fs) {
  FileSystem* prev = g_fs.exchange(fs, std::memory_order_acq_rel);
  return prev ? prev : &Posix();
}

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) Fs().Close(fd_, {});
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) Fs().Close(fd_, {});
}

void Fd::Close(const fs::path& path) {
  if (fd_ < 0) return;
  const int r = Fs().Close(fd_, path);
  fd_ = -1;
  if (r != 0) Fail(path, "close", errno);
}

Dir Dir::Open(const fs::path& path) {
  const int fd = Fs().Open(path.empty() ? fs::path(".") : path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) throw Error(ErrorCode::kNotFound, path.string() + ": no such checkpoint");
    if (err == ENOTDIR) throw Error(ErrorCode::kNotFound, path.string() + ": not a directory");
    Fail(path, "open directory", err);
  }
  Dir d;
  d.fd_ = std::make_shared<const Fd>(fd);
  d.path_ = path;
  struct stat st;
  if (::fstat(fd, &st) != 0) Fail(path, "fstat", errno);
  d.dev_ = st.st_dev;
  d.ino_ = st.st_ino;
  return d;
}

bool Dir::Replaced() const {
  if (!fd_) return false;
  struct stat st;
  if (::stat((path_.empty() ? fs::path(".") : path_).c_str(), &st) != 0) return true;  // removed, or renamed away
  return st.st_dev != dev_ || st.st_ino != ino_;
}

void Dir::ThrowChanged(const std::string& what) const {
  throw Error(ErrorCode::kChanged, path_.string() +
                                       ": changed while reading: the checkpoint was replaced or removed by another "
                                       "process after this reader opened it (" + what + "); read it again");
}

namespace {

Fd OpenRegular(int dirfd, const fs::path& name, const fs::path& shown, Symlinks symlinks = Symlinks::kRefuse) {
  const int nofollow = symlinks == Symlinks::kRefuse ? O_NOFOLLOW : 0;
  const int fd = Fs().Open(name, O_RDONLY | O_CLOEXEC | nofollow | O_NONBLOCK, 0, dirfd);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) throw Error(ErrorCode::kNotFound, shown.string() + ": no such file");
    if (err == ELOOP) throw Error(ErrorCode::kCorrupt, shown.string() + ": is a symbolic link, refusing to follow it");
    Fail(shown, "open", err);
  }
  Fd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) Fail(shown, "fstat", errno);
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kCorrupt, shown.string() + ": not a regular file");
  }
  // O_NONBLOCK only kept a FIFO from blocking the open; clear it for normal reads.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return owned;
}

}  // namespace

Fd OpenRegularFile(const fs::path& path, Symlinks symlinks) { return OpenRegular(AT_FDCWD, path, path, symlinks); }

Fd OpenRegularFileAt(const Dir& dir, const std::string& name) {
  try {
    return OpenRegular(dir.fd(), name, dir.path() / name);
  } catch (const Error& e) {
    // The commit that replaces a checkpoint removes the old one's files once the new one is
    // in place: a file missing from a directory no longer at its path is no damage.
    if (e.code() == ErrorCode::kNotFound && dir.Replaced()) dir.ThrowChanged(name + " is gone");
    throw;
  }
}

std::string ProcPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

Fd OpenFile(const fs::path& path, int flags, mode_t mode) {
  const int fd = Fs().Open(path, flags | O_CLOEXEC, mode);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT && !(flags & O_CREAT)) throw Error(ErrorCode::kNotFound, path.string() + ": no such file");
    Fail(path, flags & O_CREAT ? "create" : "open", err);
  }
  return Fd(fd);
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

namespace {

constexpr std::size_t kDirectSlice = std::size_t{4} << 20;  // read at a time (one request here)
// Slices read ahead of the one being handed over: two, as the kernel's own read-ahead keeps
// about two requests in flight; one left the disk idle between requests (ckpt-bench-readers).
constexpr std::size_t kDirectDepth = 2;

// Copies n bytes with non-temporal stores where the CPU has them (SSE2), then fences: for
// large copies the caller does not read back soon (the destination is not pulled into the
// cache only to be evicted). Any alignment.
void CopyStreaming(void* to, const void* from, std::size_t n) {
  auto* d = static_cast<unsigned char*>(to);
  const auto* s = static_cast<const unsigned char*>(from);
#if defined(__SSE2__)
  constexpr std::size_t kLine = 64;
  if (n >= 4 * kLine) {
    const std::size_t head = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= kLine; n -= kLine, d += kLine, s += kLine) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
    }
    _mm_sfence();  // streamed stores are weakly ordered: visible before whatever follows
  }
#endif
  std::memcpy(d, s, n);
}

// The alignment direct I/O on `fd`'s file needs of memory and of offsets and lengths: {0, 0}
// where the file system has none, {4096, 4096} where the kernel does not say.
std::pair<std::size_t, std::size_t> DirectAlignment(int fd) {
#if defined(STATX_DIOALIGN)
  struct statx st {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &st) == 0 && (st.stx_mask & STATX_DIOALIGN))
    return {st.stx_dio_mem_align, st.stx_dio_offset_align};
#else
  (void)fd;
#endif
  return {4096, 4096};
}

}  // namespace

double CachedFraction(int fd, uint64_t offset, uint64_t n) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  constexpr uint64_t kSpan = uint64_t{1} << 30;  // mapped and asked about at a time
  if (n == 0) return 0;
  const uint64_t start = offset - offset % page, end = offset + n;
  std::vector<unsigned char> resident;
  uint64_t pages = 0, in = 0;
  for (uint64_t at = start; at < end; at += kSpan) {
    const auto len = static_cast<std::size_t>(std::min(kSpan, end - at));
    void* base = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(at));
    if (base == MAP_FAILED) return 0;
    resident.resize((len + page - 1) / page);
    const bool ok = ::mincore(base, len, resident.data()) == 0;
    ::munmap(base, len);
    if (!ok) return 0;
    for (unsigned char r : resident) in += r & 1;
    pages += resident.size();
  }
  return static_cast<double>(in) / static_cast<double>(pages);
}

bool OnLocalDiskFileSystem(int fd) {
  struct statfs st {};
  if (::fstatfs(fd, &st) != 0) return false;
  // ext2/3/4, XFS, btrfs, f2fs, ZFS: their O_DIRECT is the disk's DMA into the caller's
  // memory. Elsewhere it may be a copy all the same (tmpfs), skip the client's read-ahead
  // and caching (NFS, Lustre, GPFS, CephFS) or be whatever a FUSE server makes of it.
  switch (static_cast<uint64_t>(st.f_type)) {
    case 0xEF53:      // ext2/3/4
    case 0x58465342:  // XFS
    case 0x9123683E:  // btrfs
    case 0xF2F52010:  // f2fs
    case 0x2FC12FC1:  // ZFS
      return true;
    default:
      return false;
  }
}

std::unique_ptr<DirectReader> DirectReader::Open(int fd, const fs::path& path, Policy policy) {
  const auto [mem_align, off_align] = DirectAlignment(fd);
  if (mem_align == 0 || off_align == 0 || (mem_align & (mem_align - 1)) || (off_align & (off_align - 1)))
    return nullptr;
  if (policy == Policy::kAuto &&
      (!OnLocalDiskFileSystem(fd) || CachedFraction(fd, 0, FileSize(fd, path)) > 0.5))
    return nullptr;
  const int direct = Fs().Open(ProcPath(fd), O_RDONLY | O_DIRECT | O_CLOEXEC, 0);
  if (direct < 0) return nullptr;  // EINVAL: no direct I/O here; anything else: read buffered
  return std::unique_ptr<DirectReader>(new DirectReader(Fd(direct), fd, path, mem_align, off_align));
}

DirectReader::DirectReader(Fd fd, int buffered_fd, fs::path path, std::size_t mem_align, std::size_t off_align)
    : fd_(std::move(fd)), buffered_fd_(buffered_fd), path_(std::move(path)), mem_align_(mem_align),
      off_align_(off_align) {}

DirectReader::~DirectReader() {
  for (unsigned char* p : scratch_) std::free(p);
}

// One aligned read and what of the request it carries: `take` bytes of it from `skip` bytes
// into the `want` bytes read at `from` into `into` (the destination itself when skip is 0
// and `into` is where they go).
struct DirectReader::Slice {
  unsigned char* into;
  uint64_t from;
  std::size_t want, skip, take;
};

DirectReader::Slice DirectReader::Plan(unsigned char* out, std::size_t n, uint64_t offset) {
  const std::size_t whole = n / off_align_ * off_align_;
  if (whole > 0 && reinterpret_cast<uintptr_t>(out) % mem_align_ == 0 && offset % off_align_ == 0) {
    const std::size_t take = std::min(whole, kDirectSlice);
    return {out, offset, take, 0, take};
  }
  static_assert(kScratchBuffers >= kDirectDepth + 1, "a buffer per slice in flight and one handed over");
  unsigned char*& scratch = scratch_[next_scratch_];
  next_scratch_ = (next_scratch_ + 1) % kScratchBuffers;  // in order: slices in flight never share one
  if (!scratch) {
    const std::size_t align = std::max<std::size_t>({mem_align_, off_align_, alignof(std::max_align_t)});
    const std::size_t size = (kDirectSlice + 2 * off_align_ + align - 1) / align * align;
    scratch = static_cast<unsigned char*>(std::aligned_alloc(align, size));
    if (!scratch) throw std::bad_alloc();
  }
  const uint64_t from = offset - offset % off_align_;
  const auto skip = static_cast<std::size_t>(offset - from);
  const std::size_t take = std::min(n, kDirectSlice);
  return {scratch, from, (skip + take + off_align_ - 1) / off_align_ * off_align_, skip, take};
}

ssize_t DirectReader::ReadAligned(const Slice& s) const {
  std::size_t got = 0;
  while (got < s.want) {  // a short read is asked again for the rest, until the end of the file
    const ssize_t r = ::pread(fd_.get(), s.into + got, s.want - got, static_cast<off_t>(s.from + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0 || (s.from + got + static_cast<std::size_t>(r)) % off_align_ != 0) {
      return static_cast<ssize_t>(got + static_cast<std::size_t>(r));  // the end, or mid-unit
    }
    got += static_cast<std::size_t>(r);
  }
  return static_cast<ssize_t>(got);
}

void DirectReader::Read(void* to, std::size_t n, uint64_t offset, const Sink& sink) {
  constexpr std::size_t kPiece = std::size_t{256} << 10;  // copied out, then handed on, in cache
  auto* out = static_cast<unsigned char*>(to);
  std::size_t pos = 0;      // bytes in the destination and handed to the sink
  std::size_t planned = 0;  // bytes of the read asked for so far
  struct InFlight {
    Slice slice;
    std::future<ssize_t> got;
  };
  std::deque<InFlight> reads;  // in order; their futures wait for the reads if this throws
  auto fill = [&] {
    while (reads.size() < kDirectDepth && planned < n) {
      const Slice s = Plan(out + planned, n - planned, offset + planned);
      planned += s.take;
      reads.push_back({s, AsyncOrDeferred([this](const Slice& x) { return ReadAligned(x); }, s)});
    }
  };
  if (!refused_) fill();
  while (!reads.empty()) {
    const Slice cur = reads.front().slice;
    const ssize_t got = reads.front().got.get();
    reads.pop_front();
    if (got == -EINVAL) {  // the file system refuses after all: buffered from now on
      refused_ = true;
      break;
    }
    if (got < 0) Fail(path_, "read at offset " + std::to_string(offset + pos), static_cast<int>(-got));
    if (static_cast<std::size_t>(got) <= cur.skip) {
      throw Error(ErrorCode::kCorrupt, path_.string() + ": unexpected end of file at offset " +
                                           std::to_string(offset + pos) + " (truncated?)");
    }
    const std::size_t done = std::min(static_cast<std::size_t>(got) - cur.skip, cur.take);
    // The next slices are read while this one is copied out and handed on; a short one (the
    // end of the file, or a kernel that stopped mid-unit) ends the direct part of the read.
    if (done == cur.take) fill();
    if (cur.into == out + pos) {
      if (sink) sink(out + pos, done, pos);
    } else {
      for (std::size_t k = 0; k < done; k += kPiece) {
        const std::size_t len = std::min(kPiece, done - k);
        const unsigned char* piece = cur.into + cur.skip + k;
        CopyStreaming(out + pos + k, piece, len);
        if (sink) sink(piece, len, pos + k);
      }
    }
    pos += done;
    bytes_ += done;
    if (done < cur.take) break;
  }
  for (InFlight& r : reads) r.got.wait();  // read past a short one: discarded
  if (pos < n) {
    ReadExact(buffered_fd_, out + pos, n - pos, offset + pos, path_);
    if (sink) sink(out + pos, n - pos, pos);
  }
}

void WriteExact(int fd, const void* buf, std::size_t n, uint64_t offset, const fs::path& path) {
  auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t put = Fs().Pwrite(fd, p, n, static_cast<off_t>(offset), path);
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

void CopyRange(int in_fd, uint64_t in_offset, int out_fd, uint64_t out_offset, std::size_t n,
               const fs::path& in_path, const fs::path& out_path) {
  auto in = static_cast<loff_t>(in_offset), out = static_cast<loff_t>(out_offset);
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = Fs().CopyFileRange(in_fd, &in, out_fd, &out, n - done, out_path);
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
  if (Fs().Fsync(fd, path) != 0) Fail(path, "fsync", errno);
}

void FsyncPath(const fs::path& path) {
  Fd fd = OpenFile(path, O_RDONLY);
  FsyncFd(fd.get(), path);
}

fs::path ParentOf(const fs::path& path) {
  fs::path t = path;
  if (!t.has_filename()) t = t.parent_path();
  fs::path parent = t.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

void MakeDirs(const fs::path& path) {
  if (path.empty()) return;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return;
    Fail(path, "cannot create directory", ENOTDIR);
  }
  const fs::path parent = path.has_filename() ? path.parent_path() : path.parent_path().parent_path();
  if (!parent.empty() && parent != path) MakeDirs(parent);
  if (Fs().Mkdir(path, 0755) != 0 && errno != EEXIST) Fail(path, "cannot create directory", errno);
}

namespace {

std::string ReadLimited(Fd fd, const fs::path& path, uint64_t max_bytes) {
  const uint64_t size = FileSize(fd.get(), path);
  if (size > max_bytes) {
    throw Error(ErrorCode::kCorrupt, path.string() + ": " + std::to_string(size) +
                                         " bytes exceeds the limit of " + std::to_string(max_bytes));
  }
  std::string data(size, '\0');
  ReadExact(fd.get(), data.data(), size, 0, path);
  return data;
}

}  // namespace

std::string ReadFileLimited(const fs::path& path, uint64_t max_bytes, Symlinks symlinks) {
  return ReadLimited(OpenRegularFile(path, symlinks), path, max_bytes);
}

std::string ReadFileLimitedAt(const Dir& dir, const std::string& name, uint64_t max_bytes) {
  return ReadLimited(OpenRegularFileAt(dir, name), dir.path() / name, max_bytes);
}

void WriteFileSynced(const fs::path& path, std::string_view data) {
  Fd fd = OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  WriteExact(fd.get(), data.data(), data.size(), 0, path);
  FsyncFd(fd.get(), path);
  fd.Close(path);
}

fs::path SiblingPath(const fs::path& target, std::string_view infix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  fs::path t = target;
  if (!t.has_filename()) t = t.parent_path();
  char suffix[17];
  std::snprintf(suffix, sizeof suffix, "%016llx", static_cast<unsigned long long>(rng()));
  return ParentOf(t) / ("." + t.filename().string() + std::string(infix) + suffix);
}

void RemoveAllQuietly(const fs::path& path) {
  if (!ReleaseStaging(path)) return;  // holds the previous content of a failed commit
  struct stat st;
  if (Fs().Lstat(path, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    std::vector<std::string> children;
    Fs().ListDir(path, children);  // what it could list (then rmdir fails: the rest stays)
    for (const std::string& c : children) RemoveAllQuietly(path / c);
  }
  Fs().Remove(path, S_ISDIR(st.st_mode));
}

}  // namespace ckpt::storage
