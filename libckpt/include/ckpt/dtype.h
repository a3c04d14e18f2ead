// ckpt/dtype.h: element types, spelled as PyTorch spells them (schemas/FORMAT.md §4).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "ckpt/export.h"

namespace ckpt {

enum class DType : uint8_t {
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat8E4M3FN,
  kFloat8E5M2,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kBool,
  // Appended, so the values above stay as they were.
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat8E8M0FNU,  // MX block scales: 8 exponent bits, no sign or mantissa; 0xff is NaN
  kFloat4E2M1FNx2,  // packed float4 e2m1: ONE element = one byte = TWO 4-bit values (low nibble first)
};

inline constexpr DType kAllDTypes[] = {
    DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16,
    DType::kFloat8E4M3FN, DType::kFloat8E5M2, DType::kInt8, DType::kInt16,
    DType::kInt32, DType::kInt64, DType::kUInt8, DType::kBool,
    DType::kUInt16, DType::kUInt32, DType::kUInt64, DType::kFloat8E8M0FNU, DType::kFloat4E2M1FNx2};

// "float32", "bfloat16", "float8_e4m3fn", "float4_e2m1fn_x2", ...
CKPT_API std::string_view DTypeName(DType dtype);
CKPT_API std::optional<DType> DTypeFromName(std::string_view name);
// Bytes per element: 1, 2, 4 or 8. As in torch, a float4_e2m1fn_x2 element is one byte
// holding two values, so shapes count bytes (safetensors' F4 shapes count values: the last
// dimension is twice ckpt's, FORMAT.md §4.5).
CKPT_API std::size_t DTypeSize(DType dtype);
// Values per element: 2 for float4_e2m1fn_x2, 1 otherwise.
CKPT_API int DTypeValues(DType dtype);
// Floating formats: they carry statistics (of the decoded values) and float scalars.
CKPT_API bool IsFloating(DType dtype);
// Floating dtypes `--dtype` casts from and to: not float8_e8m0fnu (scales, which keep their
// format) nor float4_e2m1fn_x2 (packed pairs).
CKPT_API bool IsCastable(DType dtype);

// Converts one element at `p` to double (exact for every dtype but (u)int64 beyond 2^53).
// For float4_e2m1fn_x2 the first (low-nibble) value; ElementValues gives both.
CKPT_API double ElementToDouble(DType dtype, const void* p);
// Writes the DTypeValues(dtype) values of the element at `p` to out[0..].
CKPT_API void ElementValues(DType dtype, const void* p, double* out);

}  // namespace ckpt
