// Helpers shared by the test binaries: scratch directories and deterministic data.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <unistd.h>
#include <vector>

namespace ckpt_test {

// A fresh directory under $CKPT_TEST_TMP (or the system temp dir), removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "t") {
    const char* base = std::getenv("CKPT_TEST_TMP");
    std::filesystem::path root = base ? base : std::filesystem::temp_directory_path();
    std::filesystem::create_directories(root);
    std::random_device rd;
    for (int attempt = 0;; ++attempt) {
      path_ = root / (tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
      if (std::filesystem::create_directory(path_)) break;
    }
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// `n` bytes of deterministic pseudo-random data.
inline std::vector<uint8_t> RandomBytes(std::size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> out(n);
  for (std::size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    for (std::size_t j = 0; j < 8 && i + j < n; ++j) out[i + j] = static_cast<uint8_t>(v >> (8 * j));
  }
  return out;
}

}  // namespace ckpt_test
