// checkpoint/async.cc: SaveAsync (ckpt/checkpoint.h): the snapshot into a staging pool, and
// one background thread per rank that runs the saves in order over the rank's own group.
//
// Ranks stay in step without messages of their own: every SaveAsync call, whether it
// returns or throws, queues exactly one job, and every job begins with an agreement over
// the background group in which a rank whose SaveAsync threw (or whose save was cancelled
// before it began) brings its reason. So the ranks' queues hold the same sequence of jobs,
// a failure on one rank fails that save on all, and no rank waits for a job another rank
// never queued. Inside a job the save is Save's protocol (checkpoint/save.h), agreed phase
// by phase, so every rank ends each job with the same outcome.
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "checkpoint/commit.h"
#include "checkpoint/save.h"
#include "checkpoint/staging.h"
#include "ckpt/device.h"
#include "ckpt/checkpoint.h"
#include "storage/pool.h"

namespace ckpt {

// ---- the staging pool --------------------------------------------------------------

struct StagingPool::Impl {
  explicit Impl(uint64_t limit) : capacity(limit) {}
  ~Impl() {
    for (auto& [size, data] : idle) Unmap(data, size);
  }
  static void Unmap(void* data, uint64_t size) { ::munmap(data, static_cast<std::size_t>(size)); }

  const uint64_t capacity;
  std::mutex mu;
  uint64_t reserved = 0, in_use = 0;
  std::multimap<uint64_t, void*> idle;  // free buffers, by size
};

StagingPool::StagingPool(uint64_t limit) : impl_(std::make_shared<Impl>(limit)) {}
StagingPool::~StagingPool() = default;

uint64_t StagingPool::capacity_bytes() const { return impl_->capacity; }
uint64_t StagingPool::reserved_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->reserved;
}
uint64_t StagingPool::in_use_bytes() const {
  std::lock_guard lock(impl_->mu);
  return impl_->in_use;
}
void StagingPool::Trim() {
  std::lock_guard lock(impl_->mu);
  for (auto& [size, data] : impl_->idle) {
    Impl::Unmap(data, size);
    impl_->reserved -= size;
  }
  impl_->idle.clear();
}

namespace internal {
namespace {

constexpr uint64_t kPage = 4096;
constexpr std::size_t kChunkAlign = 64;  // each chunk's copy starts on a cache line

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

std::string Mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return std::to_string(bytes) + " bytes (" + buf + ")";
}

}  // namespace

StagingLease::StagingLease(std::shared_ptr<StagingPool::Impl> pool, void* buffer, uint64_t bytes)
    : pool_(std::move(pool)), data_(buffer), size_(bytes) {}

StagingLease::~StagingLease() {
  std::lock_guard lock(pool_->mu);
  pool_->in_use -= size_;
  pool_->idle.emplace(size_, data_);
}

