// storage/pool.cc
#include "storage/pool.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

namespace ckpt::storage {
namespace {

// One ParallelFor call. Every field is guarded by the pool's mutex; tasks are coarse
// (hundreds of microseconds), so one lock per task costs nothing that shows.
struct Job {
  const std::function<void(std::size_t)>* fn = nullptr;
  std::size_t n = 0, next = 0, done = 0;
  std::exception_ptr error;
  std::condition_variable finished;
};

class Pool {
 public:
  Pool() { Start(DefaultWorkers()); }
  ~Pool() { Stop(); }

  std::size_t workers() {
    std::lock_guard<std::mutex> lock(mu_);
    return threads_.size();
  }

  void Resize(std::size_t count) {
    Stop();
    Start(count);
  }

  void Run(std::size_t n, const std::function<void(std::size_t)>& fn) {
    Job job;
    job.fn = &fn;
    job.n = n;
    std::unique_lock<std::mutex> lock(mu_);
    jobs_.push_back(&job);
    if (n > 2) {
      work_.notify_all();
    } else {
      work_.notify_one();
    }
    // The caller works on its own job until every index is claimed, then waits for the rest.
    for (;;) {
      if (job.next >= job.n) break;
      RunOne(job, lock);
    }
    Unqueue(&job);
    job.finished.wait(lock, [&] { return job.done == job.n; });
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  static std::size_t DefaultWorkers() {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    return std::min<std::size_t>(cores - 1, 7);
  }

  void Start(std::size_t count) {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
    threads_ = SpawnThreads(count, [this](std::size_t) { Work(); });
  }

  void Stop() {
    std::vector<std::jthread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      threads.swap(threads_);
    }
    work_.notify_all();
    for (auto& t : threads) t.join();
  }

  // Claims the next index of `job` and runs it with the lock released. REQUIRES: the lock
  // held and an index left.
  void RunOne(Job& job, std::unique_lock<std::mutex>& lock) {
    const std::size_t i = job.next++;
    if (job.next >= job.n) Unqueue(&job);
    const bool skip = job.error != nullptr;
    lock.unlock();
    std::exception_ptr failed;
    if (!skip) {
      try {
        (*job.fn)(i);
      } catch (...) {
        failed = std::current_exception();
      }
    }
    lock.lock();
    if (failed && !job.error) job.error = failed;
    if (++job.done == job.n) job.finished.notify_all();  // under the lock: the caller then owns `job` again
  }

  void Unqueue(Job* job) {
    auto it = std::find(jobs_.begin(), jobs_.end(), job);
    if (it != jobs_.end()) jobs_.erase(it);
  }

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      RunOne(*jobs_.front(), lock);
    }
  }

  std::mutex mu_;
  std::condition_variable work_;
  std::deque<Job*> jobs_;  // jobs with indices left to claim
  std::vector<std::jthread> threads_;
  bool stop_ = false;
};

Pool& ThePool() {
  static Pool pool;
  return pool;
}

}  // namespace

void ParallelFor(std::size_t n, const std::function<void(std::size_t)>& fn) {
  if (n == 0) return;
  if (n == 1) return fn(0);
  ThePool().Run(n, fn);
}

std::vector<std::jthread> SpawnThreads(std::size_t count, const std::function<void(std::size_t)>& fn) {
  std::vector<std::jthread> started;
  started.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    try {
      started.emplace_back([fn, i] { fn(i); });
    } catch (const std::system_error&) {
      break;  // the work runs on the threads already started
    }
  }
  return started;
}

std::size_t PoolWorkers() { return ThePool().workers(); }
void SetPoolWorkers(std::size_t workers) { ThePool().Resize(workers); }

}  // namespace ckpt::storage
