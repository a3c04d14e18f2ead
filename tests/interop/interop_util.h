// interop_util.h: helpers shared by the interop programs (write_corpus, read_golden):
// row-major box extraction from a global tensor, uneven splits, whole-file I/O.
// Plain functions, no state; safe from any thread.
#pragma once

#include <ckpt/tensor.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ckpt_interop {

// Copies `box` of a row-major global tensor of `shape` into a dense row-major buffer.
inline std::vector<uint8_t> ExtractBox(const std::vector<uint8_t>& global, const ckpt::Shape& shape,
                                       const ckpt::Box& box, std::size_t item) {
  const auto n = static_cast<std::size_t>(box.NumElements());
  std::vector<uint8_t> out(n * item);
  const std::size_t rank = shape.size();
  std::vector<int64_t> idx(rank, 0);
  for (std::size_t e = 0; e < n; ++e) {
    std::size_t flat = 0;
    for (std::size_t d = 0; d < rank; ++d)
      flat = flat * static_cast<std::size_t>(shape[d]) + static_cast<std::size_t>(box.offsets[d] + idx[d]);
    std::memcpy(&out[e * item], &global[flat * item], item);
    for (std::size_t d = rank; d-- > 0;) {
      if (++idx[d] < box.sizes[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Splits [0, n) into `parts` deliberately uneven ranges (part p gets about (p+1) shares):
// {begin, count} per part; early parts may be empty.
inline std::vector<std::pair<int64_t, int64_t>> UnevenSplit(int64_t n, int parts) {
  const int64_t shares = static_cast<int64_t>(parts) * (parts + 1) / 2;
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  int64_t acc = 0;
  for (int p = 0; p < parts; ++p) {
    acc += p + 1;
    const int64_t end = (p == parts - 1) ? n : n * acc / shares;
    out.emplace_back(begin, end - begin);
    begin = end;
  }
  return out;
}

inline void WriteFile(const std::filesystem::path& path, const void* data, std::size_t n) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot create " + path.string());
  const bool ok = (n == 0 || std::fwrite(data, 1, n, f) == n);
  if (std::fclose(f) != 0 || !ok) throw std::runtime_error("cannot write " + path.string());
}

inline std::vector<uint8_t> ReadFile(const std::filesystem::path& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path.string());
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  const bool bad = std::ferror(f) != 0;
  std::fclose(f);
  if (bad) throw std::runtime_error("cannot read " + path.string());
  return out;
}

}  // namespace ckpt_interop
