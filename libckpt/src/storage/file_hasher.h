// storage/file_hasher.h: the one path by which stored bytes are hashed straight from a
// file (ckpt-verify's data threads, a reader's VerifyChunk for load, merge and diff, and
// the chunks a checkpoint writer copies file to file).
// Small ranges are read a piece at a time into a buffer that stays in the CPU's cache;
// larger ones are hashed from the page cache's own pages, mapped a window at a time and
// populated in one call (no copy). The kernel is asked to fetch ahead of what is hashed,
// so a cold disk stays busy.
//
// Threading: one FileHasher per thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string_view>
#include <vector>

#include "storage/digest.h"
#include "storage/fs.h"

namespace ckpt::storage {

class FileHasher {
 public:
  // Hashes from the file `name` inside the open directory `dir` (a regular file only),
  // opened on first use (OpenRegularFileAt: kChanged where `dir` was replaced meanwhile).
  FileHasher(const Dir& dir, const std::string& name);
  // Hashes from the open `fd` (not owned; it must outlive the hasher), named `path`.
  FileHasher(int fd, std::filesystem::path path);
  FileHasher(const FileHasher&) = delete;
  FileHasher& operator=(const FileHasher&) = delete;

  // Hands the `n` bytes at `offset` to `consume(data, length, position)` piece by piece,
  // in order (position counted from `offset`); a piece is valid during the call only.
  // kCorrupt where the file ends early (it shrank since its datasets were checked): for
  // mapped pages the message starts with `what` when given.
  using Consumer = std::function<void(const unsigned char*, std::size_t, uint64_t)>;
  void Scan(uint64_t offset, uint64_t n, const Consumer& consume, std::string_view what = {});
  // Scan feeding `digest`, calling `done(bytes)` as pieces are hashed.
  void Hash(uint64_t offset, uint64_t n, Digest& digest, const std::function<void(uint64_t)>& done = {},
            std::string_view what = {});

 private:
  int Fd();
  // Asks for [from, until + kReadAhead) once `until` comes within half of it.
  void Advise(uint64_t from, uint64_t until);

  std::filesystem::path path_;
  Dir dir_;  // where `name_` is opened on first use, if no fd was given
  std::string name_;
  storage::Fd owned_;
  int fd_ = -1;
  uint64_t advised_ = 0;  // the kernel was asked to fetch the file up to here
  std::vector<unsigned char> buf_;
};

// Asks the kernel to read the file `name` inside `dir` into the page cache in the
// background: whole when it is small enough to stay there until it is read (an eighth of
// the memory; returns true), else its first window. Only a hint: false on any error.
bool PrefetchFile(const Dir& dir, const std::string& name);

}  // namespace ckpt::storage
