// ckpt/comm.h: the few collectives libckpt needs, as one small interface.
//
// Backends: SingleComm (one process, one rank), ThreadComm via RunThreads (ranks as
// threads of one process: tests, one node), and MPI / NCCL (ckpt/mpi.h, ckpt/nccl.h when
// built). A user implements Comm over their own process group by overriding the pure
// virtual functions; the tensor collectives have generic fallbacks built on them.
//
// Every function here is COLLECTIVE: all ranks of the group call it, in the same order.
//
// Threads: one group is used by one thread at a time. SaveAsync (ckpt/checkpoint.h) runs
// its collectives on a background thread over its own group, a Dup() of the caller's made
// at the first SaveAsync, so they never interleave with the caller's use of this one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/dtype.h"

namespace ckpt {

namespace internal {
class AsyncSaves;
struct AsyncSavesSlot;
}  // namespace internal

using ByteBuffer = std::vector<uint8_t>;

enum class ReduceOp { kSum, kMax, kMin };

class CKPT_API Comm {
 public:
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual void Barrier() = 0;
  // Root receives every rank's buffer, in rank order; other ranks receive an empty vector.
  virtual std::vector<ByteBuffer> Gather(std::span<const uint8_t> mine, int root) = 0;
  // Root's `buffer` is copied into every other rank's `buffer` (resized as needed).
  virtual void Broadcast(ByteBuffer& buffer, int root) = 0;

  // Tensor collectives used by the runtime. The defaults go through Gather/Broadcast
  // (correct, not fast); backends override them.
  virtual std::vector<ByteBuffer> AllGather(std::span<const uint8_t> mine);
  // In place over `count` elements of `dtype` (floating or integer dtypes).
  virtual void AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op);
  // `send` holds size() consecutive blocks of `block_count` elements; rank r receives the
  // reduction of block r into `recv`.
  virtual void ReduceScatter(const void* send, void* recv, std::size_t block_count, DType dtype,
                             ReduceOp op);
  // Every rank gives `block_bytes` bytes; `recv` gets size() blocks in rank order.
  virtual void AllGatherInto(const void* send, void* recv, std::size_t block_bytes);

  // Splits the group: ranks with the same color form a new group, ordered by key then
  // by rank. Used for the rows and columns of a 2-D device mesh.
  virtual std::unique_ptr<Comm> Split(int color, int key) = 0;
  // A new group of the same ranks in the same order whose messages never match this one's,
  // usable from another thread while this one is in use. The backend must allow two groups
  // to run collectives at once from different threads (MPI: MPI_THREAD_MULTIPLE, which
  // MpiComm's Dup requires). The default is Split(0, rank()).
  virtual std::unique_ptr<Comm> Dup();

  // Agreement: returns true on every rank if `ok` is true on every rank.
  bool AllOk(bool ok);
  // Agreement with messages: every rank gets every failing rank's message,
  // "rank R: message" joined by newlines; empty when all ranks passed "".
  std::string AgreeOnErrors(const std::string& my_error);

 private:
  friend struct internal::AsyncSavesSlot;
  // SaveAsync's state on this rank (its background thread and group, the saves in
  // flight, the default staging pool). Destroying the Comm waits for those saves.
  std::shared_ptr<internal::AsyncSaves> async_saves_;
};

// One process, one rank.
class CKPT_API SingleComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void Barrier() override {}
  std::vector<ByteBuffer> Gather(std::span<const uint8_t> mine, int root) override;
  void Broadcast(ByteBuffer&, int) override {}
  std::unique_ptr<Comm> Split(int, int) override { return std::make_unique<SingleComm>(); }
};

// Runs fn(comm) on `world_size` threads, one per rank, over an in-process group.
// If any rank throws, the group is aborted (ranks waiting in a collective throw
// kComm), every thread is joined, and the first exception thrown is rethrown here.
CKPT_API void RunThreads(int world_size, const std::function<void(Comm&)>& fn);

}  // namespace ckpt
