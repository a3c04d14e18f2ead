// format/dtype.cc: dtype names, sizes and element conversion (FORMAT.md §4).
#include "ckpt/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

namespace ckpt {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::size_t size;
  bool floating;
};

constexpr DTypeInfo kInfo[] = {
    {DType::kFloat64, "float64", 8, true},
    {DType::kFloat32, "float32", 4, true},
    {DType::kFloat16, "float16", 2, true},
    {DType::kBFloat16, "bfloat16", 2, true},
    {DType::kFloat8E4M3FN, "float8_e4m3fn", 1, true},
    {DType::kFloat8E5M2, "float8_e5m2", 1, true},
    {DType::kInt8, "int8", 1, false},
    {DType::kInt16, "int16", 2, false},
    {DType::kInt32, "int32", 4, false},
    {DType::kInt64, "int64", 8, false},
    {DType::kUInt8, "uint8", 1, false},
    {DType::kBool, "bool", 1, false},
};

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

}  // namespace

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& info : kInfo) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::size_t DTypeSize(DType dtype) { return Info(dtype).size; }
bool IsFloating(DType dtype) { return Info(dtype).floating; }

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
  }
  return 0;
}

}  // namespace ckpt
