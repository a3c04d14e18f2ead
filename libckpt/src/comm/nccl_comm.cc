// comm/nccl_comm.cc: Comm over NCCL (ckpt/nccl.h). A non-blocking communicator on a stream of
// its own; every wait polls the communicator's async error and a deadline, and aborts it
// (ncclCommAbort) on an error or a timeout, so no rank waits forever for a failed peer.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/files.h"
#include "ckpt/nccl.h"
#include "cuda/cuda_util.h"

namespace ckpt::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

[[noreturn]] void Fail(const std::string& what, ErrorCode code = ErrorCode::kComm) { throw Error(code, what); }

void CheckCuda(cudaError_t rc, const std::string& what) { cuda_util::Check(rc, what, ErrorCode::kComm); }

std::string NcclError(ncclResult_t rc, ncclComm_t comm) {
  std::string s = std::string(ncclGetErrorString(rc));
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += " (" + std::string(last) + ")";
  return s;
}

std::optional<ncclDataType_t> NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return ncclFloat64;
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat16: return ncclFloat16;
    case DType::kBFloat16: return ncclBfloat16;
    case DType::kInt8: return ncclInt8;
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt8: return ncclUint8;
    default: return std::nullopt;
  }
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

std::string Millis(milliseconds t) { return std::to_string(t.count()) + " ms"; }

