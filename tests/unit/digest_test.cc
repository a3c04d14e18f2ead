// storage::Digest's statistics against an element-by-element reference, for every floating
// dtype the vectorised kernels cover (float32, bfloat16, float16) and the others: lengths
// around the kernels' 16-element steps and 16,384-element blocks, bytes fed in pieces that
// split elements, NaN and Inf in some blocks, all non-finite, signed zeros, subnormals; and
// the parallel update (UpdateParallel) against the one-call one, bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/dtype.h"
#include "storage/digest.h"
#include "storage/pool.h"

using namespace ckpt;

namespace {

struct Ref {
  double min = std::numeric_limits<double>::infinity(), max = -min, sum = 0, sumsq = 0;
  int64_t nan = 0, inf = 0, finite = 0;
};

Ref Reference(DType dtype, const std::vector<uint8_t>& bytes) {
  Ref r;
  const std::size_t size = DTypeSize(dtype);
  for (std::size_t i = 0; i + size <= bytes.size(); i += size) {
    const double v = ElementToDouble(dtype, bytes.data() + i);
    if (std::isnan(v)) {
      ++r.nan;
    } else if (std::isinf(v)) {
      ++r.inf;
    } else {
      r.min = std::min(r.min, v);
      r.max = std::max(r.max, v);
      r.sum += v;
      r.sumsq += v * v;
      ++r.finite;
    }
  }
  return r;
}

uint64_t Next(uint64_t& x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

// `n` elements of finite values of either sign (some subnormal, some zero of either sign).
std::vector<uint8_t> Finite(DType dtype, std::size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 7;
  for (std::size_t i = 0; i < n; ++i) {
    const uint64_t r = Next(x);
    float f = (static_cast<float>(r >> 40) / 16777216.0f - 0.5f) * 8.0f;
    if (r % 97 == 0) f = -0.0f;
    if (r % 89 == 0) f = 1e-40f;  // subnormal in float32 (and zero / subnormal below)
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    uint8_t* p = out.data() + i * DTypeSize(dtype);
    if (dtype == DType::kFloat32) {
      std::memcpy(p, &f, 4);
    } else if (dtype == DType::kBFloat16) {
      const uint16_t b = static_cast<uint16_t>(bits >> 16);
      std::memcpy(p, &b, 2);
    } else if (dtype == DType::kFloat16) {
      // A finite half: sign, exponent 0..30, any mantissa (exponent 0: zero or subnormal).
      const uint16_t h = static_cast<uint16_t>(((r >> 8) & 0x8000) | (((r >> 20) % 31) << 10) | (r & 0x3ff));
      std::memcpy(p, &h, 2);
    } else {
      const double d = f;
      std::memcpy(p, &d, 8);
    }
  }
  return out;
}

void Put(DType dtype, std::vector<uint8_t>& bytes, std::size_t i, double v) {
  const std::size_t size = DTypeSize(dtype);
  const float f = static_cast<float>(v);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if (dtype == DType::kFloat32) {
    std::memcpy(bytes.data() + i * 4, &f, 4);
  } else if (dtype == DType::kBFloat16) {
    const uint16_t b = static_cast<uint16_t>(bits >> 16);
    std::memcpy(bytes.data() + i * 2, &b, 2);
  } else if (dtype == DType::kFloat16) {
    const uint16_t h = std::isnan(v) ? 0x7e00 : v > 0 ? 0x7c00 : 0xfc00;
    std::memcpy(bytes.data() + i * 2, &h, 2);
  } else {
    std::memcpy(bytes.data() + i * size, &v, 8);
  }
}

void Check(DType dtype, const std::vector<uint8_t>& bytes, std::size_t piece) {
  storage::Digest d(dtype, true);
  for (std::size_t pos = 0; pos < bytes.size(); pos += piece) d.Update(bytes.data() + pos, std::min(piece, bytes.size() - pos));
  const auto s = d.Stats();
  REQUIRE(s.has_value());
  const Ref r = Reference(dtype, bytes);
  CHECK(s->nan_count == r.nan);
  CHECK(s->inf_count == r.inf);
  CHECK(s->finite_count == r.finite);
  if (r.finite == 0) {
    CHECK(std::isnan(s->min));
    CHECK(std::isnan(s->mean));
    return;
  }
  CHECK(s->min == r.min);
  CHECK(s->max == r.max);
  const double mean = r.sum / static_cast<double>(r.finite), l2 = std::sqrt(r.sumsq);
  CHECK(std::abs(s->mean - mean) <= 1e-10 * (std::sqrt(r.sumsq / static_cast<double>(r.finite)) + 1e-300));
  CHECK(std::abs(s->l2 - l2) <= 1e-10 * l2);
}

const DType kTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kFloat64};

}  // namespace

