// comm: the in-process backend's collectives, Split, and abort on failure.
#include <doctest/doctest.h>

#include <atomic>
#include <numeric>

#include "ckpt/ckpt.h"

using namespace ckpt;

TEST_CASE("gather, broadcast, allgather") {
  RunThreads(5, [](Comm& comm) {
    const uint8_t mine = static_cast<uint8_t>(10 + comm.rank());
    auto g = comm.Gather({&mine, 1}, 2);
    if (comm.rank() == 2) {
      REQUIRE(g.size() == 5);
      for (int r = 0; r < 5; ++r) CHECK(g[r] == ByteBuffer{static_cast<uint8_t>(10 + r)});
    } else {
      CHECK(g.empty());
    }
    ByteBuffer b = comm.rank() == 3 ? ByteBuffer{1, 2, 3} : ByteBuffer{};
    comm.Broadcast(b, 3);
    CHECK(b == ByteBuffer{1, 2, 3});
    auto all = comm.AllGather({&mine, 1});
    CHECK(all.size() == 5);
    CHECK(all[4] == ByteBuffer{14});
  });
}

TEST_CASE("allreduce, reduce-scatter and allgather-into agree with a serial computation") {
  RunThreads(3, [](Comm& comm) {
    std::vector<float> v(10);
    for (int i = 0; i < 10; ++i) v[i] = static_cast<float>(i * (comm.rank() + 1));
    comm.AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);
    for (int i = 0; i < 10; ++i) CHECK(v[i] == static_cast<float>(i * 6));
    int64_t mx = comm.rank();
    comm.AllReduce(&mx, 1, DType::kInt64, ReduceOp::kMax);
    CHECK(mx == 2);
    std::vector<double> send(6), recv(2);
    std::iota(send.begin(), send.end(), 0.0);
    comm.ReduceScatter(send.data(), recv.data(), 2, DType::kFloat64, ReduceOp::kSum);
    CHECK(recv[0] == 3.0 * (2 * comm.rank()));
    CHECK(recv[1] == 3.0 * (2 * comm.rank() + 1));
    int32_t block[2] = {comm.rank(), -comm.rank()};
    int32_t gathered[6];
    comm.AllGatherInto(block, gathered, sizeof block);
    CHECK(gathered[4] == 2);
    CHECK(gathered[5] == -2);
  });
}

TEST_CASE("Split forms sub-groups (rows and columns of a 2x3 mesh)") {
  RunThreads(6, [](Comm& comm) {
    auto row = comm.Split(comm.rank() / 3, comm.rank());
    auto col = comm.Split(comm.rank() % 3, comm.rank());
    CHECK(row->size() == 3);
    CHECK(col->size() == 2);
    CHECK(row->rank() == comm.rank() % 3);
    int32_t v = comm.rank();
    row->AllReduce(&v, 1, DType::kInt32, ReduceOp::kSum);
    CHECK(v == (comm.rank() / 3 == 0 ? 3 : 12));
  });
}

TEST_CASE("the generic collectives over Gather/Broadcast give the same answers") {
  // A Comm that implements only the required functions, forwarding to a ThreadComm.
  struct Minimal final : Comm {
    Comm& inner;
    explicit Minimal(Comm& c) : inner(c) {}
    int rank() const override { return inner.rank(); }
    int size() const override { return inner.size(); }
    void Barrier() override { inner.Barrier(); }
    std::vector<ByteBuffer> Gather(std::span<const uint8_t> m, int root) override { return inner.Gather(m, root); }
    void Broadcast(ByteBuffer& b, int root) override { inner.Broadcast(b, root); }
    std::unique_ptr<Comm> Split(int c, int k) override { return inner.Split(c, k); }
  };
  RunThreads(4, [](Comm& real) {
    Minimal comm(real);
    std::vector<int32_t> v(7, comm.rank());
    comm.AllReduce(v.data(), v.size(), DType::kInt32, ReduceOp::kSum);
    CHECK(v[6] == 6);
    CHECK(comm.AllOk(true));
    CHECK_FALSE(comm.AllOk(comm.rank() != 1));
    const std::string errs = comm.AgreeOnErrors(comm.rank() == 2 ? "boom" : "");
    CHECK(errs == "rank 2: boom");
  });
}

TEST_CASE("a rank that throws aborts the others instead of hanging them") {
  std::atomic<int> aborted{0};
  CHECK_THROWS_WITH_AS(RunThreads(4,
                                  [&](Comm& comm) {
                                    if (comm.rank() == 1) throw Error(ErrorCode::kIO, "rank 1 failed on purpose");
                                    try {
                                      comm.Barrier();
                                    } catch (const Error& e) {
                                      if (e.code() == ErrorCode::kComm) ++aborted;
                                      throw;
                                    }
                                  }),
                       doctest::Contains("on purpose"), Error);
  CHECK(aborted == 3);
}
