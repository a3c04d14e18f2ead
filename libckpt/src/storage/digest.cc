// storage/digest.cc
#include "storage/digest.h"

#include <xxhash.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "format/names.h"

namespace ckpt::storage {
namespace {

// Running statistics over finite elements. Kept in double; each block's partial sums are
// gathered in a branch-light loop the compiler vectorises.
struct RunningStats {
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0, sumsq = 0;
  int64_t nan = 0, inf = 0, finite = 0;

  void Add(double v) {
    if (std::isnan(v)) {
      ++nan;
    } else if (std::isinf(v)) {
      ++inf;
    } else {
      min = std::min(min, v);
      max = std::max(max, v);
      sum += v;
      sumsq += v * v;
      ++finite;
    }
  }
};

template <typename T>
void AccumulateNative(const T* p, std::size_t n, RunningStats& s) {
  // Fast path: per-block sums in kLanes independent accumulators (so the loop vectorises
  // without reassociating floating-point adds); a block whose sums are not finite holds
  // a NaN or Inf and is recounted element by element.
  constexpr std::size_t kLanes = 8;
  constexpr std::size_t kBlock = 4096;
  for (std::size_t b = 0; b < n; b += kBlock) {
    const std::size_t e = std::min(n, b + kBlock);
    const std::size_t vec_end = b + (e - b) / kLanes * kLanes;
    double sum[kLanes] = {}, sumsq[kLanes] = {};
    T lo[kLanes], hi[kLanes];
    for (std::size_t j = 0; j < kLanes; ++j) lo[j] = hi[j] = p[b];
    for (std::size_t i = b; i < vec_end; i += kLanes) {
      for (std::size_t j = 0; j < kLanes; ++j) {
        const T x = p[i + j];
        const double v = static_cast<double>(x);
        sum[j] += v;
        sumsq[j] += v * v;
        lo[j] = x < lo[j] ? x : lo[j];
        hi[j] = x > hi[j] ? x : hi[j];
      }
    }
    double bsum = 0, bsumsq = 0;
    double bmin = static_cast<double>(lo[0]), bmax = static_cast<double>(hi[0]);
    for (std::size_t j = 0; j < kLanes; ++j) {
      bsum += sum[j];
      bsumsq += sumsq[j];
      bmin = std::min(bmin, static_cast<double>(lo[j]));
      bmax = std::max(bmax, static_cast<double>(hi[j]));
    }
    for (std::size_t i = vec_end; i < e; ++i) {
      const double v = static_cast<double>(p[i]);
      bsum += v;
      bsumsq += v * v;
      bmin = std::min(bmin, v);
      bmax = std::max(bmax, v);
    }
    if (std::isfinite(bsum) && std::isfinite(bsumsq) && std::isfinite(bmin) && std::isfinite(bmax)) {
      s.sum += bsum;
      s.sumsq += bsumsq;
      s.min = std::min(s.min, bmin);
      s.max = std::max(s.max, bmax);
      s.finite += static_cast<int64_t>(e - b);
    } else {
      for (std::size_t i = b; i < e; ++i) s.Add(static_cast<double>(p[i]));
    }
  }
}

}  // namespace

struct Digest::State {
  DType dtype;
  bool stats_on;
  XXH3_state_t* xxh = nullptr;
  RunningStats stats;
  unsigned char carry[8];
  std::size_t carried = 0;

  void AddElements(const unsigned char* p, std::size_t count) {
    switch (dtype) {
      case DType::kFloat64: {
        if (reinterpret_cast<uintptr_t>(p) % alignof(double) == 0) {
          AccumulateNative(reinterpret_cast<const double*>(p), count, stats);
          return;
        }
        break;
      }
      case DType::kFloat32: {
        if (reinterpret_cast<uintptr_t>(p) % alignof(float) == 0) {
          AccumulateNative(reinterpret_cast<const float*>(p), count, stats);
          return;
        }
        break;
      }
      default: break;
    }
    const std::size_t size = DTypeSize(dtype);
    for (std::size_t i = 0; i < count; ++i) stats.Add(ElementToDouble(dtype, p + i * size));
  }
};

Digest::Digest(DType dtype, bool with_stats) : state_(std::make_unique<State>()) {
  state_->dtype = dtype;
  state_->stats_on = with_stats && IsFloating(dtype);
  state_->xxh = XXH3_createState();
  XXH3_64bits_reset(state_->xxh);
}

Digest::~Digest() { XXH3_freeState(state_->xxh); }

void Digest::Update(const void* data, std::size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  XXH3_64bits_update(state_->xxh, p, n);
  if (!state_->stats_on) return;
  const std::size_t size = DTypeSize(state_->dtype);
  // Complete an element split across calls.
  while (state_->carried > 0 && n > 0) {
    state_->carry[state_->carried++] = *p++;
    --n;
    if (state_->carried == size) {
      state_->AddElements(state_->carry, 1);
      state_->carried = 0;
    }
  }
  const std::size_t whole = n / size;
  state_->AddElements(p, whole);
  p += whole * size;
  n -= whole * size;
  std::memcpy(state_->carry, p, n);
  state_->carried = n;
}

std::string Digest::Checksum() const {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_digest(state_->xxh)));
  return std::string(names::kChecksumPrefix) + hex;
}

std::optional<ChunkStats> Digest::Stats() const {
  if (!state_->stats_on) return std::nullopt;
  const auto& s = state_->stats;
  ChunkStats out;
  out.nan_count = s.nan;
  out.inf_count = s.inf;
  out.finite_count = s.finite;
  if (s.finite > 0) {
    out.min = s.min;
    out.max = s.max;
    out.mean = s.sum / static_cast<double>(s.finite);
    out.l2 = std::sqrt(s.sumsq);
  } else {
    out.min = out.max = out.mean = std::numeric_limits<double>::quiet_NaN();
    out.l2 = 0;
  }
  return out;
}

std::string ChecksumOf(const void* data, std::size_t n) {
  Digest d(DType::kUInt8, false);
  d.Update(data, n);
  return d.Checksum();
}

}  // namespace ckpt::storage
