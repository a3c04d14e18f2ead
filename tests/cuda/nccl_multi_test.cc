// ckpt::nccl with one rank per device (skipped with fewer than 2): collectives against the
// host reference, a save of device chunks over NCCL, and a rank that stops mid-save: every
// other rank throws kComm at the timeout (the communicator aborted), none hangs.
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include "ckpt/ckpt.h"
#include "ckpt/cuda.h"
#include "ckpt/nccl.h"
#include "gpu_util.h"
#include "test_util.h"

using namespace ckpt;
using gpu_test::DeviceBuffer;

TEST_CASE("NCCL all-reduce, reduce-scatter and all-gather over device buffers, one rank per device") {
  const int n = cuda::DeviceCount();
  RunThreads(n, [&](Comm& host) {
    nccl::Options options;
    options.device = host.rank();
    auto comm = nccl::OverComm(host, options);
    std::vector<float> mine(n * 3);
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(host.rank() * 100 + i);
    std::vector<uint8_t> bytes(mine.size() * 4);
    std::memcpy(bytes.data(), mine.data(), bytes.size());
    DeviceBuffer d(bytes, host.rank());
    DeviceBuffer r(12, host.rank());
    comm->ReduceScatter(d.get(), r.get(), 3, DType::kFloat32, ReduceOp::kSum);
    std::vector<float> want(3), got(3);
    for (int k = 0; k < 3; ++k) {
      for (int q = 0; q < n; ++q) want[k] += static_cast<float>(q * 100 + host.rank() * 3 + k);
    }
    const auto rb = r.Download();
    std::memcpy(got.data(), rb.data(), 12);
    CHECK(got == want);
    comm->AllReduce(d.get(), mine.size(), DType::kFloat32, ReduceOp::kMax);
    std::vector<float> top(mine.size());
    const auto db = d.Download();
    std::memcpy(top.data(), db.data(), db.size());
    CHECK(top[0] == static_cast<float>((n - 1) * 100));
    std::vector<int32_t> ids(n, -1);
    const int32_t me = host.rank();
    comm->AllGatherInto(&me, ids.data(), sizeof me);
    for (int q = 0; q < n; ++q) CHECK(ids[q] == q);
  });
}

TEST_CASE("a rank that stops mid-save makes every other rank throw kComm, not hang") {
  const int n = cuda::DeviceCount();
  auto backend = cuda::Register();
  ckpt_test::TempDir tmp("nccl");
  std::vector<std::string> errors(n);
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.emplace_back([&, r] {
      try {
        nccl::Options options;
        options.device = r;
        options.timeout = std::chrono::seconds(20);
        auto comm = nccl::OverFile(tmp / "nccl-id", r, n, options);
        DeviceBuffer mine(ckpt_test::RandomBytes(4096, r), r);
        Tensor t = Tensor::Slice(DType::kFloat32, {1024 * n}, 0, 1024 * r, 1024, mine.get());
        t.chunks[0].device = r;
        StateDict sd;
        sd.Add("w", std::move(t));
        Save(tmp / "ok", sd, *comm);  // every rank: a save over NCCL alone
        if (r == n - 1) return;       // the last rank leaves before the next save
        Save(tmp / "broken", sd, *comm);
      } catch (const Error& e) {
        errors[r] = std::string(ErrorCodeName(e.code())) + ": " + e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(std::filesystem::exists(tmp / "ok" / kMetadataFileName));
  CHECK(!std::filesystem::exists(tmp / "broken"));
  for (int r = 0; r + 1 < n; ++r) {
    CAPTURE(errors[r]);
    CHECK(errors[r].find("aborted") != std::string::npos);
  }
  CHECK(errors[n - 1].empty());
  SetDeviceBackend(nullptr);
}
