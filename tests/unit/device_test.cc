// The device seam (ckpt/device.h) without a GPU: a fake backend whose "device memory" is an
// address range reserved PROT_NONE (ckpt touching it directly would crash), copied with
// memcpy by its staging, which checks the double-buffer protocol as it goes: at most one copy
// per slot in flight; a copy to the host lands only at Wait (its buffer holds poison until
// then, so bytes read early are wrong); a buffer sent to the device must not change before
// its Wait; nothing may be in flight when a staging is returned.
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>

#include "ckpt/ckpt.h"
#include "device_util.h"

namespace fs = std::filesystem;
using namespace ckpt;
using ckpt_test::TempDir;

namespace {

constexpr uint8_t kPoison = 0xCD;

class FakeBackend final : public DeviceBackend {
 public:
  explicit FakeBackend(std::size_t buffer_bytes) : buffer_bytes_(buffer_bytes) {
    base_ = static_cast<uint8_t*>(
        ::mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    REQUIRE(base_ != MAP_FAILED);
    real_.resize(kReserve / 16);
  }
  ~FakeBackend() override { ::munmap(base_, kReserve); }

  // Device memory holding `bytes`; the address is not readable by anyone but this backend.
  void* Upload(const std::vector<uint8_t>& bytes) {
    std::lock_guard lock(mu_);
    const std::size_t at = used_;
    used_ += (bytes.size() + 63) / 64 * 64 + 64;
    REQUIRE(used_ <= real_.size());
    std::copy(bytes.begin(), bytes.end(), real_.begin() + static_cast<std::ptrdiff_t>(at));
    return base_ + at;
  }
  std::vector<uint8_t> Download(const void* p, std::size_t n) {
    const uint8_t* r = Real(p, n);
    return std::vector<uint8_t>(r, r + n);
  }
  void* Alloc(std::size_t n, uint8_t fill) { return Upload(std::vector<uint8_t>(n, fill)); }

  std::string name() const override { return "fake"; }
  void CheckMemory(const void* ptr, std::size_t n, int device, const std::string& what) override {
    if (device != 0) throw Error(ErrorCode::kInvalidArgument, what + ": the fake has only device 0");
    if (!Inside(ptr, n)) throw Error(ErrorCode::kInvalidArgument, what + ": not fake device memory");
  }
  std::unique_ptr<DeviceStaging> AcquireStaging() override;

  uint8_t* Real(const void* p, std::size_t n) {
    if (!Inside(p, n)) Violation("a copy outside fake device memory");
    return real_.data() + (static_cast<const uint8_t*>(p) - base_);
  }
  void Violation(const std::string& what) {
    std::lock_guard lock(mu_);
    violations.push_back(what);
  }

  std::mutex mu_;
  std::vector<std::string> violations;
  std::size_t acquires = 0, to_host = 0, to_device = 0, waits = 0;
  std::size_t overlapped = 0;  // copies enqueued while the other slot's copy was in flight
  std::size_t pairs = 0;       // buffer pairs ever allocated ("pinned")
  std::vector<std::unique_ptr<std::vector<uint8_t>[]>> idle;

 private:
  friend class FakeStaging;
  static constexpr std::size_t kReserve = std::size_t{1} << 30;
  bool Inside(const void* p, std::size_t n) {
    const auto* q = static_cast<const uint8_t*>(p);
    std::lock_guard lock(mu_);
    return q >= base_ && q + n <= base_ + used_;
  }
  std::size_t buffer_bytes_;
  uint8_t* base_ = nullptr;
  std::vector<uint8_t> real_;
  std::size_t used_ = 0;
};

class FakeStaging final : public DeviceStaging {
 public:
  FakeStaging(FakeBackend& owner, std::unique_ptr<std::vector<uint8_t>[]> buffers)
      : owner_(owner), buffers_(std::move(buffers)) {}
  ~FakeStaging() override {
    for (const Pending& p : pending_)
      if (p.kind != Pending::kNone) owner_.Violation("staging returned with a copy in flight");
    std::lock_guard lock(owner_.mu_);
    owner_.idle.push_back(std::move(buffers_));
  }
  std::size_t buffer_bytes() const override { return buffers_[0].size(); }
  void* buffer(int slot) override { return buffers_[Slot(slot)].data(); }