std::unique_ptr<StagingLease> StagingAccess::Acquire(StagingPool& pool, uint64_t bytes) {
  StagingPool::Impl& p = *pool.impl_;
  const uint64_t size = RoundUp(bytes, kPage);
  {
    std::lock_guard lock(p.mu);
    if (auto it = p.idle.lower_bound(size); it != p.idle.end()) {  // the smallest that fits
      const uint64_t got = it->first;
      void* data = it->second;
      p.idle.erase(it);
      p.in_use += got;
      return std::make_unique<StagingLease>(pool.impl_, data, got);
    }
    // Every free buffer is too small for this snapshot: none will serve it, release them.
    for (auto& [s, data] : p.idle) {
      StagingPool::Impl::Unmap(data, s);
      p.reserved -= s;
    }
    p.idle.clear();
    if (p.capacity - p.reserved < size) {
      throw Error(ErrorCode::kInvalidArgument,
                  "SaveAsync: the snapshot needs " + Mib(size) + " of staging; the pool of " + Mib(p.capacity) +
                      " has " + Mib(p.in_use) + " in use by saves in flight");
    }
    p.reserved += size;
    p.in_use += size;
  }
  void* data = ::mmap(nullptr, static_cast<std::size_t>(size), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
  if (data == MAP_FAILED) {
    std::lock_guard lock(p.mu);
    p.reserved -= size;
    p.in_use -= size;
    throw Error(ErrorCode::kInternal, "SaveAsync: cannot allocate " + Mib(size) + " of staging memory");
  }
  // No MADV_HUGEPAGE: with the kernel's THP defrag at "madvise" (the default), faulting in a
  // madvised region compacts memory first: measured here (ckpt-bench-async, a loaded machine),
  // the first 1.49 GB snapshot into fresh staging took 18.5 s with it and 4.1 s without.
  return std::make_unique<StagingLease>(pool.impl_, data, size);
}

// ---- the snapshot --------------------------------------------------------------------

void CopyChunkToStaging(const Chunk& chunk, void* staging, std::size_t bytes, DevicePipe& device) {
  if (chunk.device == kHostDevice) {
    std::memcpy(staging, chunk.data, bytes);
    return;
  }
  // A device chunk: through the backend's two staging buffers, the copy of one piece to the
  // host overlapping the memcpy of the one before into the snapshot.
  if (!device.backend) device.backend = GetDeviceBackend();
  if (!device.backend) {
    throw Error(ErrorCode::kInvalidArgument, "SaveAsync: chunk " + chunk.box.ToString() + " lives on device " +
                                                 std::to_string(chunk.device) + " and no device backend is registered");
  }
  device.backend->CheckMemory(chunk.data, bytes, chunk.device, "SaveAsync: chunk " + chunk.box.ToString());
  if (!device.staging) device.staging = device.backend->AcquireStaging();
  DeviceStaging* const pipe = device.staging.get();
  const std::size_t piece = pipe->buffer_bytes();
  const auto* src = static_cast<const unsigned char*>(chunk.data);
  auto* dst = static_cast<unsigned char*>(staging);
  std::size_t issued = 0;
  int slot = 0;
  pipe->CopyToHostAsync(slot, src, std::min(piece, bytes), chunk.device);
  while (issued < bytes) {
    const std::size_t len = std::min(piece, bytes - issued);
    const std::size_t next = issued + len;
    if (next < bytes) pipe->CopyToHostAsync(1 - slot, src + next, std::min(piece, bytes - next), chunk.device);
    pipe->Wait(slot);
    std::memcpy(dst + issued, pipe->buffer(slot), len);
    issued = next;
    slot = 1 - slot;
  }
}

namespace {

std::size_t ChunkBytes(const std::string& key, const Tensor& t, const Chunk& c) {
  const auto bytes = static_cast<std::size_t>(c.box.NumElements()) * DTypeSize(t.dtype);
  if (bytes > 0 && c.data == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                "SaveAsync: key '" + PrintableKey(key) + "': chunk " + c.box.ToString() + " has no data");
  }
  return bytes;
}

}  // namespace

namespace {

// The snapshot's host copies, run on the process's worker pool (storage/pool.h) as well as
// this thread: a copy of a large state is memory-bound, and one core alone does not reach the
// memory's bandwidth. Cut into pieces of about kCopyPiece: large copies split, small ones
// grouped (a state of many small tensors is not one job each).
struct HostCopy {
  unsigned char* to;
  const unsigned char* from;
  std::size_t n;
};

void CopyAll(const std::vector<HostCopy>& copies) {
  constexpr std::size_t kCopyPiece = std::size_t{4} << 20;
  std::vector<HostCopy> pieces;
  std::vector<std::size_t> group_end;  // pieces [group_end[g - 1], group_end[g]) are job g
  std::size_t group_bytes = 0;
  for (const HostCopy& c : copies) {
    for (std::size_t at = 0; at < c.n; at += kCopyPiece) {
      const std::size_t n = std::min(kCopyPiece, c.n - at);
      pieces.push_back({c.to + at, c.from + at, n});
      group_bytes += n;
      if (group_bytes >= kCopyPiece) {
        group_end.push_back(pieces.size());
        group_bytes = 0;
      }
    }
  }
  if (group_end.empty() || group_end.back() != pieces.size()) group_end.push_back(pieces.size());
  storage::ParallelFor(group_end.size(), [&](std::size_t g) {
    for (std::size_t i = g ? group_end[g - 1] : 0; i < group_end[g]; ++i)
      std::memcpy(pieces[i].to, pieces[i].from, pieces[i].n);
  });
}

}  // namespace

