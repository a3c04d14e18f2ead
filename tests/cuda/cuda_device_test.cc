// ckpt::cuda on a real device (skipped without one): device chunks save and load bit-exact
// against the same bytes saved from the host, reshard device -> host -> device, staging pairs
// are pinned once and reused (by Save and by SaveAsync's snapshots), the stats kernel agrees with the host's statistics, bad memory
// is refused naming the key, and the caller's current device is left alone.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ckpt/ckpt.h"
#include "ckpt/cuda.h"
#include "gpu_util.h"
#include "device_util.h"

namespace fs = std::filesystem;
using namespace ckpt;
using ckpt_test::TempDir;
using gpu_test::DeviceBuffer;

namespace {

using Item = ckpt_test::TensorBytes;

std::vector<Item> Items() {
  std::vector<Item> out;
  const auto add = [&](std::string key, DType dtype, Shape shape, uint64_t seed) {
    out.push_back(ckpt_test::MakeTensorBytes(std::move(key), dtype, std::move(shape), seed));
  };
  add("w.big", DType::kFloat32, {1536, 4096}, 1);  // 24 MiB: many pieces of a 1 MiB buffer
  add("w.bf16", DType::kBFloat16, {3, 1000, 333}, 2);
  add("w.i64", DType::kInt64, {12345}, 3);
  add("scalar", DType::kFloat32, {}, 4);
  // Random float bits include NaN and Inf patterns, so the statistics see every case.
  return out;
}

// Items() in host memory and copied to device 0, each as a whole-tensor state.
struct Placed {
  std::vector<Item> items = Items();
  std::vector<std::unique_ptr<DeviceBuffer>> device;
  StateDict host_state, device_state;
  Placed() {
    for (Item& it : items) {
      host_state.Add(it.key, Tensor::Full(it.dtype, it.shape, it.bytes.data()));
      device.push_back(std::make_unique<DeviceBuffer>(it.bytes));
      Tensor t = Tensor::Full(it.dtype, it.shape, device.back()->get());
      t.chunks[0].device = 0;
      device_state.Add(it.key, std::move(t));
    }
  }
};

}  // namespace

TEST_CASE("device chunks save and load bit-exact against the host, through reused pinned staging") {
  cuda::Options options;
  options.buffer_bytes = std::size_t{1} << 20;
  auto backend = cuda::Register(options);
  Placed placed;
  std::vector<Item>& items = placed.items;
  StateDict &host_state = placed.host_state, &device_state = placed.device_state;
  TempDir tmp("gpu");
  SingleComm comm;
  int before = -1;
  gpu_test::Ok(cudaGetDevice(&before));
  Save(tmp / "host", host_state, comm);
  SaveOptions overwrite;
  overwrite.overwrite = true;
  for (int i = 0; i < 3; ++i) Save(tmp / "dev", device_state, comm, overwrite);
  ckpt_test::CheckSameChunks(ReadMetadata(tmp / "host"), ReadMetadata(tmp / "dev"));
  const cuda::PoolStats stats = cuda::Stats(*backend);
  CHECK(stats.pairs == 1);  // pinned once ...
  CHECK(stats.acquires == 3);  // ... reused by every save
  CHECK(stats.pinned_bytes == 2 * options.buffer_bytes);

  // Load into fresh device memory, and into host memory.
  std::vector<std::unique_ptr<DeviceBuffer>> out;
  StateDict target;
  for (Item& it : items) {
    out.push_back(std::make_unique<DeviceBuffer>(std::vector<uint8_t>(it.bytes.size(), 0)));
    Tensor t = Tensor::Full(it.dtype, it.shape, out.back()->get());
    t.chunks[0].device = 0;
    target.Add(it.key, std::move(t));
  }
  Load(tmp / "host", target, comm);
  for (std::size_t i = 0; i < items.size(); ++i) {
    CAPTURE(items[i].key);
    CHECK(out[i]->Download() == items[i].bytes);
  }
  int after = -1;
  gpu_test::Ok(cudaGetDevice(&after));
  CHECK(after == before);
  SetDeviceBackend(nullptr);
}

