// Helpers of the device tests (tests/unit/device_test.cc with a fake backend, tests/cuda on a
// GPU): tensors of deterministic bytes, and the code and message of an Error.
#pragma once

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

}  // namespace ckpt_test
