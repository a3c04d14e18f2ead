// The doctest main of the GPU tests: exits 77 (CTest: skipped) with fewer CUDA devices than
// the test needs (CKPT_MIN_DEVICES of the test, read through ckpt_gpu_min_devices).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "ckpt/cuda.h"

int ckpt_gpu_min_devices();

int main(int argc, char** argv) {
  const int have = ckpt::cuda::DeviceCount();
  const int need = ckpt_gpu_min_devices();
  if (have < need) {
    std::printf("SKIPPED: %d CUDA device(s) here, this test needs %d\n", have, need);
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
