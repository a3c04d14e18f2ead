// ops/util.h (internal): helpers shared by the tools' library: splitting boxes into memory-bounded blocks, glob matching, number
// formatting, a terminal progress line and small file helpers.
//
// Thread-safety: free functions are reentrant; a Progress belongs to one thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/tensor.h"

namespace ckpt::ops::detail {

// Block size for streaming tensor data: small enough that a block just read is still
// in the CPU cache when it is written or compared (measured: 2x faster than 128 MiB).
inline constexpr uint64_t kCacheBlockBytes = uint64_t{16} << 20;

// A byte buffer that grows without zero-filling or copying its old contents.
class Buffer {
 public:
  uint8_t* Get(std::size_t n) {
    if (n > size_) {
      data_.reset(new uint8_t[n]);
      size_ = n;
    }
    return data_.get();
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  std::size_t size_ = 0;
};

// fnmatch(3) without flags (C locale): '*' matches dots too ("optimizer.*"); '?', [...],
// [!...], [:class:] and backslash escapes. No recursion; time O(pattern x text) at worst.
bool GlobMatch(std::string_view pattern, std::string_view text);
bool MatchesAny(const std::vector<std::string>& patterns, std::string_view text);

// "1.50 GiB", "512 B".
std::string FormatBytes(double bytes);
// "[768, 2304]", "[]" for a scalar.
std::string FormatShape(const Shape& shape);
// Shortest round-trip text of a double ("nan", "inf" spelled out).
std::string FormatDouble(double v);

// Logical bytes of a tensor; throws kCorrupt naming `what` on overflow or a negative extent.
uint64_t TensorBytes(const Shape& shape, std::size_t itemsize, std::string_view what);

// A progress line on stderr ("\r  1.20 GiB / 1.50 GiB  850 MiB/s  ETA 0:01"), drawn only
// when stderr is a terminal and `enabled`; at most five times a second; erased by Done().
class Progress {
 public:
  Progress(std::string label, uint64_t total, bool enabled);
  ~Progress();
  void Add(uint64_t bytes);
  void Done();

 private:
  void Draw(bool force);
  std::string label_;
  uint64_t total_, done_ = 0;
  bool active_;
  std::chrono::steady_clock::time_point start_, last_;
};

// Reads a whole small file the user named (a command-line argument: a symlink to it is
// followed; a FIFO, device or directory is kCorrupt), refusing more than `max_bytes` before
// reading any (kCorrupt). Files a checkpoint names are read by libckpt, which refuses
// symlinks too.
std::string ReadFileText(const std::filesystem::path& path, uint64_t max_bytes = uint64_t{256} << 20);

// Starts `count` threads running fn(0) .. fn(count - 1); a thread the system refuses to
// start is left out (the work then runs on fewer threads, never a crash), so the caller
// writes its work to finish on however many started, its own thread included. Destroying
// the result joins them.
std::vector<std::jthread> StartThreads(std::size_t count, const std::function<void(std::size_t)>& fn);

}  // namespace ckpt::ops::detail