TEST_CASE("Digest statistics match an element-by-element reference") {
  for (DType dtype : kTypes) {
    CAPTURE(DTypeName(dtype));
    for (std::size_t n : {1, 2, 15, 16, 17, 31, 33, 1000, 16383, 16384, 16385, 40000}) {
      CAPTURE(n);
      const auto bytes = Finite(dtype, n, n);
      Check(dtype, bytes, bytes.size());  // one piece
      Check(dtype, bytes, 7);             // pieces that split elements
      Check(dtype, bytes, 4096 + 3);
    }
  }
}

TEST_CASE("Digest statistics count NaN and Inf and keep the rest of their block") {
  for (DType dtype : kTypes) {
    CAPTURE(DTypeName(dtype));
    auto bytes = Finite(dtype, 50000, 3);
    Put(dtype, bytes, 5, std::numeric_limits<double>::quiet_NaN());
    Put(dtype, bytes, 16384 + 20, std::numeric_limits<double>::infinity());
    Put(dtype, bytes, 16384 + 21, -std::numeric_limits<double>::infinity());
    Put(dtype, bytes, 49999, std::numeric_limits<double>::quiet_NaN());
    Check(dtype, bytes, bytes.size());
    Check(dtype, bytes, 1 << 16);
    std::vector<uint8_t> none(100 * DTypeSize(dtype));
    for (std::size_t i = 0; i < 100; ++i)
      Put(dtype, none, i, i % 2 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity());
    Check(dtype, none, none.size());
  }
}

TEST_CASE("Digest statistics: a block whose min or max is at its first or last element") {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    CAPTURE(DTypeName(dtype));
    auto bytes = Finite(dtype, 16384 * 2 + 5, 11);
    Put(dtype, bytes, 0, -1000.0);
    Put(dtype, bytes, 16383, 1000.0);
    Put(dtype, bytes, 16384 * 2 + 4, -2000.0);
    Check(dtype, bytes, bytes.size());
  }
}

namespace {

// Everything a Digest yields, for comparing two of them exactly.
struct Outcome {
  std::string checksum, blocks;
  std::optional<ChunkStats> stats;
};

Outcome Of(const storage::Digest& d) { return {d.Checksum(), d.Blocks(), d.Stats()}; }

void RequireSame(const Outcome& a, const Outcome& b) {
  CHECK(a.checksum == b.checksum);
  CHECK(a.blocks == b.blocks);
  REQUIRE(a.stats.has_value() == b.stats.has_value());
  if (!a.stats) return;
  // Bit for bit: the same sums added in the same order (NaN compares by its bits).
  CHECK(std::memcmp(&a.stats->min, &b.stats->min, sizeof(double)) == 0);
  CHECK(std::memcmp(&a.stats->max, &b.stats->max, sizeof(double)) == 0);
  CHECK(std::memcmp(&a.stats->mean, &b.stats->mean, sizeof(double)) == 0);
  CHECK(std::memcmp(&a.stats->l2, &b.stats->l2, sizeof(double)) == 0);
  CHECK(a.stats->nan_count == b.stats->nan_count);
  CHECK(a.stats->inf_count == b.stats->inf_count);
  CHECK(a.stats->finite_count == b.stats->finite_count);
}

}  // namespace

