// storage/pool.h: the process's worker threads for per-chunk CPU work (block hashes and
// statistics of large chunks, and the writes that go with them), so that a save or a
// verification uses every core instead of one per writer.
//
// Threading: ParallelFor may be called from any number of threads at once (every rank
// thread of a process shares the pool); the calling thread works on its own job too, so a
// job always finishes, even with no worker free.
#pragma once

#include <cstddef>
#include <functional>
#include <future>
#include <system_error>
#include <thread>
#include <vector>

namespace ckpt::storage {

// Runs fn(i) for every i in [0, n), on the pool's workers and the calling thread, and
// returns when all have run. If one throws, the indices not yet started are skipped and
// the first exception is rethrown here once the running ones are done.
void ParallelFor(std::size_t n, const std::function<void(std::size_t)>& fn);

// The pool's worker count: the cores less one (the caller works too), at most 7; 0 on a
// single core. SetPoolWorkers changes it for the rest of the process (tests: 0 runs every
// job on its caller alone); call it while no job runs.
std::size_t PoolWorkers();
void SetPoolWorkers(std::size_t workers);

// Starts up to `count` threads, thread i running fn(i), and returns those started. Where the
// system refuses one (EAGAIN: a limit on processes or memory), none after it is started: the
// caller's work then runs on fewer threads, never a crash. Destroying the result joins them,
// so callers write their work to finish on however many threads started (the caller's own
// included).
std::vector<std::jthread> SpawnThreads(std::size_t count, const std::function<void(std::size_t)>& fn);

// std::async(std::launch::async, f, args...) where the system starts a thread for it; where
// it refuses, the same call deferred: get() then runs it on the caller's thread.
template <typename F, typename... Args>
auto AsyncOrDeferred(const F& f, const Args&... args) {
  try {
    return std::async(std::launch::async, f, args...);
  } catch (const std::system_error&) {
    return std::async(std::launch::deferred, f, args...);
  }
}

}  // namespace ckpt::storage