  void CopyToHostAsync(int slot, const void* src, std::size_t n, int device) override {
    Pending& p = Begin(slot, n, device);
    p.kind = Pending::kToHost;
    p.device_ptr = owner_.Real(src, n);
    std::fill_n(buffers_[slot].begin(), n, kPoison);
    std::lock_guard lock(owner_.mu_);
    ++owner_.to_host;
  }
  void CopyToDeviceAsync(int slot, void* dst, std::size_t n, int device) override {
    Pending& p = Begin(slot, n, device);
    p.kind = Pending::kToDevice;
    p.device_ptr = owner_.Real(dst, n);
    p.snapshot.assign(buffers_[slot].begin(), buffers_[slot].begin() + static_cast<std::ptrdiff_t>(n));
    std::lock_guard lock(owner_.mu_);
    ++owner_.to_device;
  }
  void Wait(int slot) override {
    Pending& p = pending_[Slot(slot)];
    if (p.kind == Pending::kToHost) {
      std::memcpy(buffers_[slot].data(), p.device_ptr, p.n);
    } else if (p.kind == Pending::kToDevice) {
      if (!std::equal(p.snapshot.begin(), p.snapshot.end(), buffers_[slot].begin())) {
        owner_.Violation("a staging buffer was rewritten while its copy to the device was in flight");
      }
      std::memcpy(p.device_ptr, p.snapshot.data(), p.n);
    }
    p = Pending{};
    std::lock_guard lock(owner_.mu_);
    ++owner_.waits;
  }

