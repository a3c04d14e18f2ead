// cuda/stats_kernel.cu: float32 chunk statistics on the device. Each thread accumulates a
// grid-stride slice, each block reduces its threads in shared memory and writes one partial;
// the host combines the partials (deterministic: no atomics).
#include <cuda_runtime.h>

#include "cuda/stats_kernel.h"

namespace ckpt::cuda::kernels {
namespace {

__device__ void Merge(StatsPartial& a, const StatsPartial& b) {
  a.sum += b.sum;
  a.sumsq += b.sumsq;
  a.min = fminf(a.min, b.min);
  a.max = fmaxf(a.max, b.max);
  a.nan += b.nan;
  a.inf += b.inf;
  a.finite += b.finite;
}

__global__ void StatsFloat32(const float* data, std::size_t count, StatsPartial* out) {
  __shared__ StatsPartial part[kStatsThreads];
  const float inf = __int_as_float(0x7f800000);
  StatsPartial mine{0.0, 0.0, inf, -inf, 0, 0, 0};
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float v = data[i];
    if (isnan(v)) {
      ++mine.nan;
    } else if (isinf(v)) {
      ++mine.inf;
    } else {
      ++mine.finite;
      mine.sum += v;
      mine.sumsq += static_cast<double>(v) * v;
      mine.min = fminf(mine.min, v);
      mine.max = fmaxf(mine.max, v);
    }
  }
  part[threadIdx.x] = mine;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) Merge(part[threadIdx.x], part[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

}  // namespace

int LaunchStatsFloat32(const float* data, std::size_t count, StatsPartial* out, int blocks, void* stream) {
  StatsFloat32<<<blocks, kStatsThreads, 0, static_cast<cudaStream_t>(stream)>>>(data, count, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ckpt::cuda::kernels
