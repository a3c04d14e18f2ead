// cuda/cuda_util.h: CUDA runtime error checks and the current-device guard shared by
// ckpt::cuda and ckpt::nccl (header only: each library compiles its own copy).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "ckpt/error.h"

namespace ckpt::cuda_util {

inline std::string Describe(cudaError_t rc) {
  return std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
}

inline void Check(cudaError_t rc, const std::string& what, ErrorCode code = ErrorCode::kIO) {
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();  // a non-sticky error must not surface in the next call
    throw Error(code, what + ": " + Describe(rc));
  }
}

// Makes `device` current for the life of the guard, then restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, ErrorCode code = ErrorCode::kIO) {
    Check(cudaGetDevice(&previous_), "cudaGetDevice", code);
    if (previous_ != device) Check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")", code);
  }
  ~DeviceGuard() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace ckpt::cuda_util