// Polls `comm` until its pending operation is done. On an error or past `deadline` the
// communicator is aborted and *comm set to null before the throw.
void WaitReady(ncclComm_t& comm, Clock::time_point deadline, milliseconds timeout, const std::string& what) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) state = rc;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress || Clock::now() > deadline) {
      const std::string why = state != ncclInProgress
                                  ? NcclError(state, comm)
                                  : "no progress after " + Millis(timeout) + " (a rank failed or never joined)";
      (void)ncclCommAbort(comm);
      comm = nullptr;
      Fail("nccl: " + what + ": " + why + "; the communicator is aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// A device made current and checked usable (its context made): errors here are this rank's.
int UsableDevice(int device) {
  if (device < 0) CheckCuda(cudaGetDevice(&device), "nccl: cudaGetDevice (no usable CUDA device?)");
  cuda_util::DeviceGuard guard(device, ErrorCode::kComm);
  CheckCuda(cudaFree(nullptr), "nccl: initialising CUDA on device " + std::to_string(device));
  return device;
}

ncclComm_t InitComm(const ncclUniqueId& id, int rank, int size, int device, milliseconds timeout) {
  cuda_util::DeviceGuard guard(device, ErrorCode::kComm);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    const std::string why = NcclError(rc, comm);
    if (comm) (void)ncclCommAbort(comm);
    Fail("nccl: ncclCommInitRankConfig (rank " + std::to_string(rank) + " of " + std::to_string(size) + "): " + why);
  }
  WaitReady(comm, Clock::now() + timeout, timeout, "ncclCommInitRankConfig");
  return comm;
}

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, int device, milliseconds timeout, Comm* host, std::unique_ptr<Comm> owned_host)
      : comm_(comm), device_(device), timeout_(timeout), host_(host), owned_host_(std::move(owned_host)) {
    if (owned_host_) host_ = owned_host_.get();
    ncclResult_t rc = ncclCommUserRank(comm_, &rank_);
    if (rc == ncclSuccess) rc = ncclCommCount(comm_, &size_);
    if (rc != ncclSuccess) Abort("ncclCommUserRank/ncclCommCount: " + NcclError(rc, comm_));
    cuda_util::DeviceGuard guard(device_, ErrorCode::kComm);
    const cudaError_t made = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (made != cudaSuccess) Abort("cudaStreamCreateWithFlags: " + cuda_util::Describe(made));
  }

  ~NcclComm() override {
    int previous = device_;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    if (comm_) {
      // Finalize flushes outstanding work; a finalize that fails or stalls is aborted instead.
      const ncclResult_t rc = ncclCommFinalize(comm_);
      bool clean = rc == ncclSuccess || rc == ncclInProgress;
      const auto deadline = Clock::now() + timeout_;
      while (clean) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
        if (state == ncclSuccess) break;
        if (state != ncclInProgress || Clock::now() > deadline) clean = false;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      if (clean) {
        (void)ncclCommDestroy(comm_);
      } else {
        (void)ncclCommAbort(comm_);
      }
    }
    for (void* p : scratch_)
      if (p) (void)cudaFree(p);
    if (stream_) (void)cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
    if (switched) (void)cudaSetDevice(previous);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void Barrier() override {
    if (host_) return host_->Barrier();
    int32_t one = 1;
    AllReduce(&one, 1, DType::kInt32, ReduceOp::kSum);
  }

  std::vector<ByteBuffer> Gather(std::span<const uint8_t> mine, int root) override {
    if (host_) return host_->Gather(mine, root);
    CheckRoot(root, "Gather");
    std::vector<uint64_t> sizes(static_cast<std::size_t>(size_));
    const uint64_t n = mine.size();
    AllGatherInto(&n, sizes.data(), sizeof n);
    std::vector<ByteBuffer> out;
    if (rank_ == root) {
      out.resize(static_cast<std::size_t>(size_));
      std::vector<std::size_t> offsets(static_cast<std::size_t>(size_) + 1, 0);
      for (int r = 0; r < size_; ++r) offsets[r + 1] = offsets[r] + (r == root ? 0 : sizes[r]);
      uint8_t* recv = Scratch(1, offsets.back());
      Run("Gather", [&] {
        ncclResult_t rc = ncclGroupStart();
        for (int r = 0; r < size_ && rc == ncclSuccess; ++r) {
          if (r != root && sizes[r] > 0) rc = ncclRecv(recv + offsets[r], sizes[r], ncclUint8, r, comm_, stream_);
        }
        const ncclResult_t end = ncclGroupEnd();
        return rc != ncclSuccess ? rc : end;
      });
      for (int r = 0; r < size_; ++r) {
        if (r == root) {
          out[r].assign(mine.begin(), mine.end());
        } else {
          out[r].resize(sizes[r]);
          CopyOut(out[r].data(), recv + offsets[r], sizes[r]);
        }
      }
    } else if (!mine.empty()) {
      uint8_t* send = Scratch(0, mine.size());
      CopyIn(send, mine.data(), mine.size());
      Run("Gather", [&] { return ncclSend(send, mine.size(), ncclUint8, root, comm_, stream_); });
    }
    return out;
  }

  void Broadcast(ByteBuffer& buffer, int root) override {
    if (host_) return host_->Broadcast(buffer, root);
    CheckRoot(root, "Broadcast");
    uint64_t n = buffer.size();
    BroadcastRaw(&n, sizeof n, root);
    if (rank_ != root) buffer.resize(n);
    BroadcastRaw(buffer.data(), n, root);
  }

  std::vector<ByteBuffer> AllGather(std::span<const uint8_t> mine) override {
    if (host_) return host_->AllGather(mine);
    return Comm::AllGather(mine);
  }

  void AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    const auto type = NcclType(dtype);
    if (!type) return HostOnly(data, "AllReduce", dtype, [&] { Comm::AllReduce(data, count, dtype, op); });
    if (count == 0) return;
    const std::size_t bytes = count * DTypeSize(dtype);
    void* d = OnDevice(data) ? data : CopyIn(Scratch(0, bytes), data, bytes);
    Run("ncclAllReduce", [&] { return ncclAllReduce(d, d, count, *type, NcclOp(op), comm_, stream_); });
    if (d != data) CopyOut(data, d, bytes);
  }

  void ReduceScatter(const void* send, void* recv, std::size_t block_count, DType dtype, ReduceOp op) override {
    const auto type = NcclType(dtype);
    if (!type) {
      return HostOnly(recv, "ReduceScatter", dtype, [&] { Comm::ReduceScatter(send, recv, block_count, dtype, op); });
    }
    if (block_count == 0) return;
    const std::size_t block = block_count * DTypeSize(dtype);
    const void* s = OnDevice(send) ? send : CopyIn(Scratch(0, block * size_), send, block * size_);
    void* r = OnDevice(recv) ? recv : Scratch(1, block);
    Run("ncclReduceScatter", [&] { return ncclReduceScatter(s, r, block_count, *type, NcclOp(op), comm_, stream_); });
    if (r != recv) CopyOut(recv, r, block);
  }

  void AllGatherInto(const void* send, void* recv, std::size_t block_bytes) override {
    if (block_bytes == 0) return;
    const void* s = OnDevice(send) ? send : CopyIn(Scratch(0, block_bytes), send, block_bytes);
    void* r = OnDevice(recv) ? recv : Scratch(1, block_bytes * size_);
    Run("ncclAllGather", [&] { return ncclAllGather(s, r, block_bytes, ncclUint8, comm_, stream_); });
    if (r != recv) CopyOut(recv, r, block_bytes * size_);
  }

  std::unique_ptr<Comm> Split(int color, int key) override {
    std::unique_ptr<Comm> host = host_ ? host_->Split(color, key) : nullptr;
    Live("Split");
    cuda_util::DeviceGuard guard(device_, ErrorCode::kComm);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    const ncclResult_t rc = ncclCommSplit(comm_, color, key, &child, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) Abort("ncclCommSplit: " + NcclError(rc, comm_));
    WaitReady(comm_, Clock::now() + timeout_, timeout_, "ncclCommSplit");
    if (!child) Fail("nccl: ncclCommSplit gave no communicator");
    WaitReady(child, Clock::now() + timeout_, timeout_, "ncclCommSplit (the new communicator)");
    return std::make_unique<NcclComm>(child, device_, timeout_, nullptr, std::move(host));
  }

 private:
  void CheckRoot(int root, const char* what) const {
    if (root < 0 || root >= size_) {
      Fail(std::string("nccl: ") + what + ": root " + std::to_string(root) + " outside the group of " +
               std::to_string(size_),
           ErrorCode::kInvalidArgument);
    }
  }
  void Live(const std::string& what) const {
    if (!comm_) Fail("nccl: " + what + ": the communicator was aborted by an earlier error or timeout");
  }
  [[noreturn]] void Abort(const std::string& why) {
    if (comm_) (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    Fail("nccl: " + why + "; the communicator is aborted");
  }

  // Device memory that NCCL can use directly (device or managed); anything else is staged.
  static bool OnDevice(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  // Dtypes NCCL has no type for: the generic collectives, over host memory only.
  template <typename Fn>
  void HostOnly(const void* p, const char* what, DType dtype, Fn&& fn) {
    if (OnDevice(p)) {
      Fail(std::string("nccl: ") + what + " over dtype " + std::string(DTypeName(dtype)) +
               " in device memory: NCCL has no such type",
           ErrorCode::kUnsupported);
    }
    fn();
  }

  uint8_t* Scratch(int which, std::size_t bytes) {
    if (scratch_bytes_[which] < bytes) {
      cuda_util::DeviceGuard guard(device_, ErrorCode::kComm);
      if (scratch_[which]) (void)cudaFree(scratch_[which]);
      scratch_[which] = nullptr;
      scratch_bytes_[which] = 0;
      CheckCuda(cudaMalloc(&scratch_[which], bytes), "nccl: cudaMalloc of " + std::to_string(bytes) + " bytes of scratch");
      scratch_bytes_[which] = bytes;
    }
    return static_cast<uint8_t*>(scratch_[which]);
  }
  void* CopyIn(void* device, const void* host, std::size_t n) {
    cuda_util::DeviceGuard guard(device_, ErrorCode::kComm);
    CheckCuda(cudaMemcpyAsync(device, host, n, cudaMemcpyHostToDevice, stream_), "nccl: staging to the device");
    return device;
  }
  void CopyOut(void* host, const void* device, std::size_t n) {
    cuda_util::DeviceGuard guard(device_, ErrorCode::kComm);
    CheckCuda(cudaMemcpyAsync(host, device, n, cudaMemcpyDeviceToHost, stream_), "nccl: staging to the host");
    Sync("staging to the host", Clock::now() + timeout_);
  }
  void BroadcastRaw(void* host, std::size_t n, int root) {
    if (n == 0) return;
    uint8_t* d = Scratch(0, n);
    if (rank_ == root) CopyIn(d, host, n);
    Run("ncclBroadcast", [&] { return ncclBroadcast(d, d, n, ncclUint8, root, comm_, stream_); });
    CopyOut(host, d, n);
  }

  // Enqueues an NCCL call on the stream and waits for it, polling errors and the deadline.
  template <typename Enqueue>
  void Run(const std::string& what, Enqueue&& enqueue) {
    Live(what);
    cuda_util::DeviceGuard guard(device_, ErrorCode::kComm);
    const auto deadline = Clock::now() + timeout_;
    const ncclResult_t rc = enqueue();
    if (rc != ncclSuccess && rc != ncclInProgress) Abort(what + ": " + NcclError(rc, comm_));
    WaitReady(comm_, deadline, timeout_, what);
    Sync(what, deadline);
  }
  // Waits for the stream; a hung collective (a peer gone) is aborted at the deadline.
  void Sync(const std::string& what, Clock::time_point deadline) {
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) Abort(what + ": " + cuda_util::Describe(e));
      if (comm_) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
          Abort(what + ": " + NcclError(state, comm_));
        }
      }
      if (Clock::now() > deadline) {
        Abort(what + ": not finished after " + Millis(timeout_) + " (a rank failed or stopped calling collectives)");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  ncclComm_t comm_;
  int device_;
  milliseconds timeout_;
  Comm* host_;
  std::unique_ptr<Comm> owned_host_;
  int rank_ = 0, size_ = 0;
  cudaStream_t stream_ = nullptr;
  void* scratch_[2] = {nullptr, nullptr};
  std::size_t scratch_bytes_[2] = {0, 0};
};