TEST_CASE("SaveAsync from device memory: the snapshot as it was, through one pinned pair reused by every save") {
  cuda::Options options;
  options.buffer_bytes = std::size_t{1} << 20;
  auto backend = cuda::Register(options);
  Placed placed;
  std::vector<Item>& items = placed.items;
  StateDict &host_state = placed.host_state, &device_state = placed.device_state;
  TempDir tmp("gpu-async");
  SingleComm comm;
  Save(tmp / "host", host_state, comm);
  AsyncSaveOptions o;
  o.overwrite = true;
  o.staging = std::make_shared<StagingPool>();
  uint64_t reserved = 0;
  for (int i = 0; i < 3; ++i) {
    const SaveHandle h = SaveAsync(tmp / "dev", device_state, comm, o);
    // The device memory changes as soon as SaveAsync returns: the checkpoint holds the bytes
    // it had then.
    for (std::size_t k = 0; k < items.size(); ++k) {
      gpu_test::Ok(cudaMemset(placed.device[k]->get(), 0x5a, items[k].bytes.size()));
    }
    h.Wait();
    ckpt_test::CheckSameChunks(ReadMetadata(tmp / "host"), ReadMetadata(tmp / "dev"));
    for (std::size_t k = 0; k < items.size(); ++k) {
      gpu_test::Ok(
          cudaMemcpy(placed.device[k]->get(), items[k].bytes.data(), items[k].bytes.size(), cudaMemcpyHostToDevice));
    }
    if (i == 0) reserved = o.staging->reserved_bytes();
  }
  const cuda::PoolStats stats = cuda::Stats(*backend);
  CHECK(stats.pairs == 1);     // pinned once, by the first snapshot ...
  CHECK(stats.acquires == 3);  // ... and reused by the next two
  CHECK(stats.pinned_bytes == 2 * options.buffer_bytes);
  CHECK(o.staging->reserved_bytes() == reserved);  // the host staging, reused too
  SetDeviceBackend(nullptr);
}

TEST_CASE("device to host to device: saved by 2 ranks from the device, resharded over 3 on the host, back") {
  auto backend = cuda::Register();
  const Shape shape{96, 1000};
  const std::vector<uint8_t> global = ckpt_test::RandomBytes(96 * 1000 * 4, 9);
  const auto rows = [&](int64_t begin, int64_t count) {
    return std::vector<uint8_t>(global.begin() + begin * 4000, global.begin() + (begin + count) * 4000);
  };
  TempDir tmp("gpu");
  RunThreads(2, [&](Comm& comm) {
    DeviceBuffer mine(rows(comm.rank() * 48, 48));
    Tensor t = Tensor::Slice(DType::kFloat32, shape, 0, comm.rank() * 48, 48, mine.get());
    t.chunks[0].device = 0;
    StateDict sd;
    sd.Add("w", std::move(t));
    Save(tmp / "a", sd, comm);
  });
  RunThreads(3, [&](Comm& comm) {
    std::vector<uint8_t> host(32 * 4000, 0);
    StateDict sd;
    sd.Add("w", Tensor::Slice(DType::kFloat32, shape, 0, comm.rank() * 32, 32, host.data()));
    Load(tmp / "a", sd, comm);
    CHECK(host == rows(comm.rank() * 32, 32));
    Save(tmp / "b", sd, comm);
  });
  SingleComm one;
  DeviceBuffer whole(global.size());
  Tensor t = Tensor::Full(DType::kFloat32, shape, whole.get());
  t.chunks[0].device = 0;
  StateDict sd;
  sd.Add("w", std::move(t));
  Load(tmp / "b", sd, one);
  CHECK(whole.Download() == global);
  SetDeviceBackend(nullptr);
}

TEST_CASE("the stats kernel agrees with the host's statistics of the same chunk") {
  std::vector<float> values = {1.5f, -2.0f, std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::infinity(), 0.25f};
  std::vector<uint8_t> random = ckpt_test::RandomBytes(std::size_t{3} << 20, 5);
  values.resize(values.size() + random.size() / 4);
  std::memcpy(values.data() + 5, random.data(), random.size());
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  DeviceBuffer d(bytes);
  TempDir tmp("gpu");
  SingleComm comm;
  StateDict sd;
  sd.Add("x", Tensor::Full(DType::kFloat32, {static_cast<int64_t>(values.size())}, values.data()));
  Save(tmp / "c", sd, comm);
  const ChunkStats host = *ReadMetadata(tmp / "c").Find("x")->chunks.at(0).stats;
  const ChunkStats dev = cuda::DeviceStatsFloat32(d.get(), values.size(), 0);
  CHECK(dev.nan_count == host.nan_count);
  CHECK(dev.inf_count == host.inf_count);
  CHECK(dev.finite_count == host.finite_count);
  CHECK(dev.min == host.min);
  CHECK(dev.max == host.max);
  CHECK(dev.l2 == doctest::Approx(host.l2).epsilon(1e-9));
  CHECK(dev.mean == doctest::Approx(host.mean).epsilon(1e-6));
}

TEST_CASE("host memory marked as device memory is refused, naming the key") {
  auto backend = cuda::Register();
  std::vector<float> host(16, 1.0f);
  Tensor t = Tensor::Full(DType::kFloat32, {16}, host.data());
  t.chunks[0].device = 0;
  StateDict sd;
  sd.Add("opt.state", std::move(t));
  TempDir tmp("gpu");
  SingleComm comm;
  try {
    Save(tmp / "c", sd, comm);
    FAIL("saved host memory as device memory");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    CHECK(std::string(e.what()).find("opt.state") != std::string::npos);
  }
  std::get<Tensor>(sd.At("opt.state")).chunks[0].device = cuda::DeviceCount();  // no such device
  CHECK_THROWS_AS(Save(tmp / "c", sd, comm), Error);
  CHECK(!fs::exists(tmp / "c"));
  SetDeviceBackend(nullptr);
}
