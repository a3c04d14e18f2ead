// Helpers of the GPU tests: device buffers, and the device count each test binary needs.
#pragma once

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

int ckpt_gpu_min_devices() { return CKPT_MIN_DEVICES; }

namespace gpu_test {

inline void Ok(cudaError_t rc) { REQUIRE_MESSAGE(rc == cudaSuccess, cudaGetErrorString(rc)); }

// n bytes of memory on `device`, freed with the object.
class DeviceBuffer {
 public:
  DeviceBuffer(std::size_t n, int device = 0) : n_(n), device_(device) {
    int previous = 0;
    Ok(cudaGetDevice(&previous));
    Ok(cudaSetDevice(device));
    Ok(cudaMalloc(&p_, n == 0 ? 1 : n));
    Ok(cudaSetDevice(previous));
  }
  DeviceBuffer(const std::vector<uint8_t>& bytes, int device = 0) : DeviceBuffer(bytes.size(), device) {
    Ok(cudaMemcpy(p_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { (void)cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  int device() const { return device_; }
  std::vector<uint8_t> Download() const {
    std::vector<uint8_t> out(n_);
    Ok(cudaMemcpy(out.data(), p_, n_, cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  void* p_ = nullptr;
  std::size_t n_;
  int device_;
};

}  // namespace gpu_test
