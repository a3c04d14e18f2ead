// cuda/cuda_backend.cc: ckpt/device.h over the CUDA runtime (ckpt/cuda.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ckpt/cuda.h"
#include "ckpt/error.h"
#include "cuda/cuda_util.h"
#include "cuda/stats_kernel.h"

namespace ckpt::cuda {
namespace {

using cuda_util::Check;
using cuda_util::DeviceGuard;

// Two pinned buffers and, per device used, a stream and an event per buffer. Made once.
struct Pair {
  struct PerDevice {
    cudaStream_t stream = nullptr;
    cudaEvent_t done[2] = {nullptr, nullptr};
  };
  std::size_t bytes = 0;
  void* host[2] = {nullptr, nullptr};
  std::map<int, PerDevice> devices;

  explicit Pair(std::size_t n) : bytes(n) {
    for (void*& h : host) {
      const cudaError_t rc = cudaHostAlloc(&h, n, cudaHostAllocPortable);
      if (rc != cudaSuccess) {
        Release();
        Check(rc, "cudaHostAlloc(" + std::to_string(n) + " bytes of pinned staging)");
      }
    }
  }
  ~Pair() { Release(); }
  Pair(const Pair&) = delete;
  Pair& operator=(const Pair&) = delete;

  // Errors are ignored here: this runs on teardown, possibly after the CUDA runtime's.
  void Release() {
    for (auto& [device, d] : devices) {
      int previous = 0;
      const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device &&
                            cudaSetDevice(device) == cudaSuccess;
      for (cudaEvent_t e : d.done)
        if (e) (void)cudaEventDestroy(e);
      if (d.stream) (void)cudaStreamDestroy(d.stream);
      if (switched) (void)cudaSetDevice(previous);
    }
    devices.clear();
    for (void*& h : host) {
      if (h) (void)cudaFreeHost(h);
      h = nullptr;
    }
    (void)cudaGetLastError();
  }

  // REQUIRES: `device` is current.
  PerDevice& On(int device) {
    auto it = devices.find(device);
    if (it != devices.end()) return it->second;
    PerDevice d;
    Check(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    for (cudaEvent_t& e : d.done) {
      const cudaError_t rc = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
      if (rc != cudaSuccess) {
        devices.emplace(device, d);  // Release() destroys what was made
        Check(rc, "cudaEventCreateWithFlags");
      }
    }
    return devices.emplace(device, d).first->second;
  }
};

struct Pool {
  std::mutex mu;
  std::vector<std::unique_ptr<Pair>> idle;
  PoolStats stats;
};

class Staging final : public DeviceStaging {
 public:
  Staging(std::shared_ptr<Pool> pool, std::unique_ptr<Pair> pair) : pool_(std::move(pool)), pair_(std::move(pair)) {}
  ~Staging() override {
    for (int s = 0; s < 2; ++s) {
      if (pending_[s] < 0) continue;
      // The copy must end before the buffer goes back to the pool.
      (void)cudaEventSynchronize(pair_->devices.at(pending_[s]).done[s]);
    }
    (void)cudaGetLastError();
    std::lock_guard lock(pool_->mu);
    pool_->idle.push_back(std::move(pair_));
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  std::size_t buffer_bytes() const override { return pair_->bytes; }
  void* buffer(int slot) override { return pair_->host[Slot(slot)]; }

  void CopyToHostAsync(int slot, const void* src, std::size_t n, int device) override {
    Enqueue(slot, pair_->host[Slot(slot)], src, n, device, cudaMemcpyDeviceToHost, "device to host");
  }
  void CopyToDeviceAsync(int slot, void* dst, std::size_t n, int device) override {
    Enqueue(slot, dst, pair_->host[Slot(slot)], n, device, cudaMemcpyHostToDevice, "host to device");
  }
  void Wait(int slot) override {
    const int s = Slot(slot);
    const int device = pending_[s];
    if (device < 0) return;
    pending_[s] = -1;
    Check(cudaEventSynchronize(pair_->devices.at(device).done[s]),
          "cuda: waiting for the staging copy on device " + std::to_string(device));
  }

 private:
  static int Slot(int slot) {
    if (slot != 0 && slot != 1) throw Error(ErrorCode::kInternal, "cuda staging: slot " + std::to_string(slot));
    return slot;
  }
  void Enqueue(int slot, void* dst, const void* src, std::size_t n, int device, cudaMemcpyKind kind,
               const char* what) {
    const int s = Slot(slot);
    if (n > pair_->bytes) {
      throw Error(ErrorCode::kInternal, "cuda staging: a copy of " + std::to_string(n) + " bytes into a buffer of " +
                                            std::to_string(pair_->bytes));
    }
    if (pending_[s] >= 0) throw Error(ErrorCode::kInternal, "cuda staging: slot " + std::to_string(s) + " is busy");
    DeviceGuard guard(device);
    Pair::PerDevice& d = pair_->On(device);
    const std::string where = std::string("cuda: ") + what + " copy of " + std::to_string(n) + " bytes on device " +
                              std::to_string(device);
    Check(cudaMemcpyAsync(dst, src, n, kind, d.stream), where);
    Check(cudaEventRecord(d.done[s], d.stream), where);
    pending_[s] = device;
  }

  std::shared_ptr<Pool> pool_;
  std::unique_ptr<Pair> pair_;
  int pending_[2] = {-1, -1};  // the device of the copy in flight per slot
};

// Throws kInvalidArgument unless [ptr, ptr + n) (n > 0) is memory of `device` (both ends
// checked: device or managed memory of that device).
void CheckDeviceMemory(const void* ptr, std::size_t n, int device, const std::string& what) {
  const int devices = DeviceCount();
  if (device >= devices) {
    throw Error(ErrorCode::kInvalidArgument, what + ": there are " + std::to_string(devices) + " CUDA devices here");
  }
  for (const void* p : {ptr, static_cast<const void*>(static_cast<const uint8_t*>(ptr) + (n - 1))}) {
    cudaPointerAttributes a{};
    Check(cudaPointerGetAttributes(&a, p), what + ": cudaPointerGetAttributes", ErrorCode::kInvalidArgument);
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
      throw Error(ErrorCode::kInvalidArgument,
                  what + ": the memory is not device memory (host memory is a chunk with device kHostDevice)");
    }
    if (a.type == cudaMemoryTypeDevice && a.device != device) {
      throw Error(ErrorCode::kInvalidArgument, what + ": the memory belongs to device " + std::to_string(a.device));
    }
  }
}

class Backend final : public DeviceBackend {
 public:
  explicit Backend(const Options& options) : options_(options), pool_(std::make_shared<Pool>()) {}

