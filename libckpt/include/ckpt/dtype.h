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
};

inline constexpr DType kAllDTypes[] = {
    DType::kFloat64, DType::kFloat32, DType::kFloat16, DType::kBFloat16,
    DType::kFloat8E4M3FN, DType::kFloat8E5M2, DType::kInt8, DType::kInt16,
    DType::kInt32, DType::kInt64, DType::kUInt8, DType::kBool};

// "float32", "bfloat16", "float8_e4m3fn", ...
CKPT_API std::string_view DTypeName(DType dtype);
CKPT_API std::optional<DType> DTypeFromName(std::string_view name);
// Bytes per element: 1, 2, 4 or 8.
CKPT_API std::size_t DTypeSize(DType dtype);
CKPT_API bool IsFloating(DType dtype);

// Converts one element at `p` to double (exact for every dtype but int64 beyond 2^53).
CKPT_API double ElementToDouble(DType dtype, const void* p);

}  // namespace ckpt
