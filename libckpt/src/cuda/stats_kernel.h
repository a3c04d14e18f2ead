// cuda/stats_kernel.h: the float32 statistics kernel of stats_kernel.cu, behind a plain C++
// interface (no CUDA header) for cuda_backend.cc.
#pragma once

#include <cstddef>

namespace ckpt::cuda::kernels {

// One thread block's partial statistics.
struct StatsPartial {
  double sum;
  double sumsq;
  float min;
  float max;
  unsigned long long nan;
  unsigned long long inf;
  unsigned long long finite;
};

inline constexpr int kStatsThreads = 256;

// Enqueues on `stream` (a cudaStream_t) the reduction of `count` floats at `data` (device
// memory of the current device) into `blocks` partials at `out` (device memory). Returns the
// launch's cudaError_t, as an int.
int LaunchStatsFloat32(const float* data, std::size_t count, StatsPartial* out, int blocks, void* stream);

}  // namespace ckpt::cuda::kernels
