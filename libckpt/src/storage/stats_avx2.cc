// storage/stats_avx2.cc: float32 / bfloat16 / float16 block statistics with AVX2, FMA and
// F16C (this file alone is built with -mavx2 -mfma -mf16c). 16 elements a step: widened to
// float32 (bf16: a shift; f16: vcvtph2ps), min and max in float, sum and sum of squares in
// double over 8 independent chains, so the loop runs at load speed, not add latency.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "storage/stats_kernels.h"

namespace ckpt::storage::internal {
namespace {

template <DType D>
inline __m256 Load8(const unsigned char* p) {
  if constexpr (D == DType::kFloat32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (D == DType::kBFloat16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

template <DType D>
inline float Scalar(const unsigned char* p) {
  if constexpr (D == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  } else if constexpr (D == DType::kBFloat16) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    const uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  } else {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return _cvtsh_ss(v);
  }
}

inline double Sum4(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

template <DType D>
BlockSums Kernel(const unsigned char* p, std::size_t n) {
  constexpr std::size_t kSize = D == DType::kFloat32 ? 4 : 2;
  std::size_t i = 0;
  BlockSums out;
  float lo = Scalar<D>(p), hi = lo;
  if (n >= 16) {
    __m256 vlo = _mm256_set1_ps(lo), vhi = vlo;
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
    for (; i + 16 <= n; i += 16) {
      const __m256 a = Load8<D>(p + i * kSize), b = Load8<D>(p + (i + 8) * kSize);
      vlo = _mm256_min_ps(vlo, _mm256_min_ps(a, b));
      vhi = _mm256_max_ps(vhi, _mm256_max_ps(a, b));
      const __m256d a0 = _mm256_cvtps_pd(_mm256_castps256_ps128(a)), a1 = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
      const __m256d b0 = _mm256_cvtps_pd(_mm256_castps256_ps128(b)), b1 = _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1));
      s0 = _mm256_add_pd(s0, a0);
      s1 = _mm256_add_pd(s1, a1);
      s2 = _mm256_add_pd(s2, b0);
      s3 = _mm256_add_pd(s3, b1);
      q0 = _mm256_fmadd_pd(a0, a0, q0);
      q1 = _mm256_fmadd_pd(a1, a1, q1);
      q2 = _mm256_fmadd_pd(b0, b0, q2);
      q3 = _mm256_fmadd_pd(b1, b1, q3);
    }
    out.sum = Sum4(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
    out.sumsq = Sum4(_mm256_add_pd(_mm256_add_pd(q0, q1), _mm256_add_pd(q2, q3)));
    alignas(32) float f[8];
    _mm256_store_ps(f, vlo);
    lo = *std::min_element(f, f + 8);
    _mm256_store_ps(f, vhi);
    hi = *std::max_element(f, f + 8);
  }
  for (; i < n; ++i) {
    const float v = Scalar<D>(p + i * kSize);
    const double d = v;
    out.sum += d;
    out.sumsq += d * d;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  out.lo = lo;
  out.hi = hi;
  return out;
}

}  // namespace

BlockSums StatsAvx2(DType dtype, const unsigned char* p, std::size_t n) {
  switch (dtype) {
    case DType::kBFloat16:
      return Kernel<DType::kBFloat16>(p, n);
    case DType::kFloat16:
      return Kernel<DType::kFloat16>(p, n);
    default:
      return Kernel<DType::kFloat32>(p, n);
  }
}

}  // namespace ckpt::storage::internal