Snapshot TakeSnapshot(const StateDict& state, StagingPool& pool) {
  uint64_t total = 0;
  for (const auto& [key, e] : state) {
    if (const auto* t = std::get_if<Tensor>(&e)) {
      for (const Chunk& c : t->chunks) total += RoundUp(ChunkBytes(key, *t, c), kChunkAlign);
    } else if (const auto* b = std::get_if<Bytes>(&e)) {
      total += RoundUp(b->data.size(), kChunkAlign);
    }
  }
  Snapshot snap;
  if (total > 0) snap.lease = StagingAccess::Acquire(pool, total);
  snap.bytes.resize(state.size());
  DevicePipe device;  // one staging pair for every device chunk of the snapshot
  std::vector<HostCopy> copies;
  uint64_t offset = 0;
  std::size_t index = 0;
  for (const auto& [key, e] : state) {
    const std::size_t i = index++;
    if (const auto* b = std::get_if<Bytes>(&e)) {
      const std::size_t n = b->data.size();
      if (n > 0) {
        copies.push_back({reinterpret_cast<unsigned char*>(snap.lease->data() + offset), b->data.data(), n});
        snap.bytes[i] = {reinterpret_cast<const uint8_t*>(snap.lease->data() + offset), n};
      }
      offset += RoundUp(n, kChunkAlign);
      snap.state.Add(key, Bytes{});
      continue;
    }
    const auto* t = std::get_if<Tensor>(&e);
    if (!t) {
      snap.state.Add(key, e);
      continue;
    }
    Tensor copy{t->dtype, t->shape, {}};
    copy.chunks.reserve(t->chunks.size());
    for (const Chunk& c : t->chunks) {
      const std::size_t bytes = ChunkBytes(key, *t, c);
      void* to = bytes > 0 ? snap.lease->data() + offset : nullptr;
      if (bytes > 0 && c.device == kHostDevice) {
        copies.push_back({static_cast<unsigned char*>(to), static_cast<const unsigned char*>(c.data), bytes});
      } else if (bytes > 0) {
        CopyChunkToStaging(c, to, bytes, device);
      }
      copy.chunks.push_back(Chunk{c.box, to});
      offset += RoundUp(bytes, kChunkAlign);
    }
    snap.state.Add(key, std::move(copy));
  }
  CopyAll(copies);
  return snap;
}

// ---- jobs and the background thread ------------------------------------------------------

namespace {

std::mutex g_hook_mu;
std::function<void()> g_slot_wait_hook;

std::function<void()> SlotWaitHook() {
  std::lock_guard lock(g_hook_mu);
  return g_slot_wait_hook;
}

ErrorCode CodeOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    return err.code();
  } catch (...) {
    return ErrorCode::kInternal;
  }
}

bool IsCancelled(const std::exception_ptr& e) { return CodeOf(e) == ErrorCode::kCancelled; }

