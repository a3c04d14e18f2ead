// ops/elements.cc: see elements.h.
#include "ops/elements.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "ckpt/error.h"

namespace ckpt::ops::detail {
namespace {

// An IEEE-like binary format with `ebits` exponent and `mbits` mantissa bits; `fn` is
// the float8_e4m3fn variant (no infinities, NaN only at all-ones).
uint32_t EncodeMinifloat(double v, int ebits, int mbits, bool fn) {
  const uint32_t sign = std::signbit(v) ? 1u : 0u;
  const uint32_t sign_bit = sign << (ebits + mbits);
  const uint32_t all_exp = ((1u << ebits) - 1u) << mbits;
  if (std::isnan(v)) return fn ? sign_bit | all_exp | ((1u << mbits) - 1u) : sign_bit | all_exp | (1u << (mbits - 1));
  const int bias = (1 << (ebits - 1)) - 1;
  // Largest finite value.
  const int emax = fn ? (1 << ebits) - 1 - bias : (1 << ebits) - 2 - bias;
  const double max_mant = fn ? 2.0 - std::ldexp(1.0, 1 - mbits) : 2.0 - std::ldexp(1.0, -mbits);
  const double max_finite = std::ldexp(max_mant, emax);
  double a = std::fabs(v);
  auto overflow = [&]() -> uint32_t {
    return fn ? sign_bit | all_exp | ((1u << mbits) - 1u) : sign_bit | all_exp;
  };
  if (std::isinf(a)) return overflow();
  if (a == 0) return sign_bit;
  int ex;
  std::frexp(a, &ex);
  int e = ex - 1;  // a = m * 2^e, m in [1, 2)
  if (e < 1 - bias) {  // subnormal
    const double q = std::nearbyint(std::ldexp(a, -(1 - bias - mbits)));
    return sign_bit | static_cast<uint32_t>(q);  // q == 2^mbits rolls into the smallest normal
  }
  double q = std::nearbyint(std::ldexp(a, mbits - e));
  if (q >= std::ldexp(1.0, mbits + 1)) {
    q = std::ldexp(1.0, mbits);
    ++e;
  }
  if (e > emax || std::ldexp(q, e - mbits) > max_finite) return overflow();
  return sign_bit | (static_cast<uint32_t>(e + bias) << mbits) |
         (static_cast<uint32_t>(q) - (1u << mbits));
}

bool IsFloat(DType d) { return IsFloating(d); }

}  // namespace

void EncodeElement(DType dtype, double v, void* out) {
  switch (dtype) {
    case DType::kFloat64: std::memcpy(out, &v, 8); return;
    case DType::kFloat32: {
      const float f = static_cast<float>(v);
      std::memcpy(out, &f, 4);
      return;
    }
    case DType::kFloat16: {
      const auto b = static_cast<uint16_t>(EncodeMinifloat(v, 5, 10, false));
      std::memcpy(out, &b, 2);
      return;
    }
    case DType::kBFloat16: {
      const auto b = static_cast<uint16_t>(EncodeMinifloat(v, 8, 7, false));
      std::memcpy(out, &b, 2);
      return;
    }
    case DType::kFloat8E4M3FN: *static_cast<uint8_t*>(out) = static_cast<uint8_t>(EncodeMinifloat(v, 4, 3, true)); return;
    case DType::kFloat8E5M2: *static_cast<uint8_t*>(out) = static_cast<uint8_t>(EncodeMinifloat(v, 5, 2, false)); return;
    case DType::kInt8: *static_cast<int8_t*>(out) = static_cast<int8_t>(v); return;
    case DType::kInt16: { const auto x = static_cast<int16_t>(v); std::memcpy(out, &x, 2); return; }
    case DType::kInt32: { const auto x = static_cast<int32_t>(v); std::memcpy(out, &x, 4); return; }
    case DType::kInt64: { const auto x = static_cast<int64_t>(v); std::memcpy(out, &x, 8); return; }
    case DType::kUInt8: *static_cast<uint8_t*>(out) = static_cast<uint8_t>(v); return;
    case DType::kBool: *static_cast<uint8_t*>(out) = v != 0 ? 1 : 0; return;
    case DType::kUInt16: { const auto x = static_cast<uint16_t>(v); std::memcpy(out, &x, 2); return; }
    case DType::kUInt32: { const auto x = static_cast<uint32_t>(v); std::memcpy(out, &x, 4); return; }
    case DType::kUInt64: { const auto x = static_cast<uint64_t>(v); std::memcpy(out, &x, 8); return; }
    case DType::kFloat8E8M0FNU:
    case DType::kFloat4E2M1FNx2: break;  // not castable (IsCastable): never asked for
  }
  throw Error(ErrorCode::kInvalidArgument, "cannot encode a value as " + std::string(DTypeName(dtype)));
}

void CastElements(DType from, const void* in, DType to, void* out, std::size_t n) {
  if (from == to) {
    std::memcpy(out, in, n * DTypeSize(from));
    return;
  }
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  const std::size_t si = DTypeSize(from), di = DTypeSize(to);
  if (from == DType::kFloat32 && to == DType::kBFloat16) {
    for (std::size_t i = 0; i < n; ++i) {  // round to nearest even on the top 16 bits
      uint32_t b;
      std::memcpy(&b, src + 4 * i, 4);
      uint16_t r;
      if ((b & 0x7fffffffu) > 0x7f800000u) {
        r = static_cast<uint16_t>((b >> 16) | 0x40);
      } else {
        r = static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
      }
      std::memcpy(dst + 2 * i, &r, 2);
    }
    return;
  }
  for (std::size_t i = 0; i < n; ++i) EncodeElement(to, ElementToDouble(from, src + i * si), dst + i * di);
}

void StatsAccumulator::Add(DType dtype, const void* data, std::size_t n) {
  if (!IsFloat(dtype)) return;
  const auto* p = static_cast<const uint8_t*>(data);
  const std::size_t item = DTypeSize(dtype);
  auto one = [&](double x) {
    if (std::isnan(x)) {
      ++nan;
    } else if (std::isinf(x)) {
      ++inf;
    } else {
      if (finite == 0) min = max = x;
      min = std::min(min, x);
      max = std::max(max, x);
      sum += x;
      sumsq += x * x;
      ++finite;
    }
  };
  if (dtype == DType::kFloat32) {
    for (std::size_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      one(f);
    }
    return;
  }
  const int values = DTypeValues(dtype);
  double v[2];
  for (std::size_t i = 0; i < n; ++i) {
    ElementValues(dtype, p + i * item, v);
    for (int j = 0; j < values; ++j) one(v[j]);
  }
}

void StatsAccumulator::Merge(const ChunkStats& s) {
  nan += s.nan_count;
  inf += s.inf_count;
  if (s.finite_count == 0) return;
  if (finite == 0) min = s.min, max = s.max;
  min = std::min(min, s.min);
  max = std::max(max, s.max);
  sum += s.mean * static_cast<double>(s.finite_count);
  sumsq += s.l2 * s.l2;
  finite += s.finite_count;
}

double StatsAccumulator::stddev() const {
  if (finite == 0) return 0;
  const double m = mean();
  return std::sqrt(std::max(0.0, sumsq / static_cast<double>(finite) - m * m));
}

void CountNonFinite(DType dtype, const void* data, std::size_t n, int64_t* nan, int64_t* inf) {
  if (!IsFloat(dtype)) return;
  const auto* p = static_cast<const uint8_t*>(data);
  if (dtype == DType::kFloat32) {
    for (std::size_t i = 0; i < n; ++i) {
      uint32_t b;
      std::memcpy(&b, p + 4 * i, 4);
      if ((b & 0x7f800000u) == 0x7f800000u) ++((b & 0x7fffffu) ? *nan : *inf);
    }
    return;
  }
  const std::size_t item = DTypeSize(dtype);
  if (dtype == DType::kFloat4E2M1FNx2) return;  // e2m1 has no NaN or Inf
  for (std::size_t i = 0; i < n; ++i) {
    const double x = ElementToDouble(dtype, p + i * item);
    if (std::isnan(x)) ++*nan;
    else if (std::isinf(x)) ++*inf;
  }
}

}  // namespace ckpt::ops::detail
