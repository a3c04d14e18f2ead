// Helpers of the device tests (tests/unit/device_test.cc with a fake backend, tests/cuda on a
// GPU): tensors of deterministic bytes, the code and message of an Error, and a check that
// two checkpoints hold the same chunks.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/ckpt.h"
#include "test_util.h"

namespace ckpt_test {

struct TensorBytes {
  std::string key;
  ckpt::DType dtype;
  ckpt::Shape shape;
  std::vector<uint8_t> bytes;
};

inline TensorBytes MakeTensorBytes(std::string key, ckpt::DType dtype, ckpt::Shape shape, uint64_t seed) {
  const auto n = static_cast<std::size_t>(ckpt::NumElements(shape)) * ckpt::DTypeSize(dtype);
  return TensorBytes{std::move(key), dtype, std::move(shape), RandomBytes(n, seed)};
}

// The code and message of the ckpt::Error fn throws; kInternal and "no error" if none.
inline std::pair<ckpt::ErrorCode, std::string> ErrorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ckpt::Error& e) {
    return {e.code(), e.what()};
  }
  return {ckpt::ErrorCode::kInternal, "no error"};
}

// Equal to rounding, or both NaN (no finite element; random float64 bits overflowing).
inline bool Close(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == doctest::Approx(b); }

// Every chunk of `a` is in `b` with the same box, checksum and (to rounding) statistics.
inline void CheckSameChunks(const ckpt::Metadata& a, const ckpt::Metadata& b) {
  for (const auto& [key, e] : a.entries) {
    const ckpt::EntryMeta* f = b.Find(key);
    REQUIRE(f);
    REQUIRE(e.chunks.size() == f->chunks.size());
    for (std::size_t i = 0; i < e.chunks.size(); ++i) {
      CAPTURE(key);
      CHECK(e.chunks[i].checksum == f->chunks[i].checksum);
      CHECK(e.chunks[i].box == f->chunks[i].box);
      CHECK(e.chunks[i].stats.has_value() == f->chunks[i].stats.has_value());
      if (e.chunks[i].stats && f->chunks[i].stats) {  // summed over other pieces: to rounding
        const ckpt::ChunkStats &x = *e.chunks[i].stats, &y = *f->chunks[i].stats;
        CHECK(Close(x.l2, y.l2));
        CHECK(Close(x.mean, y.mean));
        CHECK(Close(x.min, y.min));
        CHECK(Close(x.max, y.max));
        CHECK(x.finite_count == y.finite_count);
        CHECK(x.nan_count == y.nan_count);
        CHECK(x.inf_count == y.inf_count);
      }
    }
  }
}

}  // namespace ckpt_test
