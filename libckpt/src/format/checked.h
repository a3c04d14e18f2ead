// format/checked.h: overflow-checked size arithmetic for values that come from files.
#pragma once

#include <cstdint>
#include <string>

#include "ckpt/error.h"

namespace ckpt::internal {

inline int64_t CheckedMul(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) {
    throw Error(ErrorCode::kCorrupt, what + ": size overflows 64 bits (" + std::to_string(a) +
                                         " x " + std::to_string(b) + ")");
  }
  return r;
}

inline int64_t CheckedAdd(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r)) {
    throw Error(ErrorCode::kCorrupt, what + ": offset overflows 64 bits (" + std::to_string(a) +
                                         " + " + std::to_string(b) + ")");
  }
  return r;
}

}  // namespace ckpt::internal
