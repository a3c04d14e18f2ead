// ckpt-gpu-bench: the figures scripts/gpu-check.sh prints. cudaMemcpy's pinned bandwidth
// (device to host, host to device), ckpt::cuda's staging pipeline in both directions against
// it, Save and Load of the same state from device and from host memory, and the statistics of
// a float32 chunk by the CUDA kernel. Usage: ckpt-gpu-bench [--mib N] [--dir DIR] [--keep PATH]
// --keep: also save the state from device memory to PATH and leave it there (for ckpt-verify).
// Exits 77 (skipped) where there is no CUDA device.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/ckpt.h"
#include "ckpt/cuda.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

void Ok(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "ckpt-gpu-bench: %s: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double GBs(std::size_t bytes, double s) { return static_cast<double>(bytes) / s / 1e9; }

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 1024;
  fs::path dir = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  fs::path keep;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (a == "--keep" && i + 1 < argc) {
      keep = argv[++i];
    } else {
      std::fprintf(stderr, "usage: ckpt-gpu-bench [--mib N] [--dir DIR] [--keep PATH]\n");
      return 2;
    }
  }
  if (ckpt::cuda::DeviceCount() == 0) {
    std::printf("SKIPPED: ckpt-gpu-bench: no CUDA device here\n");
    return 77;
  }
  const std::size_t bytes = mib << 20;
  void* dev = nullptr;
  void* pinned = nullptr;
  Ok(cudaMalloc(&dev, bytes), "cudaMalloc");
  Ok(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault), "cudaHostAlloc");
  std::memset(pinned, 0x3c, bytes);  // small finite floats
  Ok(cudaMemcpy(dev, pinned, bytes, cudaMemcpyHostToDevice), "warm-up");

  auto t0 = Clock::now();
  Ok(cudaMemcpy(pinned, dev, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  const double pin_d2h = GBs(bytes, Seconds(t0));
  t0 = Clock::now();
  Ok(cudaMemcpy(dev, pinned, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  const double pin_h2d = GBs(bytes, Seconds(t0));

  ckpt::cuda::Options options;
  auto backend = ckpt::cuda::Register(options);
  double stage_d2h = 0, stage_h2d = 0;
  {
    auto staging = backend->AcquireStaging();
    const std::size_t piece = staging->buffer_bytes();
    // The whole buffer through the two staging slots, each waited for before it is reused.
    const auto pass = [&](bool to_host) {
      auto* d = static_cast<uint8_t*>(dev);
      bool busy[2] = {false, false};
      const auto start = Clock::now();
      int slot = 0;
      for (std::size_t off = 0; off < bytes; off += piece, slot ^= 1) {
        if (busy[slot]) staging->Wait(slot);
        const std::size_t n = std::min(piece, bytes - off);
        if (to_host) {
          staging->CopyToHostAsync(slot, d + off, n, 0);
        } else {
          staging->CopyToDeviceAsync(slot, d + off, n, 0);
        }
        busy[slot] = true;
      }
      for (int s = 0; s < 2; ++s)
        if (busy[s]) staging->Wait(s);
      return GBs(bytes, Seconds(start));
    };
    stage_d2h = pass(true);
    stage_h2d = pass(false);
  }
  std::printf("pinned cudaMemcpy   D2H %6.2f GB/s   H2D %6.2f GB/s   (%zu MiB)\n", pin_d2h, pin_h2d, mib);
  std::printf("ckpt staging        D2H %6.2f GB/s   H2D %6.2f GB/s   (%.0f%% / %.0f%% of pinned; 2 x %zu MiB buffers)\n",
              stage_d2h, stage_h2d, 100 * stage_d2h / pin_d2h, 100 * stage_h2d / pin_h2d, options.buffer_bytes >> 20);

  // Save and Load of one float32 tensor of `bytes`, from device and from host memory.
  const auto count = static_cast<int64_t>(bytes / 4);
  ckpt::SingleComm comm;
  ckpt::StateDict on_device, on_host;
  ckpt::Tensor t = ckpt::Tensor::Full(ckpt::DType::kFloat32, {count}, dev);
  t.chunks[0].device = 0;
  on_device.Add("w", std::move(t));
  on_host.Add("w", ckpt::Tensor::Full(ckpt::DType::kFloat32, {count}, pinned));
  const fs::path base = dir / ("ckpt-gpu-bench-" + std::to_string(::getpid()));
  ckpt::SaveOptions overwrite;
  overwrite.overwrite = true;
  double save[2], load[2];
  for (int host = 0; host < 2; ++host) {
    ckpt::StateDict& sd = host ? on_host : on_device;
    t0 = Clock::now();
    ckpt::Save(base, sd, comm, overwrite);
    save[host] = GBs(bytes, Seconds(t0));
    t0 = Clock::now();
    ckpt::Load(base, sd, comm);
    load[host] = GBs(bytes, Seconds(t0));
  }
  ckpt::files::RemoveCheckpoint(base);
  std::printf("Save  device %6.2f GB/s   host %6.2f GB/s   (%s; hashing and stats on the host in both)\n", save[0],
              save[1], dir.c_str());
  std::printf("Load  device %6.2f GB/s   host %6.2f GB/s   (verified reads)\n", load[0], load[1]);

  // Async save from device memory: the time SaveAsync holds the caller (the snapshot, device
  // to staging pool through the pinned pair) against a sync Save of the same state; the
  // first SaveAsync (fresh staging pages) apart from the second (reused ones).
  {
    auto pool = std::make_shared<ckpt::StagingPool>();
    ckpt::AsyncSaveOptions ao;
    ao.overwrite = true;
    ao.staging = pool;
    double blocked[2] = {0, 0}, total = 0;
    for (int i = 0; i < 2; ++i) {
      t0 = Clock::now();
      const ckpt::SaveHandle h = ckpt::SaveAsync(base, on_device, comm, ao);
      blocked[i] = Seconds(t0);
      h.Wait();
      total = Seconds(t0);
    }
    t0 = Clock::now();
    ckpt::Save(base, on_device, comm, overwrite);
    const double sync_s = Seconds(t0);
    ckpt::files::RemoveCheckpoint(base);
    std::printf("async from device   blocked %.4f s first, %.4f s reused (%.1f%% of sync Save %.3f s; "
                "background save %.3f s; staging %.0f MiB host + %zu MiB pinned)\n",
                blocked[0], blocked[1], 100 * blocked[1] / sync_s, sync_s, total,
                static_cast<double>(pool->reserved_bytes()) / (1 << 20),
                ckpt::cuda::Stats(*backend).pinned_bytes >> 20);
  }

  // Statistics on the host: a Save of the bytes as float32 (hashed, statistics computed) and
  // as uint32 (hashed only), both from pinned host memory; the difference is their cost.
  {
    ckpt::StateDict as_u32;
    as_u32.Add("w", ckpt::Tensor::Full(ckpt::DType::kUInt32, {count}, pinned));
    double best[2] = {1e30, 1e30};
    for (int rep = 0; rep < 2; ++rep) {
      for (int k = 0; k < 2; ++k) {
        t0 = Clock::now();
        ckpt::Save(base, k ? as_u32 : on_host, comm, overwrite);
        best[k] = std::min(best[k], Seconds(t0));
      }
    }
    ckpt::files::RemoveCheckpoint(base);
    const double host_stats = best[0] > best[1] ? GBs(bytes, best[0] - best[1]) : 0;
    std::printf("stats on the host   Save float32 %.3f s, uint32 %.3f s: stats %.2f GB/s (0: below the noise)\n",
                best[0], best[1], host_stats);
  }

  (void)ckpt::cuda::DeviceStatsFloat32(dev, 1024, 0);  // warm-up
  t0 = Clock::now();
  const ckpt::ChunkStats s = ckpt::cuda::DeviceStatsFloat32(dev, static_cast<std::size_t>(count), 0);
  const double kernel = GBs(bytes, Seconds(t0));
  std::printf("stats kernel        %6.2f GB/s   (finite %lld; the host computes them inside Save above)\n", kernel,
              static_cast<long long>(s.finite_count));
  if (!keep.empty()) {
    t0 = Clock::now();
    ckpt::Save(keep, on_device, comm, overwrite);
    std::printf("kept                %s (%zu MiB saved from device memory in %.3f s)\n", keep.c_str(), mib,
                Seconds(t0));
  }
  ckpt::SetDeviceBackend(nullptr);
  Ok(cudaFreeHost(pinned), "cudaFreeHost");
  Ok(cudaFree(dev), "cudaFree");
  return 0;
}
