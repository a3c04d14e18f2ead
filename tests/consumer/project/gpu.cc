// A program that links the installed ckpt::cuda (and ckpt::nccl): it runs without a GPU.
#include <ckpt/cuda.h>
#ifdef WITH_NCCL
#include <ckpt/nccl.h>
#endif

#include <cstdio>

int main() {
  const int devices = ckpt::cuda::DeviceCount();  // 0 without a device or driver; never throws
  bool ok = devices >= 0;
#ifdef WITH_NCCL
  // Bootstrapping needs a device; referring to it is enough to link libckpt_nccl.
  auto* over_comm = &ckpt::nccl::OverComm;
  ok = ok && over_comm != nullptr;
#endif
  std::printf("consumer-gpu: %s (%d devices, cuFile %s)\n", ok ? "ok" : "FAILED", devices,
              ckpt::cuda::HaveCuFile() ? "built" : "not built");
  return ok ? 0 : 1;
}
