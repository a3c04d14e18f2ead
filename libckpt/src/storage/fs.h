// storage/fs.h: the file-system seam, the file helpers built on it, and safe opening of
// files named by metadata (FORMAT.md §8). POSIX; errors name the path. The commit
// protocol (§2) itself is storage/commit.h.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/vfs.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::storage {

namespace fs = std::filesystem;

// How Rename treats an existing target.
enum class RenameMode {
  kReplace,    // rename(2): an existing target is replaced
  kNoReplace,  // renameat2(RENAME_NOREPLACE): fails with EEXIST if the target exists
  kExchange,   // renameat2(RENAME_EXCHANGE): the two swap atomically; both must exist
};

// What /proc/self/mountinfo says of one mount: the file-system type as the kernel names it
// ("ext4", "nfs4", "fuse", or "fuse.<subtype>" where the FUSE server names itself, such as
// "fuse.s3fs") and the mount's source ("/dev/vda", "s3fs", "remote:bucket"), octal escapes
// decoded.
struct MountEntry {
  std::string type;
  std::string source;
};

// The seam: every file operation ckpt performs on its own files (not HDF5's internal I/O;
// every system call of the commit protocol and of the leftovers cleaning, storage/commit.h)
// goes through the installed FileSystem, as leveldb's Env. The default is POSIX; tests
// install one that counts operations or fails the N-th with EIO or ENOSPC. Each call
// returns what its system call returns (-1 with errno set on failure); `path` names the
// file an fd-based call works on, for injectors (the kernel never sees it).
// Implementations must be thread-safe: ranks and I/O threads call them concurrently.
class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // openat(2); `dirfd` AT_FDCWD or an open directory that `path` is relative to.
  virtual int Open(const fs::path& path, int flags, mode_t mode, int dirfd = AT_FDCWD);
  virtual ssize_t Pwrite(int fd, const void* buf, std::size_t n, off_t offset, const fs::path& path);
  virtual ssize_t CopyFileRange(int in_fd, loff_t* in_offset, int out_fd, loff_t* out_offset, std::size_t n,
                                const fs::path& out_path);
  virtual int Fsync(int fd, const fs::path& path);  // a file or a directory
  virtual int Close(int fd, const fs::path& path);
  virtual int Rename(const fs::path& from, const fs::path& to, RenameMode mode);
  virtual int Mkdir(const fs::path& path, mode_t mode);
  virtual int Remove(const fs::path& path, bool directory);  // unlink(2) or rmdir(2)
  // flock(2) on `fd`, open on the directory `path` (the commit's lock on a parent).
  virtual int Flock(int fd, int operation, const fs::path& path);
  virtual int Lstat(const fs::path& path, struct stat* st);  // lstat(2)
  // The names in the directory `path` ("." and ".." left out): opendir(3) and readdir(3).
  virtual int ListDir(const fs::path& path, std::vector<std::string>& names);
  // statfs(2): which file system holds `path` (f_type), asked before a commit there.
  virtual int Statfs(const fs::path& path, struct statfs* st);
  // The mount holding `path`: the line of /proc/self/mountinfo whose device is stat(2)'s
  // st_dev of `path` (FindMount); -1 with errno ENOENT where there is none.
  virtual int MountOf(const fs::path& path, MountEntry* entry);
};

// The entry for device `dev` in the text of a mountinfo file (proc(5)); false if none.
bool FindMount(std::string_view mountinfo, dev_t dev, MountEntry* entry);

// The installed file system (POSIX unless a test installed another).
FileSystem& Fs();
// Installs `fs` for the whole process (nullptr: POSIX again) and returns the previous
// one; the caller keeps `fs` alive while installed. For tests.
FileSystem* SetFileSystem(FileSystem* fs);

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