std::string IdText(const ncclUniqueId& id) { return std::string(id.internal, sizeof id.internal); }

ncclUniqueId MakeId() {
  ncclUniqueId id{};
  const ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) Fail("nccl: ncclGetUniqueId: " + std::string(ncclGetErrorString(rc)));
  return id;
}

}  // namespace

std::unique_ptr<Comm> OverComm(Comm& host, const Options& options) {
  // Every rank checks its device first and they agree, so that one rank without a usable GPU
  // fails every rank at once rather than after the timeout.
  int device = -1;
  ByteBuffer id_message;
  std::string failure;
  try {
    device = UsableDevice(options.device);
    if (host.rank() == 0) {
      const std::string text = IdText(MakeId());
      id_message.assign(text.begin(), text.end());
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const std::string all = host.AgreeOnErrors(failure);
  if (!all.empty()) Fail("nccl: bootstrap over the host Comm failed:\n" + all);
  host.Broadcast(id_message, 0);
  ncclUniqueId id{};
  if (id_message.size() != sizeof id.internal) Fail("nccl: rank 0 sent an NCCL unique id of the wrong size");
  std::memcpy(id.internal, id_message.data(), sizeof id.internal);
  ncclComm_t comm = nullptr;
  failure.clear();
  try {
    comm = InitComm(id, host.rank(), host.size(), device, options.timeout);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  const std::string init = host.AgreeOnErrors(failure);
  if (!init.empty()) {
    if (comm) (void)ncclCommAbort(comm);
    Fail("nccl: ncclCommInitRankConfig failed:\n" + init);
  }
  return std::make_unique<NcclComm>(comm, device, options.timeout, &host, nullptr);
}

std::unique_ptr<Comm> OverFile(const std::filesystem::path& file, int rank, int size, const Options& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    Fail("nccl: OverFile: rank " + std::to_string(rank) + " of " + std::to_string(size), ErrorCode::kInvalidArgument);
  }
  ncclUniqueId id{};
  if (rank == 0) {
    bool exists = true;
    try {
      (void)files::ReadSmallFile(file, sizeof id.internal);
    } catch (const Error& e) {
      exists = e.code() != ErrorCode::kNotFound;  // too large or unreadable: there all the same
    }
    if (exists) {
      Fail("nccl: " + file.string() + " already exists (left by an earlier job?): remove it, or use a fresh path per job",
           ErrorCode::kAlreadyExists);
    }
    (void)UsableDevice(options.device);
    id = MakeId();
    files::CommitFile(file, IdText(id));
  } else {
    const auto deadline = Clock::now() + options.timeout;
    for (;;) {
      try {
        const std::string text = files::ReadSmallFile(file, sizeof id.internal);
        if (text.size() != sizeof id.internal) {
          Fail("nccl: " + file.string() + " holds " + std::to_string(text.size()) + " bytes, not an NCCL unique id (" +
               std::to_string(sizeof id.internal) + ")");
        }
        std::memcpy(id.internal, text.data(), sizeof id.internal);
        break;
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kNotFound) throw;
      }
      if (Clock::now() > deadline) {
        Fail("nccl: rank " + std::to_string(rank) + ": no NCCL unique id at " + file.string() + " after " +
             Millis(options.timeout) + " (is rank 0 running, and does every rank see that directory?)");
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  const int device = UsableDevice(options.device);
  ncclComm_t comm = InitComm(id, rank, size, device, options.timeout);
  auto out = std::make_unique<NcclComm>(comm, device, options.timeout, nullptr, nullptr);
  if (rank == 0) {
    std::error_code ec;  // every rank has joined, so every rank has read it
    std::filesystem::remove(file, ec);
  }
  return out;
}

}  // namespace ckpt::nccl