std::string WhatOf(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& err) {
    return err.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

struct AsyncJob {
  std::filesystem::path dir;
  AsyncSaveOptions options;
  Snapshot snapshot;
  uint64_t staging_bytes = 0;
  double snapshot_seconds = 0, blocked_seconds = 0;
  // This rank's SaveAsync threw (its description, which the first agreement brings to the
  // other ranks); the caller has that error already.
  std::string foreground_failure;
  std::atomic<bool> cancel{false};
  // Its failure has been reported to this rank's caller: by Wait(), by a SaveAsync or
  // WaitForSaves that threw it, or (foreground_failure) by the SaveAsync that made it. Each
  // failure is reported once; one never reported is printed when the job goes.
  std::atomic<bool> reported{false};
  // The first agreement failed: some rank's SaveAsync threw (and so reported it there) or
  // the save was cancelled before it began. Every rank knows, so none makes it the next
  // SaveAsync's (which would fail the save after that on every rank, and so on): only Wait
  // reports it here.
  bool failed_at_start = false;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  AsyncJob() = default;
  AsyncJob(const AsyncJob&) = delete;
  AsyncJob& operator=(const AsyncJob&) = delete;
  // The last reference (its last SaveHandle, or the Comm's list of failures) is gone.
  ~AsyncJob() {
    if (!done || !error || reported.load() || IsCancelled(error)) return;
    std::fprintf(stderr, "ckpt: an asynchronous save to %s failed and it was never reported: %s\n",
                 dir.string().c_str(), WhatOf(error).c_str());
  }

  static SaveHandle Handle(std::shared_ptr<AsyncJob> job) { return SaveHandle(std::move(job)); }

  void Finish(std::exception_ptr e) {
    std::lock_guard lock(mu);
    error = std::move(e);
    done = true;
    cv.notify_all();
  }
  void WaitDone() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done; });
  }

  // Runs on the background thread, over `comm`, the rank's background group.
  void Run(Comm& comm) {
    std::string failure = foreground_failure;
    if (failure.empty() && cancel.load()) {
      try {
        throw Cancelled();
      } catch (...) {
        failure = DescribeCurrentException();
      }
    }
    try {
      AgreeOrThrow(comm, failure);
    } catch (...) {
      failed_at_start = true;
      throw;
    }
    SaveContext context;
    context.async = true;
    context.snapshot_seconds = snapshot_seconds;
    context.blocked_seconds = blocked_seconds;
    context.staged_bytes = snapshot.bytes;
    context.check = [this] {
      if (cancel.load()) throw Cancelled();
    };
    try {
      SaveWithContext(dir, snapshot.state, comm, options, context);
    } catch (...) {
      snapshot = {};
      throw;
    }
    snapshot = {};  // the staging buffer goes back to its pool as soon as the data is written
    if (options.on_commit) options.on_commit(comm);
  }

  Error Cancelled() const { return Error(ErrorCode::kCancelled, dir.string() + ": save cancelled"); }
};

class AsyncSaves {
 public:
  explicit AsyncSaves(std::unique_ptr<Comm> background)
      : background_(std::move(background)), pool_(std::make_shared<StagingPool>()), worker_([this] { Work(); }) {}

  ~AsyncSaves() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    worker_.join();
    // The failures still pending go with pending_: each job prints its own if unreported.
  }

  StagingPool& pool() { return *pool_; }

  void Enqueue(std::shared_ptr<AsyncJob> job) {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(job));
    ++unfinished_;
    cv_.notify_all();
  }

  // Until fewer than `max_in_flight` of this rank's saves are unfinished.
  void WaitForSlot(int max_in_flight) {
    std::unique_lock lock(mu_);
    if (unfinished_ >= max_in_flight) {
      if (const std::function<void()> hook = SlotWaitHook(); hook) {
        lock.unlock();
        hook();
        lock.lock();
      }
    }
    cv_.wait(lock, [&] { return unfinished_ < max_in_flight; });
  }

  // Throws the background failures no Wait() has reported yet (one as it is, several in
  // one Error with the first one's code), marking them reported; forgets the others.
  void ThrowUnreported() {
    std::vector<std::shared_ptr<AsyncJob>> failed;
    {
      std::lock_guard lock(mu_);
      failed.swap(pending_);
    }
    std::erase_if(failed, [](const std::shared_ptr<AsyncJob>& job) { return job->reported.exchange(true); });
    if (failed.empty()) return;
    if (failed.size() == 1) std::rethrow_exception(failed[0]->error);
    std::string message = std::to_string(failed.size()) + " asynchronous saves failed";
    for (const auto& job : failed) message += "; " + job->dir.string() + ": " + WhatOf(job->error);
    throw Error(CodeOf(failed[0]->error), message);
  }

 private:
  void Work() {
    for (;;) {
      std::shared_ptr<AsyncJob> job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and everything queued has run
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr error;
      try {
        job->Run(*background_);
      } catch (...) {
        error = std::current_exception();
      }
      // The failure is recorded before the job is marked done (whoever saw it done and calls
      // SaveAsync next meets it), and the job is done before its slot frees.
      std::lock_guard lock(mu_);
      if (error && !job->failed_at_start && !IsCancelled(error)) pending_.push_back(job);
      job->Finish(error);
      --unfinished_;
      cv_.notify_all();
    }
  }

  std::unique_ptr<Comm> background_;
  std::shared_ptr<StagingPool> pool_;  // the default: one per rank
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<AsyncJob>> queue_;
  int unfinished_ = 0;  // queued or running
  bool stop_ = false;
  // Background failures since the last SaveAsync, in order (those Wait() reported since
  // are skipped when they are thrown).
  std::vector<std::shared_ptr<AsyncJob>> pending_;
  std::thread worker_;                 // last: started once everything above exists
};