// A directory opened once (O_DIRECTORY), so that every file of a checkpoint is opened
// relative to the same directory even if the path is renamed meanwhile: a reader that
// opens metadata.json and every shard through one Dir reads one checkpoint, never a mix,
// however often another process replaces it (the commit renames a new directory over the
// path, FORMAT.md §2; the files a reader has open stay readable after they are removed).
// What it cannot do is open a file that the replacing commit has removed meanwhile from
// the old directory: OpenRegularFileAt then throws kChanged ("changed while reading").
// `path` is what error messages name. Copies share the descriptor.
class Dir {
 public:
  Dir() = default;
  // Opens `path`; kNotFound if it does not exist, kIO naming it otherwise.
  static Dir Open(const fs::path& path);
  int fd() const { return fd_ ? fd_->get() : AT_FDCWD; }
  const fs::path& path() const { return path_; }
  explicit operator bool() const { return fd_ != nullptr; }
  // Whether path() no longer names the directory opened: another directory was renamed
  // over it (a checkpoint replaced), or it was renamed away or removed. False for a Dir
  // that is not open.
  bool Replaced() const;
  // kChanged naming path(): the checkpoint was replaced or removed while it was read;
  // `what` says what was found missing.
  [[noreturn]] void ThrowChanged(const std::string& what) const;

 private:
  std::shared_ptr<const Fd> fd_;
  fs::path path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

// Opens `path` for reading only if it is a regular file (not a symlink, FIFO or device).
// kFollow is for a file the user named (a command-line argument: a symlink to it, such as
// a Hugging Face cache entry, is followed); files a checkpoint names use kRefuse.
enum class Symlinks { kRefuse, kFollow };
Fd OpenRegularFile(const fs::path& path, Symlinks symlinks = Symlinks::kRefuse);
// The same for `name` inside `dir` (openat), errors naming dir.path() / name; kChanged
// (not kNotFound) when `name` is missing because `dir` was replaced or removed meanwhile.
Fd OpenRegularFileAt(const Dir& dir, const std::string& name);
// A path by which other code (HDF5) can open the very file `fd` is open on:
// "/proc/self/fd/<fd>".
std::string ProcPath(int fd);
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

 private:
  void* base_ = nullptr;
  std::size_t map_len_ = 0;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
  uint64_t offset_ = 0;
  fs::path path_;
};

// Reads of a file with O_DIRECT: the disk's DMA lands in this process's memory, and no page
// cache page is allocated, filled or copied from. For a checkpoint read once (a cold load),
// that is the kernel's copy and its page-cache upkeep saved: on the benchmark's VM, whose host
// takes freed memory back, a buffered cold read of 1.49 GB cost 1.4-3.4 s of CPU (allocating
// page-cache pages the host must fault back in), four O_DIRECT streams 0.05 s and 0.8 s of
// wall time. Reads whose destination or range is not aligned as the file system requires
// (statx's STATX_DIOALIGN, else 4096) go through aligned scratch buffers, copied out with
// non-temporal stores (the destination is not pulled into the cache only to be evicted).
// A read is cut into slices of 4 MiB; slices k + 1 and k + 2 are read (on helper threads)
// while slice k is copied out and handed to the caller's sink, so the disk and the CPU overlap.
class DirectReader {
 public:
  enum class Policy {
    kAuto,    // direct on a local disk's file system (OnLocalDiskFileSystem) unless most of
              // the file is in the page cache (then buffered is a memcpy)
    kAlways,  // direct wherever the file system allows it
  };
  // sink(piece, length, position): every byte of a read, in order, one piece at a time,
  // once it is in the destination; `piece` is where the bytes are hottest in the cache (the
  // scratch buffer they were copied from, pieces of 256 KiB then; else the destination).
  // Pieces split the read anywhere. An exception from the sink propagates (the rest of the
  // destination is then unspecified).
  using Sink = std::function<void(const unsigned char*, std::size_t, std::size_t)>;
  // A reader over the file `fd` is open on, or nullptr where the file system has no direct
  // I/O (some FUSE file systems) or, under kAuto, is not a local disk's or the page cache
  // holds most of the file.
  static std::unique_ptr<DirectReader> Open(int fd, const fs::path& path, Policy policy);
  ~DirectReader();
  DirectReader(const DirectReader&) = delete;
  DirectReader& operator=(const DirectReader&) = delete;
  // Exactly n bytes at `offset` into `to` (any alignment), each handed to `sink` where
  // given; kIO naming the path, or kCorrupt for a read past the end of the file, as
  // ReadExact. A file system that refuses a direct read it accepted to open (EINVAL) is read
  // buffered from then on; so is the rest of a read the kernel cut short.
  void Read(void* to, std::size_t n, uint64_t offset, const Sink& sink = {});
  uint64_t bytes() const { return bytes_; }  // read directly so far

