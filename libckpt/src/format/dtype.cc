// format/dtype.cc: dtype names, sizes and element conversion (FORMAT.md §4).
#include "ckpt/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>

namespace ckpt {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
  bool floating;
  bool castable;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kFloat64, "float64", 8, true, true},
    {DType::kFloat32, "float32", 4, true, true},
    {DType::kFloat16, "float16", 2, true, true},
    {DType::kBFloat16, "bfloat16", 2, true, true},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1, true, true},
    {DType::kFloat8E5M2, "float8_e5m2", 1, true, true},
    {DType::kInt8, "int8", 1, false, false},
    {DType::kInt16, "int16", 2, false, false},
    {DType::kInt32, "int32", 4, false, false},
    {DType::kInt64, "int64", 8, false, false},
    {DType::kUInt8, "uint8", 1, false, false},
    {DType::kBool, "bool", 1, false, false},
    {DType::kUInt16, "uint16", 2, false, false},
    {DType::kUInt32, "uint32", 4, false, false},
    {DType::kUInt64, "uint64", 8, false, false},
    {DType::kFloat8E8M0FNU, "float8_e8m0fnu", 1, true, false},
    {DType::kFloat4E2M1FNx2, "float4_e2m1fn_x2", 1, true, false},
};
static_assert(std::size(kInfo) == std::size(kAllDTypes));

const DTypeInfo& Info(DType dtype) { return kInfo[static_cast<std::size_t>(dtype)]; }

template <typename T>
T Load(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double HalfToDouble(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(mant, -24);
  } else if (exp == 31) {
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else {
    v = std::ldexp(mant + 1024, exp - 25);
  }
  return sign ? -v : v;
}

double E4M3ToDouble(uint8_t b) {
  const int sign = (b >> 7) & 1;
  const int exp = (b >> 3) & 0xf;
  const int mant = b & 0x7;
  double v;
  if (exp == 0xf && mant == 0x7) {
    v = std::numeric_limits<double>::quiet_NaN();  // e4m3fn: no infinities
  } else if (exp == 0) {
    v = std::ldexp(mant, -9);
  } else {
    v = std::ldexp(mant + 8, exp - 10);
  }
  return sign ? -v : v;
}

double E5M2ToDouble(uint8_t b) { return HalfToDouble(static_cast<uint16_t>(b) << 8); }

// 2^(b - 127); 0xff is the one NaN (no sign, zero or infinity).
double E8M0ToDouble(uint8_t b) {
  return b == 0xff ? std::numeric_limits<double>::quiet_NaN() : std::ldexp(1.0, b - 127);
}

// One e2m1 nibble: sign, 2 exponent bits (bias 1), 1 mantissa bit; no NaN or infinity.
double E2M1ToDouble(unsigned nibble) {
  const int exp = (nibble >> 1) & 3;
  const int mant = nibble & 1;
  const double v = exp == 0 ? 0.5 * mant : std::ldexp(1.0 + 0.5 * mant, exp - 1);
  return (nibble & 8) ? -v : v;
}

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& info : kInfo) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::size_t DTypeSize(DType dtype) { return Info(dtype).size; }
int DTypeValues(DType dtype) { return dtype == DType::kFloat4E2M1FNx2 ? 2 : 1; }
bool IsFloating(DType dtype) { return Info(dtype).floating; }
bool IsCastable(DType dtype) { return Info(dtype).castable; }

double ElementToDouble(DType dtype, const void* p) {
  switch (dtype) {
    case DType::kFloat64: return Load<double>(p);
    case DType::kFloat32: return Load<float>(p);
    case DType::kFloat16: return HalfToDouble(Load<uint16_t>(p));
    case DType::kBFloat16:
      return std::bit_cast<float>(static_cast<uint32_t>(Load<uint16_t>(p)) << 16);
    case DType::kFloat8E4M3FN: return E4M3ToDouble(Load<uint8_t>(p));
    case DType::kFloat8E5M2: return E5M2ToDouble(Load<uint8_t>(p));
    case DType::kInt8: return Load<int8_t>(p);
    case DType::kInt16: return Load<int16_t>(p);
    case DType::kInt32: return Load<int32_t>(p);
    case DType::kInt64: return static_cast<double>(Load<int64_t>(p));
    case DType::kUInt8: return Load<uint8_t>(p);
    case DType::kBool: return Load<uint8_t>(p) != 0 ? 1.0 : 0.0;
    case DType::kUInt16: return Load<uint16_t>(p);
    case DType::kUInt32: return Load<uint32_t>(p);
    case DType::kUInt64: return static_cast<double>(Load<uint64_t>(p));
    case DType::kFloat8E8M0FNU: return E8M0ToDouble(Load<uint8_t>(p));
    case DType::kFloat4E2M1FNx2: return E2M1ToDouble(Load<uint8_t>(p) & 0xf);
  }
  return 0;
}

void ElementValues(DType dtype, const void* p, double* out) {
  if (dtype == DType::kFloat4E2M1FNx2) {
    const uint8_t b = Load<uint8_t>(p);
    out[0] = E2M1ToDouble(b & 0xf);
    out[1] = E2M1ToDouble(b >> 4);
    return;
  }
  out[0] = ElementToDouble(dtype, p);
}

}  // namespace ckpt
