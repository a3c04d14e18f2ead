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

}  // namespace ckpt::storage