TEST_CASE("Digest::UpdateParallel gives exactly what one Update gives, on any number of workers") {
  const std::size_t workers = storage::PoolWorkers();
  for (std::size_t pool : {std::size_t{0}, std::size_t{3}}) {
    storage::SetPoolWorkers(pool);
    CAPTURE(pool);
    for (DType dtype : kTypes) {
      CAPTURE(DTypeName(dtype));
      // Past two segments (2 MiB each) and two 8 MiB pieces handed over, ending mid-block and
      // mid-statistics-block; NaN and Inf in some blocks of different segments.
      const std::size_t n = ((std::size_t{17} << 20) + 4096 * 3 + 40) / DTypeSize(dtype);
      auto bytes = Finite(dtype, n, 5);
      Put(dtype, bytes, 7, std::numeric_limits<double>::quiet_NaN());
      Put(dtype, bytes, n / 2, std::numeric_limits<double>::infinity());
      Put(dtype, bytes, n - 1, -std::numeric_limits<double>::infinity());
      for (uint64_t block : {uint64_t{4096}, storage::kDefaultBlockBytes, uint64_t{4} << 20}) {
        CAPTURE(block);
        for (std::size_t extra : {std::size_t{0}, std::size_t{1}}) {  // 1: a byte left mid-element
          const std::size_t len = bytes.size() - extra;
          storage::Digest one(dtype, true, block), wide(dtype, true, block);
          one.Update(bytes.data(), len);
          std::vector<std::pair<std::size_t, std::size_t>> seen;  // pieces handed over
          std::size_t misplaced = 0;
          std::atomic<int> inside{0}, overlapped{0};
          std::mutex mu;
          wide.UpdateParallel(bytes.data(), len, [&](const unsigned char* p, std::size_t k, std::size_t pos) {
            if (inside.fetch_add(1) != 0) ++overlapped;  // two pieces handed over at once
            {
              std::lock_guard<std::mutex> lock(mu);  // on the pool's threads: no doctest assertion here
              seen.emplace_back(pos, k);
              if (p != bytes.data() + pos) ++misplaced;
            }
            inside.fetch_sub(1);
          });
          CHECK(misplaced == 0);
          CHECK(overlapped.load() == 0);
          RequireSame(Of(wide), Of(one));
          // Every byte handed over exactly once, in order (not sorted here).
          std::size_t covered = 0;
          for (const auto& [pos, k] : seen) {
            CHECK(pos == covered);
            covered += k;
          }
          CHECK(covered == len);
          // And the digest goes on as Update's would after it.
          one.Update(bytes.data(), 1000);
          wide.Update(bytes.data(), 1000);
          RequireSame(Of(wide), Of(one));
        }
      }
    }
    // Mid-block, v1 (one stream), and small runs take the one-thread path, with the same result.
    const auto bytes = Finite(DType::kFloat32, std::size_t{3} << 20, 9);
    storage::Digest one(DType::kFloat32, true, 65536), wide(DType::kFloat32, true, 65536);
    one.Update(bytes.data(), 100);
    wide.Update(bytes.data(), 100);
    one.Update(bytes.data() + 100, bytes.size() - 100);
    wide.UpdateParallel(bytes.data() + 100, bytes.size() - 100);
    RequireSame(Of(wide), Of(one));
    storage::Digest v1(DType::kFloat32, true), v1_wide(DType::kFloat32, true);
    v1.Update(bytes.data(), bytes.size());
    v1_wide.UpdateParallel(bytes.data(), bytes.size());
    RequireSame(Of(v1_wide), Of(v1));
  }
  storage::SetPoolWorkers(workers);
}

TEST_CASE("Digest::UpdateParallel: a failing piece is rethrown to the caller") {
  const auto bytes = Finite(DType::kFloat32, std::size_t{5} << 20, 4);  // 20 MiB: ten segments, three pieces
  storage::Digest d(DType::kFloat32, true, 65536);
  std::atomic<int> calls{0};
  CHECK_THROWS_AS(d.UpdateParallel(bytes.data(), bytes.size(),
                                     [&](const unsigned char*, std::size_t, std::size_t pos) {
                                       ++calls;
                                       if (pos > 0) throw Error(ErrorCode::kIO, "disk full");  // the second piece
                                     }),
                  Error);
  CHECK(calls.load() == 2);  // no piece after the one that failed
}
