// ckpt::nccl with one rank on a real device (skipped without one): every collective over
// device and host buffers, the byte collectives over NCCL (file bootstrap), Split, and a
// 1-rank save and load of device chunks over the NCCL Comm.
#include <doctest/doctest.h>

#include <cstring>

#include "ckpt/ckpt.h"
#include "ckpt/cuda.h"
#include "ckpt/nccl.h"
#include "gpu_util.h"
#include "test_util.h"

using namespace ckpt;
using gpu_test::DeviceBuffer;

namespace {

std::unique_ptr<Comm> OneRank(const ckpt_test::TempDir& tmp) {
  nccl::Options options;
  options.device = 0;
  options.timeout = std::chrono::seconds(60);
  return nccl::OverFile(tmp / "nccl-id", 0, 1, options);
}

std::vector<uint8_t> AsBytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

TEST_CASE("NCCL collectives with one rank, over device and host buffers") {
  ckpt_test::TempDir tmp("nccl");
  auto comm = OneRank(tmp);
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);
  CHECK(!std::filesystem::exists(tmp / "nccl-id"));  // removed once every rank joined

  std::vector<float> v = {1, 2, 3, 4};
  comm->AllReduce(v.data(), v.size(), DType::kFloat32, ReduceOp::kSum);  // host memory, staged
  CHECK(v == std::vector<float>{1, 2, 3, 4});
  DeviceBuffer d(AsBytes(v));
  comm->AllReduce(d.get(), 4, DType::kFloat32, ReduceOp::kMax);  // device memory, direct
  CHECK(d.Download() == AsBytes(v));
  DeviceBuffer recv(16);
  comm->ReduceScatter(d.get(), recv.get(), 4, DType::kFloat32, ReduceOp::kSum);
  CHECK(recv.Download() == AsBytes(v));
  std::vector<float> gathered(4, 0);
  comm->AllGatherInto(d.get(), gathered.data(), 16);  // device in, host out
  CHECK(gathered == v);

  const std::vector<uint8_t> msg = {7, 8, 9};
  const auto all = comm->Gather(msg, 0);
  REQUIRE(all.size() == 1);
  CHECK(all[0] == msg);
  ByteBuffer b = {1, 2};
  comm->Broadcast(b, 0);
  CHECK(b == ByteBuffer{1, 2});
  comm->Barrier();
  CHECK(comm->AllOk(true));
  CHECK(comm->AgreeOnErrors("") == "");
  auto half = comm->Split(0, 0);
  CHECK(half->size() == 1);
  half->Barrier();
}

TEST_CASE("a 1-rank save and load of device chunks over the NCCL Comm") {
  auto backend = cuda::Register();
  ckpt_test::TempDir tmp("nccl");
  auto comm = OneRank(tmp);
  const std::vector<uint8_t> bytes = ckpt_test::RandomBytes(1 << 22, 3);
  DeviceBuffer src(bytes);
  Tensor t = Tensor::Full(DType::kFloat32, {1 << 20}, src.get());
  t.chunks[0].device = 0;
  StateDict sd;
  sd.Add("w", std::move(t));
  Save(tmp / "c", sd, *comm);
  DeviceBuffer dst(bytes.size());
  std::get<Tensor>(sd.At("w")).chunks[0].data = dst.get();
  Load(tmp / "c", sd, *comm);
  CHECK(dst.Download() == bytes);
  SetDeviceBackend(nullptr);
}