 private:
  struct Slice;
  DirectReader(Fd fd, int buffered_fd, fs::path path, std::size_t mem_align, std::size_t off_align);
  // The next slice of a read: of the `n` bytes at `offset` to `out`, straight into `out`
  // where both are aligned, else into the scratch buffer after the last one used.
  Slice Plan(unsigned char* out, std::size_t n, uint64_t offset);
  // The slice's aligned read: bytes read, or -errno.
  ssize_t ReadAligned(const Slice& s) const;

  Fd fd_;
  int buffered_fd_;  // the caller's descriptor, for the fallback
  fs::path path_;
  std::size_t mem_align_, off_align_;
  // The slices read ahead (2) and the one handed over; allocated when first needed.
  static constexpr int kScratchBuffers = 3;
  unsigned char* scratch_[kScratchBuffers] = {};
  int next_scratch_ = 0;
  bool refused_ = false;
  uint64_t bytes_ = 0;
};

// The fraction of [offset, offset + n) of the file `fd` is open on that is in the page cache
// (mincore over a read-only mapping); 0 where it cannot be told.
double CachedFraction(int fd, uint64_t offset, uint64_t n);

// Whether `fd`'s file lies on a local disk's file system whose O_DIRECT reads are the disk's
// DMA into the caller's memory (ext2/3/4, XFS, btrfs, f2fs, ZFS): where kAuto reads direct.
bool OnLocalDiskFileSystem(int fd);

// Copies n bytes from `in_fd` at `in_offset` to `out_fd` at `out_offset` inside the kernel
// (copy_file_range: a reflink or an in-kernel copy, never through user memory), falling
// back to pread/pwrite through a 1 MiB buffer where the file systems cannot. kIO naming
// the paths; kCorrupt if the input ends early.
void CopyRange(int in_fd, uint64_t in_offset, int out_fd, uint64_t out_offset, std::size_t n,
               const fs::path& in_path, const fs::path& out_path);

// Starts writeback of a written range without waiting for it, so the final fsync finds
// most of the file on disk already (best effort; errors surface at that fsync).
void StartWriteback(int fd, uint64_t offset, uint64_t n);

// Opens a file through the seam; kIO naming `path` (kNotFound if it does not exist).
Fd OpenFile(const fs::path& path, int flags, mode_t mode = 0644);

void FsyncFd(int fd, const fs::path& path);
void FsyncPath(const fs::path& path);  // a file or a directory
// The directory holding `path` ("." for a bare name).
fs::path ParentOf(const fs::path& path);
// mkdir -p through the seam; kIO naming the directory that could not be made.
void MakeDirs(const fs::path& path);

// Reads a whole small file, refusing more than `max_bytes`.
std::string ReadFileLimited(const fs::path& path, uint64_t max_bytes, Symlinks symlinks = Symlinks::kRefuse);
// The same for `name` inside `dir`, errors naming dir.path() / name.
std::string ReadFileLimitedAt(const Dir& dir, const std::string& name, uint64_t max_bytes);
// Writes `path` with `data` and fsyncs it.
void WriteFileSynced(const fs::path& path, std::string_view data);

// A unique sibling of `target`: "<parent>/.<name><infix><16 hex digits>".
fs::path SiblingPath(const fs::path& target, std::string_view infix);

// Recursive removal through the seam (never throws; what cannot be removed stays).
void RemoveAllQuietly(const fs::path& path);

}  // namespace ckpt::storage