  std::string name() const override { return "cuda"; }

  void CheckMemory(const void* ptr, std::size_t n, int device, const std::string& what) override {
    CheckDeviceMemory(ptr, n, device, what);
  }

  std::unique_ptr<DeviceStaging> AcquireStaging() override {
    std::unique_ptr<Pair> pair;
    {
      std::lock_guard lock(pool_->mu);
      ++pool_->stats.acquires;
      if (!pool_->idle.empty()) {
        pair = std::move(pool_->idle.back());
        pool_->idle.pop_back();
      }
    }
    if (!pair) {
      pair = std::make_unique<Pair>(options_.buffer_bytes);
      std::lock_guard lock(pool_->mu);
      ++pool_->stats.pairs;
      pool_->stats.pinned_bytes += 2 * options_.buffer_bytes;
    }
    return std::make_unique<Staging>(pool_, std::move(pair));
  }

  PoolStats stats() const {
    std::lock_guard lock(pool_->mu);
    return pool_->stats;
  }

 private:
  Options options_;
  std::shared_ptr<Pool> pool_;
};

}  // namespace

std::shared_ptr<DeviceBackend> MakeBackend(const Options& options) {
  if (options.buffer_bytes < 4096) {
    throw Error(ErrorCode::kInvalidArgument, "ckpt::cuda: buffer_bytes " + std::to_string(options.buffer_bytes) +
                                                 " is under 4096");
  }
  return std::make_shared<Backend>(options);
}

std::shared_ptr<DeviceBackend> Register(const Options& options) {
  auto backend = MakeBackend(options);
  SetDeviceBackend(backend);
  return backend;
}

PoolStats Stats(const DeviceBackend& backend) {
  const auto* b = dynamic_cast<const Backend*>(&backend);
  if (!b) throw Error(ErrorCode::kInvalidArgument, "ckpt::cuda::Stats: backend '" + backend.name() + "' is not ckpt::cuda's");
  return b->stats();
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

bool HaveCuFile() { return CKPT_HAVE_CUFILE != 0; }

ChunkStats DeviceStatsFloat32(const void* data, std::size_t count, int device) {
  ChunkStats out;
  out.min = out.max = out.mean = std::numeric_limits<double>::quiet_NaN();
  if (count == 0) return out;
  CheckDeviceMemory(data, count * sizeof(float), device, "ckpt::cuda::DeviceStatsFloat32");
  DeviceGuard guard(device);
  int sms = 0;
  Check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const std::size_t wanted = (count + kernels::kStatsThreads - 1) / kernels::kStatsThreads;
  const int blocks = static_cast<int>(std::min<std::size_t>(wanted, static_cast<std::size_t>(std::max(sms, 1)) * 8));
  kernels::StatsPartial* partials = nullptr;
  Check(cudaMalloc(reinterpret_cast<void**>(&partials), sizeof(kernels::StatsPartial) * blocks), "cudaMalloc");
  std::vector<kernels::StatsPartial> host(static_cast<std::size_t>(blocks));
  cudaStream_t stream = nullptr;
  cudaError_t rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (rc == cudaSuccess) {
    rc = static_cast<cudaError_t>(
        kernels::LaunchStatsFloat32(static_cast<const float*>(data), count, partials, blocks, stream));
  }
  if (rc == cudaSuccess) {
    rc = cudaMemcpyAsync(host.data(), partials, sizeof(kernels::StatsPartial) * blocks, cudaMemcpyDeviceToHost, stream);
  }
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream);
  if (stream) (void)cudaStreamDestroy(stream);
  (void)cudaFree(partials);
  Check(rc, "ckpt::cuda::DeviceStatsFloat32 on device " + std::to_string(device));
  double sum = 0, sumsq = 0;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const kernels::StatsPartial& p : host) {
    sum += p.sum;
    sumsq += p.sumsq;
    out.nan_count += static_cast<int64_t>(p.nan);
    out.inf_count += static_cast<int64_t>(p.inf);
    out.finite_count += static_cast<int64_t>(p.finite);
    if (p.finite > 0) {
      lo = std::min(lo, static_cast<double>(p.min));
      hi = std::max(hi, static_cast<double>(p.max));
    }
  }
  if (out.finite_count > 0) {
    out.min = lo;
    out.max = hi;
    out.mean = sum / static_cast<double>(out.finite_count);
    out.l2 = std::sqrt(sumsq);
  }
  return out;
}

}  // namespace ckpt::cuda
