// comm/thread_comm.cc: ranks as threads of one process (RunThreads).
//
// Every collective is a rendezvous: each rank publishes a pointer to its input, waits
// until all ranks have arrived, reads what it needs straight from the others' memory,
// and waits again so no input is released while someone still reads it. A rank that
// throws outside a collective aborts the world: ranks waiting in any group throw kComm.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "ckpt/comm.h"
#include "ckpt/error.h"
#include "comm/reduce.h"

namespace ckpt {
namespace {

struct World {
  std::atomic<bool> aborted{false};
};

class Group {
 public:
  Group(std::shared_ptr<World> world, int size) : world_(std::move(world)), size_(size), ptrs_(size) {}
  int size() const { return size_; }

  // Publishes `p` and waits for every rank; returns every rank's pointer. The pointers
  // stay valid until the caller's next Wait().
  const std::vector<const void*>& Exchange(int rank, const void* p) {
    std::unique_lock lock(mu_);
    ptrs_[rank] = p;
    ArriveLocked(lock);
    return ptrs_;
  }
  void Wait() {
    std::unique_lock lock(mu_);
    ArriveLocked(lock);
  }

 private:
  void ArriveLocked(std::unique_lock<std::mutex>& lock) {
    const uint64_t gen = generation_;
    if (++arrived_ == size_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    while (generation_ == gen) {
      if (world_->aborted.load()) {
        throw Error(ErrorCode::kComm, "collective aborted: another rank failed");
      }
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  std::shared_ptr<World> world_;
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<const void*> ptrs_;
};

class ThreadComm final : public Comm {
 public:
  ThreadComm(std::shared_ptr<World> world, std::shared_ptr<Group> group, int rank)
      : world_(std::move(world)), group_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  void Barrier() override { group_->Wait(); }

  std::vector<ByteBuffer> Gather(std::span<const uint8_t> mine, int root) override {
    const std::span<const uint8_t>* my_span = &mine;
    const auto& ptrs = group_->Exchange(rank_, my_span);
    std::vector<ByteBuffer> out;
    if (rank_ == root) {
      for (const void* p : ptrs) {
        const auto* s = static_cast<const std::span<const uint8_t>*>(p);
        out.emplace_back(s->begin(), s->end());
      }
    }
    group_->Wait();
    return out;
  }

  void Broadcast(ByteBuffer& buffer, int root) override {
    const auto& ptrs = group_->Exchange(rank_, &buffer);
    if (rank_ != root) buffer = *static_cast<const ByteBuffer*>(ptrs[root]);
    group_->Wait();
  }

  std::vector<ByteBuffer> AllGather(std::span<const uint8_t> mine) override {
    const auto& ptrs = group_->Exchange(rank_, &mine);
    std::vector<ByteBuffer> out;
    for (const void* p : ptrs) {
      const auto* s = static_cast<const std::span<const uint8_t>*>(p);
      out.emplace_back(s->begin(), s->end());
    }
    group_->Wait();
    return out;
  }

  void AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op) override {
    // Each rank reduces its segment (in rank order, so results are identical on every
    // rank), then every rank copies all segments back.
    const std::size_t item = DTypeSize(dtype);
    const std::size_t n = static_cast<std::size_t>(size());
    const std::size_t per = (count + n - 1) / n;
    const std::size_t begin = std::min(count, per * rank_), end = std::min(count, begin + per);
    std::vector<uint8_t> seg((end - begin) * item);
    const auto& inputs = group_->Exchange(rank_, data);
    if (!seg.empty()) {
      std::memcpy(seg.data(), static_cast<const uint8_t*>(inputs[0]) + begin * item, seg.size());
      for (std::size_t r = 1; r < n; ++r) {
        internal::ReduceInto(seg.data(), static_cast<const uint8_t*>(inputs[r]) + begin * item, end - begin,
                             dtype, op);
      }
    }
    group_->Wait();  // all inputs read; now outputs may be written
    const auto& segs = group_->Exchange(rank_, seg.data());
    for (std::size_t r = 0; r < n; ++r) {
      const std::size_t b = std::min(count, per * r), e = std::min(count, b + per);
      if (e > b) std::memcpy(static_cast<uint8_t*>(data) + b * item, segs[r], (e - b) * item);
    }
    group_->Wait();
  }

  void ReduceScatter(const void* send, void* recv, std::size_t block_count, DType dtype,
                     ReduceOp op) override {
    const std::size_t bytes = block_count * DTypeSize(dtype);
    const auto& inputs = group_->Exchange(rank_, send);
    std::vector<uint8_t> acc(bytes);
    if (bytes) {
      std::memcpy(acc.data(), static_cast<const uint8_t*>(inputs[0]) + bytes * rank_, bytes);
      for (int r = 1; r < size(); ++r) {
        internal::ReduceInto(acc.data(), static_cast<const uint8_t*>(inputs[r]) + bytes * rank_, block_count,
                             dtype, op);
      }
    }
    group_->Wait();
    if (bytes) std::memcpy(recv, acc.data(), bytes);
  }

  void AllGatherInto(const void* send, void* recv, std::size_t block_bytes) override {
    const auto& inputs = group_->Exchange(rank_, send);
    for (int r = 0; r < size(); ++r) {
      if (block_bytes) std::memcpy(static_cast<uint8_t*>(recv) + block_bytes * r, inputs[r], block_bytes);
    }
    group_->Wait();
  }

  std::unique_ptr<Comm> Split(int color, int key) override {
    struct Request {
      int color, key;
      std::shared_ptr<Group> made;  // filled by the lowest rank of each color
    };
    Request mine{color, key, nullptr};
    const auto& reqs = group_->Exchange(rank_, &mine);
    // Members of my color, ordered by (key, parent rank).
    std::vector<std::pair<int, int>> members;
    for (int r = 0; r < size(); ++r) {
      const auto* q = static_cast<const Request*>(reqs[r]);
      if (q->color == color) members.emplace_back(q->key, r);
    }
    std::sort(members.begin(), members.end());
    int lowest = size();
    for (const auto& m : members) lowest = std::min(lowest, m.second);
    if (lowest == rank_) mine.made = std::make_shared<Group>(world_, static_cast<int>(members.size()));
    group_->Wait();  // the creators have published their groups
    auto group = static_cast<const Request*>(reqs[lowest])->made;
    int new_rank = 0;
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
    }
    group_->Wait();  // everyone holds its group before the requests go away
    return std::make_unique<ThreadComm>(world_, std::move(group), new_rank);
  }

 private:
  std::shared_ptr<World> world_;
  std::shared_ptr<Group> group_;
  int rank_;
};

}  // namespace

void RunThreads(int world_size, const std::function<void(Comm&)>& fn) {
  if (world_size < 1) throw Error(ErrorCode::kInvalidArgument, "RunThreads: world_size must be >= 1");
  auto world = std::make_shared<World>();
  auto group = std::make_shared<Group>(world, world_size);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadComm comm(world, group, r);
        fn(comm);
      } catch (...) {
        {
          std::lock_guard lock(mu);
          // Prefer a rank's own failure over the kComm errors it caused elsewhere.
          bool replace = !first;
          if (first) {
            try {
              std::rethrow_exception(first);
            } catch (const Error& e) {
              replace = e.code() == ErrorCode::kComm;
            } catch (...) {
            }
            try {
              throw;
            } catch (const Error& e) {
              if (e.code() == ErrorCode::kComm) replace = false;
            } catch (...) {
            }
          }
          if (replace) first = std::current_exception();
        }
        world->aborted.store(true);
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace ckpt
