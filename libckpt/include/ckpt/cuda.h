// ckpt/cuda.h: the CUDA backend of ckpt/device.h (link ckpt::cuda; built when CMake finds
// the CUDA toolkit, CKPT_WITH_CUDA). No CUDA type appears here.
//
// A staging pair is two pinned host buffers (cudaHostAlloc, portable) and, per device it
// copies from or to, a non-blocking stream of ckpt's own and an event per buffer: copies are
// cudaMemcpyAsync on that stream, waited for on the event. Pairs are allocated once, pooled
// and reused by every later save and load (one pair per thread copying at once: the save
// thread of each rank, and each of LoadOptions::io_threads readers that meets a device chunk).
// Staging memory is therefore 2 x buffer_bytes x (the most threads that ever copied at once).
//
// The calling thread's current device is restored after every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "ckpt/device.h"
#include "ckpt/metadata.h"

namespace ckpt::cuda {

struct Options {
  // Bytes of each of the two pinned buffers of a staging pair (at least 4 KiB).
  std::size_t buffer_bytes = std::size_t{32} << 20;
};

// A CUDA backend (not registered). Throws kInvalidArgument for bad options.
CKPT_API std::shared_ptr<DeviceBackend> MakeBackend(const Options& options = {});
// Makes a backend and registers it with SetDeviceBackend; returns it.
CKPT_API std::shared_ptr<DeviceBackend> Register(const Options& options = {});

// What a backend has allocated: staging pairs made (pinned once each), pinned bytes held,
// and how many times a pair was handed out (reuses = acquires - pairs).
struct PoolStats {
  std::size_t pairs = 0;
  std::size_t pinned_bytes = 0;
  std::size_t acquires = 0;
};
// REQUIRES: `backend` was made by MakeBackend or Register.
CKPT_API PoolStats Stats(const DeviceBackend& backend);

// Number of CUDA devices usable here: 0 with no device or no driver (never throws).
CKPT_API int DeviceCount();
// Whether cuFile (GPUDirect Storage) was found when ckpt was built. ckpt hashes every byte
// it writes or reads on the host, so device chunks go through the pinned staging buffers
// either way; see docs/training.md (GPU).
CKPT_API bool HaveCuFile();

// Statistics (FORMAT.md §7: min, max, mean and l2 over the finite elements, NaN and Inf
// counts) of `count` float32 elements at `data` on `device`, computed by a CUDA kernel: the
// alternative to the host computing them from the staging buffer, measured by
// scripts/gpu-check.sh. Mean and l2 are summed in double in another order than the host's,
// so they agree to rounding, not bit for bit; counts, min and max are exact.
CKPT_API ChunkStats DeviceStatsFloat32(const void* data, std::size_t count, int device);

}  // namespace ckpt::cuda