void SetSlotWaitHookForTest(std::function<void()> hook) {
  std::lock_guard lock(g_hook_mu);
  g_slot_wait_hook = std::move(hook);
}

struct AsyncSavesSlot {
  // The first call on a Comm makes its background group (collective).
  static AsyncSaves& Get(Comm& comm) {
    if (!comm.async_saves_) comm.async_saves_ = std::make_shared<AsyncSaves>(comm.Dup());
    return *comm.async_saves_;
  }
  static AsyncSaves* Find(Comm& comm) { return comm.async_saves_.get(); }
};

}  // namespace internal

// ---- the public API -------------------------------------------------------------------------

namespace {

internal::AsyncJob& Job(const std::shared_ptr<internal::AsyncJob>& job) {
  if (!job) throw Error(ErrorCode::kInvalidArgument, "SaveHandle: an empty handle (no save)");
  return *job;
}

}  // namespace

bool SaveHandle::Done() const {
  internal::AsyncJob& job = Job(job_);
  std::lock_guard lock(job.mu);
  return job.done;
}

void SaveHandle::Wait() const {
  internal::AsyncJob& job = Job(job_);
  job.WaitDone();
  if (!job.error) return;
  job.reported = true;
  std::rethrow_exception(job.error);
}

void SaveHandle::WaitQuietly() const { Job(job_).WaitDone(); }

void SaveHandle::Cancel() const { Job(job_).cancel = true; }
const std::filesystem::path& SaveHandle::dir() const { return Job(job_).dir; }
uint64_t SaveHandle::staging_bytes() const { return Job(job_).staging_bytes; }
double SaveHandle::blocked_seconds() const { return Job(job_).blocked_seconds; }

SaveHandle SaveAsync(const std::filesystem::path& dir, const StateDict& state, Comm& comm,
                     const AsyncSaveOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  internal::AsyncSaves& saves = internal::AsyncSavesSlot::Get(comm);
  auto job = std::make_shared<internal::AsyncJob>();
  job->dir = dir;
  try {
    if (options.max_in_flight < 1) {
      throw Error(ErrorCode::kInvalidArgument,
                  "SaveAsync: max_in_flight must be >= 1, not " + std::to_string(options.max_in_flight));
    }
    saves.WaitForSlot(options.max_in_flight);
    saves.ThrowUnreported();
    const auto snap_start = std::chrono::steady_clock::now();
    job->snapshot = internal::TakeSnapshot(state, options.staging ? *options.staging : saves.pool());
    job->snapshot_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - snap_start).count();
    job->staging_bytes = job->snapshot.lease ? job->snapshot.lease->size() : 0;
    job->options = options;
  } catch (...) {
    // The other ranks' job for this call fails with this rank's reason (a participant).
    job->snapshot = {};
    job->foreground_failure = internal::DescribeCurrentException();
    job->reported = true;  // by this throw
    saves.Enqueue(job);
    throw;
  }
  job->blocked_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  saves.Enqueue(job);
  return internal::AsyncJob::Handle(std::move(job));
}

void WaitForSaves(Comm& comm) {
  internal::AsyncSaves* saves = internal::AsyncSavesSlot::Find(comm);
  if (!saves) return;
  saves->WaitForSlot(1);
  saves->ThrowUnreported();
}

}  // namespace ckpt