 private:
  struct Pending {
    enum Kind { kNone, kToHost, kToDevice } kind = kNone;
    uint8_t* device_ptr = nullptr;
    std::size_t n = 0;
    std::vector<uint8_t> snapshot;
  };
  static int Slot(int slot) {
    REQUIRE((slot == 0 || slot == 1));
    return slot;
  }
  Pending& Begin(int slot, std::size_t n, int device) {
    Pending& p = pending_[Slot(slot)];
    if (p.kind != Pending::kNone) owner_.Violation("a second copy enqueued on a slot whose copy is in flight");
    if (n > buffer_bytes()) owner_.Violation("a copy larger than the staging buffer");
    if (device != 0) owner_.Violation("a copy on device " + std::to_string(device));
    if (pending_[slot ^ 1].kind != Pending::kNone) {
      std::lock_guard lock(owner_.mu_);
      ++owner_.overlapped;
    }
    p = Pending{};
    p.n = n;
    return p;
  }
  FakeBackend& owner_;
  std::unique_ptr<std::vector<uint8_t>[]> buffers_;
  Pending pending_[2];
};

std::unique_ptr<DeviceStaging> FakeBackend::AcquireStaging() {
  std::unique_ptr<std::vector<uint8_t>[]> buffers;
  {
    std::lock_guard lock(mu_);
    ++acquires;
    if (!idle.empty()) {
      buffers = std::move(idle.back());
      idle.pop_back();
    }
  }
  if (!buffers) {
    buffers = std::make_unique<std::vector<uint8_t>[]>(2);
    buffers[0].resize(buffer_bytes_);
    buffers[1].resize(buffer_bytes_);
    std::lock_guard lock(mu_);
    ++pairs;
  }
  return std::make_unique<FakeStaging>(*this, std::move(buffers));
}

// Registers a backend for the life of the scope.
struct Registered {
  std::shared_ptr<FakeBackend> backend;
  explicit Registered(std::size_t buffer_bytes) : backend(std::make_shared<FakeBackend>(buffer_bytes)) {
    SetDeviceBackend(backend);
  }
  ~Registered() { SetDeviceBackend(nullptr); }
};

using Source = ckpt_test::TensorBytes;
using ckpt_test::ErrorOf;

std::vector<Source> Sources() {
  std::vector<Source> out;
  const auto add = [&](std::string key, DType dtype, Shape shape, uint64_t seed) {
    out.push_back(ckpt_test::MakeTensorBytes(std::move(key), dtype, std::move(shape), seed));
  };
  add("w.big", DType::kFloat32, {37, 29}, 1);         // 4292 B: many pieces of a 1002-B buffer
  add("w.cube", DType::kBFloat16, {5, 7, 41}, 2);     // rows of 82 B along the last dimension
  add("w.small", DType::kFloat64, {9}, 3);            // one piece
  add("w.ints", DType::kInt32, {300}, 4);             // 1200 B: two pieces, split mid-element on save
  add("scalar", DType::kFloat32, {}, 5);              // 0-D
  add("empty", DType::kFloat32, {0, 4}, 6);           // no bytes
  add("w.host", DType::kFloat32, {16, 16}, 7);        // stays in host memory
  return out;
}

// The whole of each source as one chunk: on the fake device (but w.host), or all on the host.
StateDict StateOf(std::vector<Source>& sources, FakeBackend* device) {
  StateDict sd;
  for (Source& s : sources) {
    Tensor t = Tensor::Full(s.dtype, s.shape, s.bytes.data());
    if (device && s.key != "w.host") {
      t.chunks[0].data = device->Upload(s.bytes);
      t.chunks[0].device = 0;
    }
    sd.Add(s.key, std::move(t));
  }
  return sd;
}

}  // namespace

TEST_CASE("device chunks save through the staging buffers, checksums and stats as from the host") {
  for (const Compression compression : {Compression{}, Compression{Compression::Codec::kZstd, 3}}) {
    CAPTURE(static_cast<int>(compression.codec));
    Registered reg(1002);
    std::vector<Source> sources = Sources();
    TempDir tmp("device");
    SingleComm comm;
    SaveOptions options;
    options.compression = compression;
    Save(tmp / "host", StateOf(sources, nullptr), comm, options);
    Save(tmp / "dev", StateOf(sources, reg.backend.get()), comm, options);
    CHECK(reg.backend->violations.empty());
    CHECK(reg.backend->acquires == 1);  // one staging pair for the whole save
    CHECK(reg.backend->overlapped > 0);  // the next piece was copied while this one was written
    ckpt_test::CheckSameChunks(ReadMetadata(tmp / "host"), ReadMetadata(tmp / "dev"));
    ckpt_test::CheckSameChunks(ReadMetadata(tmp / "dev"), ReadMetadata(tmp / "host"));

    // Loaded into host memory: the same bytes.
    std::vector<Source> back = Sources();
    for (Source& s : back) std::fill(s.bytes.begin(), s.bytes.end(), uint8_t{0});
    StateDict host_target = StateOf(back, nullptr);
    Load(tmp / "dev", host_target, comm);
    for (std::size_t i = 0; i < sources.size(); ++i) CHECK(back[i].bytes == sources[i].bytes);
  }
}

TEST_CASE("SaveAsync snapshots device chunks through the staging buffers: the checkpoint is the host one") {
  Registered reg(1002);
  std::vector<Source> sources = Sources();
  TempDir tmp("device-async");
  SingleComm comm;
  Save(tmp / "host", StateOf(sources, nullptr), comm);
  SaveHandle h = SaveAsync(tmp / "dev", StateOf(sources, reg.backend.get()), comm);
  h.Wait();
  CHECK(reg.backend->violations.empty());
  CHECK(reg.backend->acquires > 0);
  ckpt_test::CheckSameChunks(ReadMetadata(tmp / "host"), ReadMetadata(tmp / "dev"));
  std::vector<Source> back = Sources();
  for (Source& s : back) std::fill(s.bytes.begin(), s.bytes.end(), uint8_t{0});
  StateDict host_target = StateOf(back, nullptr);
  Load(tmp / "dev", host_target, comm);
  for (std::size_t i = 0; i < sources.size(); ++i) CHECK(back[i].bytes == sources[i].bytes);
}

TEST_CASE("device targets load through the staging buffers, bit-exact, with several reader threads") {
  for (const int threads : {1, 4}) {
    CAPTURE(threads);
    Registered reg(1002);
    std::vector<Source> sources = Sources();
    TempDir tmp("device");
    SingleComm comm;
    Save(tmp / "c", StateOf(sources, nullptr), comm);
    std::vector<Source> zero = Sources();
    for (Source& s : zero) std::fill(s.bytes.begin(), s.bytes.end(), uint8_t{0});
    StateDict target = StateOf(zero, reg.backend.get());
    LoadOptions options;
    options.io_threads = threads;
    Load(tmp / "c", target, comm, options);
    CHECK(reg.backend->violations.empty());
    CHECK(reg.backend->acquires <= static_cast<std::size_t>(threads));
    if (threads == 1) CHECK(reg.backend->overlapped > 0);  // a piece read while the last one was copied
    for (std::size_t i = 0; i < sources.size(); ++i) {
      CAPTURE(sources[i].key);
      const Chunk& c = std::get<Tensor>(target.At(sources[i].key)).chunks[0];
      if (c.device == kHostDevice) {
        CHECK(zero[i].bytes == sources[i].bytes);
      } else {
        CHECK(reg.backend->Download(c.data, sources[i].bytes.size()) == sources[i].bytes);
      }
    }
  }
}

TEST_CASE("device chunks reshard: saved by 2 ranks with device replicas, loaded by 3 into other device boxes") {
  Registered reg(256);
  const Shape shape{24, 10};
  const std::vector<uint8_t> global = ckpt_test::RandomBytes(24 * 10 * 4, 11);
  const std::vector<uint8_t> bias = ckpt_test::RandomBytes(10 * 4, 12);
  const auto rows = [&](int64_t begin, int64_t count) {
    return std::vector<uint8_t>(global.begin() + begin * 40, global.begin() + (begin + count) * 40);
  };
  TempDir tmp("device");
  RunThreads(2, [&](Comm& comm) {
    StateDict sd;
    const int64_t begin = comm.rank() * 12;
    Tensor w = Tensor::Slice(DType::kFloat32, shape, 0, begin, 12, nullptr);
    w.chunks[0].data = reg.backend->Upload(rows(begin, 12));
    w.chunks[0].device = 0;
    sd.Add("w", std::move(w));
    Tensor b = Tensor::Full(DType::kFloat32, {10}, nullptr);  // replicated: both ranks hash it
    b.chunks[0].data = reg.backend->Upload(bias);
    b.chunks[0].device = 0;
    sd.Add("b", std::move(b));
    Save(tmp / "c", sd, comm);
  });
  CHECK(reg.backend->violations.empty());
  RunThreads(3, [&](Comm& comm) {
    StateDict sd;
    const int64_t begin = comm.rank() * 8;
    Tensor w = Tensor::Slice(DType::kFloat32, shape, 0, begin, 8, nullptr);
    w.chunks[0].data = reg.backend->Alloc(8 * 40, 0);
    w.chunks[0].device = 0;
    void* wd = w.chunks[0].data;
    sd.Add("w", std::move(w));
    std::vector<uint8_t> b_host(40, 0);
    sd.Add("b", Tensor::Full(DType::kFloat32, {10}, b_host.data()));
    Load(tmp / "c", sd, comm);
    CHECK(reg.backend->Download(wd, 8 * 40) == rows(begin, 8));
    CHECK(b_host == bias);
  });
  CHECK(reg.backend->violations.empty());
}

TEST_CASE("replicas on a device that differ are an error naming the key") {
  Registered reg(64);
  TempDir tmp("device");
  const auto [code, msg] = ErrorOf([&] {
    RunThreads(2, [&](Comm& comm) {
      StateDict sd;
      std::vector<uint8_t> bytes = ckpt_test::RandomBytes(400, 3);
      if (comm.rank() == 1) bytes[399] ^= 1;  // the last piece differs
      Tensor t = Tensor::Full(DType::kFloat32, {100}, nullptr);
      t.chunks[0].data = reg.backend->Upload(bytes);
      t.chunks[0].device = 0;
      sd.Add("layer.replica", std::move(t));
      Save(tmp / "c", sd, comm);
    });
  });
  CHECK(code != ErrorCode::kInternal);
  CHECK(msg.find("layer.replica") != std::string::npos);
  CHECK(reg.backend->violations.empty());
  CHECK(!fs::exists(tmp / "c"));
}

TEST_CASE("a device chunk without a registered backend, or that the backend refuses, fails naming the key") {
  SetDeviceBackend(nullptr);
  TempDir tmp("device");
  SingleComm comm;
  std::vector<float> data(8, 1.0f);
  StateDict sd;
  Tensor t = Tensor::Full(DType::kFloat32, {8}, data.data());
  t.chunks[0].device = 0;
  sd.Add("model.weight", std::move(t));
  auto [code, msg] = ErrorOf([&] { Save(tmp / "c", sd, comm); });
  CHECK(code == ErrorCode::kInvalidArgument);
  CHECK(msg.find("model.weight") != std::string::npos);
  CHECK(msg.find("no device backend is registered") != std::string::npos);
  CHECK(!fs::exists(tmp / "c"));

  // Load: the same, and nothing is written into the target.
  StateDict host;
  host.Add("model.weight", Tensor::Full(DType::kFloat32, {8}, data.data()));
  Save(tmp / "c", host, comm);
  std::tie(code, msg) = ErrorOf([&] { Load(tmp / "c", sd, comm); });
  CHECK(code == ErrorCode::kInvalidArgument);
  CHECK(msg.find("load: tensor 'model.weight'") != std::string::npos);

  // A registered backend refusing the memory (a host pointer marked device 0), and a bad id.
  Registered reg(64);
  std::tie(code, msg) = ErrorOf([&] { Save(tmp / "d", sd, comm); });
  CHECK(code == ErrorCode::kInvalidArgument);
  CHECK(msg.find("model.weight") != std::string::npos);
  CHECK(msg.find("not fake device memory") != std::string::npos);
  std::get<Tensor>(sd.At("model.weight")).chunks[0].device = -7;
  std::tie(code, msg) = ErrorOf([&] { Save(tmp / "d", sd, comm); });
  CHECK(code == ErrorCode::kInvalidArgument);
  CHECK(msg.find("device -7") != std::string::npos);
  CHECK(reg.backend->acquires == 0);
}

TEST_CASE("each save returns its staging pair, and the next one reuses it") {
  Registered reg(512);
  std::vector<Source> sources = Sources();
  TempDir tmp("device");
  SingleComm comm;
  StateDict sd = StateOf(sources, reg.backend.get());
  SaveOptions options;
  options.overwrite = true;
  for (int i = 0; i < 3; ++i) Save(tmp / "c", sd, comm, options);
  CHECK(reg.backend->acquires == 3);
  CHECK(reg.backend->pairs == 1);
  CHECK(reg.backend->violations.empty());
}

TEST_CASE("SaveAsync of device chunks: one staging pair per snapshot; later saves pin and allocate nothing new") {
  Registered reg(512);
  std::vector<Source> sources = Sources();
  TempDir tmp("device-async-reuse");
  SingleComm comm;
  StateDict sd = StateOf(sources, reg.backend.get());
  AsyncSaveOptions options;
  options.overwrite = true;
  options.staging = std::make_shared<StagingPool>();
  SaveAsync(tmp / "c", sd, comm, options).Wait();
  CHECK(reg.backend->acquires == 1);  // the snapshot's device chunks share one pair
  CHECK(reg.backend->pairs == 1);
  CHECK(reg.backend->overlapped > 0);  // pieces of 512 B: copies overlapped
  const uint64_t reserved = options.staging->reserved_bytes();
  CHECK(reserved > 0);
  for (int i = 0; i < 2; ++i) SaveAsync(tmp / "c", sd, comm, options).Wait();
  CHECK(reg.backend->acquires == 3);
  CHECK(reg.backend->pairs == 1);                         // the pinned pair, reused
  CHECK(options.staging->reserved_bytes() == reserved);  // the host snapshot buffer, reused
  CHECK(reg.backend->violations.empty());
  std::vector<Source> back = Sources();
  for (Source& s : back) std::fill(s.bytes.begin(), s.bytes.end(), uint8_t{0});
  StateDict host_target = StateOf(back, nullptr);
  Load(tmp / "c", host_target, comm);
  for (std::size_t i = 0; i < sources.size(); ++i) CHECK(back[i].bytes == sources[i].bytes);
}
