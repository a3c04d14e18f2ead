// Runs everywhere the CUDA backend is built, device or not: ckpt::cuda (and ckpt::nccl,
// linked in too) link, and answer without touching a device.
#include <doctest/doctest.h>

#include "ckpt/ckpt.h"
#include "ckpt/cuda.h"

using namespace ckpt;

TEST_CASE("ckpt::cuda links and makes a backend without a device") {
  static_assert(CKPT_HAVE_CUDA == 1, "config.h must say CUDA is built");
  CHECK(cuda::DeviceCount() >= 0);
  CHECK(cuda::HaveCuFile() == (CKPT_EXPECT_CUFILE != 0));
  auto backend = cuda::MakeBackend();
  CHECK(backend->name() == "cuda");
  const cuda::PoolStats stats = cuda::Stats(*backend);
  CHECK(stats.pairs == 0);  // nothing pinned until a device chunk is copied
  CHECK(stats.pinned_bytes == 0);
  cuda::Options tiny;
  tiny.buffer_bytes = 100;
  CHECK_THROWS_AS(cuda::MakeBackend(tiny), Error);
  // Register() is what a program calls; it replaces any backend registered before.
  auto registered = cuda::Register();
  CHECK(GetDeviceBackend() == registered);
  SetDeviceBackend(nullptr);
  CHECK(GetDeviceBackend() == nullptr);
}
