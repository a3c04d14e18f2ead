// checkpoint/staging.h: SaveAsync's snapshot. Every byte of a tensor chunk a snapshot holds
// is copied by CopyChunkToStaging, the one place to route memory that is not the host's
// (device chunks) through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/device.h"

namespace ckpt::internal {

// The registered device backend and one staging pair of it, taken at the first device chunk
// a snapshot meets and used for all of them (the backend pools its pinned pairs: a later
// snapshot reuses this one).
struct DevicePipe {
  std::shared_ptr<DeviceBackend> backend;
  std::unique_ptr<DeviceStaging> staging;
};

// Copies `bytes` bytes of `chunk` into host memory at `staging` (a device chunk through
// `device`).
void CopyChunkToStaging(const Chunk& chunk, void* staging, std::size_t bytes, DevicePipe& device);

// A buffer taken from a StagingPool, given back to it on destruction.
class StagingLease {
 public:
  StagingLease(std::shared_ptr<StagingPool::Impl> pool, void* buffer, uint64_t bytes);
  ~StagingLease();
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  std::byte* data() const { return static_cast<std::byte*>(data_); }
  uint64_t size() const { return size_; }

 private:
  std::shared_ptr<StagingPool::Impl> pool_;
  void* data_;
  uint64_t size_;
};

struct StagingAccess {
  // A buffer of at least `bytes` (> 0); kInvalidArgument when the pool has no room for it.
  static std::unique_ptr<StagingLease> Acquire(StagingPool& pool, uint64_t bytes);
};

// A copy of `state` whose tensor chunks and bytes entries lie in one buffer of `pool`
// (`lease`, null when they hold no bytes): every byte a shard will hold. The copy's bytes
// entries are left empty, their bytes in `bytes` (by entry index: SaveContext::staged_bytes;
// empty spans for the other kinds). Scalars and JSON values, which go to metadata.json
// only, are copied by value.
struct Snapshot {
  StateDict state;
  std::vector<std::span<const uint8_t>> bytes;
  std::unique_ptr<StagingLease> lease;
};
Snapshot TakeSnapshot(const StateDict& state, StagingPool& pool);

// For tests: called (on the caller's thread) when a SaveAsync has to wait for a save in
// flight to finish before it may take its snapshot.
void SetSlotWaitHookForTest(std::function<void()> hook);

}  // namespace ckpt::internal
