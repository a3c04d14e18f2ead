// SaveAsync (ckpt/checkpoint.h) and the save timings every save records (FORMAT.md §3.8).
// The background write is held at a gate in the file-system seam (storage/fs.h) where a
// test needs it still running, so that nothing here depends on how long anything takes.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "checkpoint/staging.h"
#include "ckpt/ckpt.h"
#include "ckpt/ops/inspect.h"
#include "ckpt_edit.h"
#include "fault/fault_fs.h"
#include "fault/fault_util.h"
#include "test_util.h"

namespace {

using namespace ckpt;
namespace fs = std::filesystem;
using ckpt_test::GateFs;
using ckpt_test::Leftovers;
using ckpt_test::Installed;

// Fails the fsync of shard files whose name contains `shard` with EIO while armed.
class FsyncFailFs : public storage::FileSystem {
 public:
  explicit FsyncFailFs(std::string shard) : shard_(std::move(shard)) {}
  int Fsync(int fd, const fs::path& path) override {
    if (armed.load() && path.filename().string().find(shard_) != std::string::npos) {
      errno = EIO;
      return -1;
    }
    return FileSystem::Fsync(fd, path);
  }
  std::atomic<bool> armed{true};

 private:
  std::string shard_;
};

constexpr int64_t kRows = 16, kCols = 32;

float Value(int version, int64_t i) { return static_cast<float>(version * 100000 + i); }

// One rank's part of a versioned state: rows of "w", a replicated "b", a bytes entry and a
// scalar, every value telling its version.
struct RankState {
  std::vector<float> w, b;
  StateDict sd;
  RankState(const Comm& comm, int version) {
    const int64_t per = kRows / comm.size(), begin = per * comm.rank();
    w.resize(static_cast<std::size_t>(per * kCols));
    b.resize(kCols);
    Fill(version, begin);
    sd.Add("w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 0, begin, per, w.data()));
    sd.Add("b", Tensor::Full(DType::kFloat32, {kCols}, b.data()));
    sd.Add("blob", Bytes{std::vector<uint8_t>(10, static_cast<uint8_t>(version))});
    sd.Add("version", Scalar::Int(version));
  }
  // Every value of this rank's state changed to `version`'s.
  void Change(int version, int64_t begin) {
    Fill(version, begin);
    std::get<Bytes>(sd.At("blob")).data.assign(10, static_cast<uint8_t>(version));
    std::get<Scalar>(sd.At("version")) = Scalar::Int(version);
  }
  void Fill(int version, int64_t begin) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = Value(version, begin * kCols + static_cast<int64_t>(i));
    for (int64_t i = 0; i < kCols; ++i) b[static_cast<std::size_t>(i)] = Value(version, -i);
  }
};

int64_t BeginOf(const Comm& comm) { return kRows / comm.size() * comm.rank(); }

// The version a checkpoint holds, after checking that all of it is that version's.
int VersionOf(const fs::path& dir) {
  auto r = CheckpointReader::Open(dir);
  std::vector<float> w(kRows * kCols), b(kCols);
  r->ReadRegion("w", Box::Full({kRows, kCols}), w.data());
  r->ReadRegion("b", Box::Full({kCols}), b.data());
  const int v = static_cast<int>(w[0] / 100000);
  for (std::size_t i = 0; i < w.size(); ++i) REQUIRE(w[i] == Value(v, static_cast<int64_t>(i)));
  for (int64_t i = 0; i < kCols; ++i) REQUIRE(b[static_cast<std::size_t>(i)] == Value(v, -i));
  REQUIRE(r->ReadBytes("blob") == std::vector<uint8_t>(10, static_cast<uint8_t>(v)));
  REQUIRE(r->metadata().Find("version")->value == std::to_string(v));
  return v;
}

// A sync save of `version`'s state by `world` ranks.
void SaveSync(const fs::path& dir, int version, int world) {
  RunThreads(world, [&](Comm& comm) {
    RankState s(comm, version);
    Save(dir, s.sd, comm);
  });
}

void CheckTimings(const SaveTimings& t, int world) {
  for (std::size_t i = 0; i < std::size(kSavePhaseNames); ++i) {
    CAPTURE(kSavePhaseNames[i]);
    const PhaseTiming& p = SavePhase(t, i);
    CHECK(p.min >= 0);
    CHECK(p.min <= p.median);
    CHECK(p.median <= p.max);
    CHECK(p.slowest_rank >= 0);
    CHECK(p.slowest_rank < world);
  }
}

ErrorCode CodeOf(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  FAIL("no error");
  return ErrorCode::kInternal;
}

}  // namespace

TEST_CASE("save timings: a sync and an async save record them, and ckpt-inspect shows them") {
  ckpt_test::TempDir tmp("timings");
  RunThreads(4, [&](Comm& comm) {
    RankState s(comm, 1);
    Save(tmp / "sync", s.sd, comm);
    SaveAsync(tmp / "async", s.sd, comm).Wait();
  });
  const Metadata sync_md = ReadMetadata(tmp / "sync", false);
  REQUIRE(sync_md.save_timings.has_value());
  CHECK_FALSE(sync_md.save_timings->async);
  CheckTimings(*sync_md.save_timings, 4);
  CHECK(sync_md.save_timings->snapshot.max == 0);
  // A sync save blocks its caller through the write: on every rank, so also at the max.
  CHECK(sync_md.save_timings->blocked.max + 2e-6 >= sync_md.save_timings->write.max);
  CHECK(sync_md.save_timings->blocked.max + 2e-6 >= sync_md.save_timings->plan.max);

  const Metadata async_md = ReadMetadata(tmp / "async", false);
  REQUIRE(async_md.save_timings.has_value());
  CHECK(async_md.save_timings->async);
  CheckTimings(*async_md.save_timings, 4);
  // SaveAsync's blocked time includes its snapshot.
  CHECK(async_md.save_timings->blocked.max + 2e-6 >= async_md.save_timings->snapshot.max);

  // What metadata.json says is what the model holds (microseconds), and inspect shows it.
  const nlohmann::json j = ckpt_test::ReadMetaJson(tmp / "async");
  CHECK(j["save_timings"]["mode"] == "async");
  CHECK(j["save_timings"]["write"]["slowest_rank"] == async_md.save_timings->write.slowest_rank);
  CHECK(j["save_timings"]["write"]["max"].get<double>() == async_md.save_timings->write.max);
  const ops::InspectReport report = ops::Inspect(tmp / "async", {});
  const std::string text = ops::RenderInspectText(report, false, false);
  CHECK(text.find("saved       async by 4 ranks") != std::string::npos);
  for (const char* phase : kSavePhaseNames) CHECK(text.find(std::string("  ") + phase + " ") != std::string::npos);
  const nlohmann::json ij = nlohmann::json::parse(ops::RenderInspectJson(report));
  CHECK(ij["save_timings"]["mode"] == "async");
  CHECK(ij["save_timings"]["blocked"]["max"].get<double>() == async_md.save_timings->blocked.max);
  const nlohmann::json sj = nlohmann::json::parse(ops::RenderInspectJson(ops::Inspect(tmp / "sync", {})));
  CHECK(sj["save_timings"]["mode"] == "sync");
}

TEST_CASE("save timings: optional, checked when present, covered by the digest") {
  ckpt_test::TempDir tmp("timings-format");
  const fs::path dir = tmp / "ck";
  SaveSync(dir, 1, 2);
  const nlohmann::json good = ckpt_test::ReadMetaJson(dir);
  REQUIRE(good.contains("save_timings"));

  SUBCASE("a file without them (older writers, the tools) reads, without timings") {
    nlohmann::json m = good;
    m.erase("save_timings");
    ckpt_test::WriteMetaJson(dir, m);
    CHECK_FALSE(ReadMetadata(dir).save_timings.has_value());
    CHECK(VersionOf(dir) == 1);
  }
  SUBCASE("serialize and parse keep them") {
    const Metadata md = ReadMetadata(dir, false);
    const Metadata again = ParseMetadata(SerializeMetadata(md));
    REQUIRE(again.save_timings.has_value());
    CHECK(*again.save_timings == *md.save_timings);
  }
  struct Bad {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
  };
  for (const Bad& bad : {
           Bad{"mode", [](nlohmann::json& t) { t["mode"] = "later"; }},
           Bad{"slowest_rank", [](nlohmann::json& t) { t["write"]["slowest_rank"] = 2; }},
           Bad{"min <= median", [](nlohmann::json& t) { t["plan"]["median"] = t["plan"]["max"].get<double>() + 1; }},
           Bad{"non-negative", [](nlohmann::json& t) { t["fsync"]["min"] = -1; }},
           Bad{"'commit' must be an object", [](nlohmann::json& t) { t.erase("commit"); }},
           Bad{"must be an object", [](nlohmann::json& t) { t = 7; }},
       }) {
    CAPTURE(bad.what);
    nlohmann::json m = good;
    bad.edit(m["save_timings"]);
    ckpt_test::WriteMetaJson(dir, m);
    std::string message;
    CHECK(CodeOf([&] { ReadMetadata(dir); }, &message) == ErrorCode::kCorrupt);
    CHECK(message.find("metadata.json: save_timings: ") != std::string::npos);
    CHECK(message.find(bad.what) != std::string::npos);
  }
  // An edit the digest was not recomputed for is refused before anything is believed.
  nlohmann::json m = good;
  m["save_timings"]["blocked"]["max"] = 1e6;
  ckpt_test::WriteMetaJson(dir, m, ckpt_test::Digests::kKeepStale);
  std::string message;
  CHECK(CodeOf([&] { ReadMetadata(dir); }, &message) == ErrorCode::kCorrupt);
  CHECK(message.find("digest mismatch") != std::string::npos);
}

TEST_CASE("async save: the checkpoint holds the state as it was when SaveAsync returned") {
  ckpt_test::TempDir tmp("async-snapshot");
  GateFs gate;
  Installed on(gate);
  RunThreads(2, [&](Comm& comm) {
    RankState s(comm, 1);
    const SaveHandle h = SaveAsync(tmp / "ck", s.sd, comm);
    s.Change(2, BeginOf(comm));  // the caller's buffers, changed while the write is held
    CHECK_FALSE(h.Done());
    CHECK(h.staging_bytes() >= s.w.size() * sizeof(float) + s.b.size() * sizeof(float));
    comm.Barrier();  // the caller's group, while the background one is busy
    if (comm.rank() == 0) gate.Open();
    h.Wait();
    CHECK(h.Done());
  });
  CHECK(VersionOf(tmp / "ck") == 1);
}

TEST_CASE("async save: the snapshot's copies, split and grouped across the worker pool, are exact") {
  // One chunk of 9 MiB + 3 bytes (split into pieces, a short last one), 500 small tensors
  // (grouped), a bytes entry between them; every source changed after SaveAsync returns.
  ckpt_test::TempDir tmp("async-pieces");
  const std::size_t big = (std::size_t{9} << 20) / 4 + 3;
  std::vector<float> w(big);
  std::vector<std::vector<int32_t>> small(500);
  std::vector<uint8_t> blob(70000);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 100003);
  for (std::size_t t = 0; t < small.size(); ++t) small[t].assign(1 + t % 37, static_cast<int32_t>(t * 7 + 1));
  for (std::size_t i = 0; i < blob.size(); ++i) blob[i] = static_cast<uint8_t>(i * 31);
  const std::vector<float> w0 = w;
  const std::vector<std::vector<int32_t>> small0 = small;
  const std::vector<uint8_t> blob0 = blob;
  StateDict sd;
  sd.Add("big", Tensor::Full(DType::kFloat32, {static_cast<int64_t>(big)}, w.data()));
  sd.Add("blob", Bytes{blob});
  for (std::size_t t = 0; t < small.size(); ++t)
    sd.Add("s" + std::to_string(t), Tensor::Full(DType::kInt32, {static_cast<int64_t>(small[t].size())}, small[t].data()));
  SingleComm comm;
  const SaveHandle h = SaveAsync(tmp / "ck", sd, comm);
  std::fill(w.begin(), w.end(), -1.0f);
  for (auto& v : small) std::fill(v.begin(), v.end(), -1);
  std::get<Bytes>(sd.At("blob")).data.assign(blob.size(), 0);
  h.Wait();
  auto r = CheckpointReader::Open(tmp / "ck");
  std::vector<float> got(big);
  r->ReadRegion("big", Box::Full({static_cast<int64_t>(big)}), got.data());
  CHECK(got == w0);
  CHECK(r->ReadBytes("blob") == blob0);
  for (std::size_t t = 0; t < small.size(); ++t) {
    std::vector<int32_t> v(small0[t].size());
    r->ReadRegion("s" + std::to_string(t), Box::Full({static_cast<int64_t>(v.size())}), v.data());
    REQUIRE(v == small0[t]);
  }
}

TEST_CASE("async save: a background failure is reported once on every rank: by Wait, else by the next SaveAsync") {
  ckpt_test::TempDir tmp("async-fail");
  FsyncFailFs faulty("shard-00001-of");
  Installed on(faulty);
  std::atomic<int> wait_threw{0}, next_threw{0}, next_failed{0}, later_threw{0};
  RunThreads(4, [&](Comm& comm) {
    RankState s(comm, 1);
    const SaveHandle h = SaveAsync(tmp / "a", s.sd, comm);
    std::string message;
    if (comm.rank() < 2) {  // ranks 0 and 1 wait; 2 and 3 never do
      CHECK(CodeOf([&] { h.Wait(); }, &message) == ErrorCode::kIO);
      CHECK(message.find("shard-00001-of-00004.h5") != std::string::npos);
      ++wait_threw;
      // Wait reported it: this rank's next SaveAsync does not throw it again. But ranks 2 and
      // 3 throw it there, so that save fails here with their reason, told by its Wait.
      const SaveHandle next = SaveAsync(tmp / "b", s.sd, comm);
      CHECK(CodeOf([&] { next.Wait(); }, &message) == ErrorCode::kIO);
      CHECK(message.find("rank 2: ") != std::string::npos);
      CHECK(message.find("shard-00001-of-00004.h5") != std::string::npos);
      ++next_failed;
    } else {
      CHECK(CodeOf([&] { SaveAsync(tmp / "b", s.sd, comm); }, &message) == ErrorCode::kIO);
      CHECK(message.find("shard-00001-of-00004.h5") != std::string::npos);
      ++next_threw;
    }
    comm.Barrier();
    if (comm.rank() == 0) faulty.armed = false;
    comm.Barrier();
    // Every failure was reported once; the next save starts afresh on every rank.
    SaveAsync(tmp / "c", s.sd, comm).Wait();
    WaitForSaves(comm);  // nothing left to report
    // And the failed one still says so when asked.
    CHECK(CodeOf([&] { h.Wait(); }) == ErrorCode::kIO);
    ++later_threw;
  });
  CHECK(wait_threw == 2);
  CHECK(next_failed == 2);
  CHECK(next_threw == 2);
  CHECK(later_threw == 4);
  CHECK_FALSE(fs::exists(tmp / "a"));
  CHECK_FALSE(fs::exists(tmp / "b"));
  CHECK(VersionOf(tmp / "c") == 1);
  CHECK(Leftovers(tmp.path()).empty());
}

// Captures what is written to stderr (fd 2) during its life.
class StderrCapture {
 public:
  explicit StderrCapture(const fs::path& file) : file_(file) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    REQUIRE(fd >= 0);
    ::dup2(fd, 2);
    ::close(fd);
  }
  std::string Stop() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    std::ifstream in(file_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  fs::path file_;
  int saved_;
};

TEST_CASE("async save: failures reported by nobody are printed once; several pending are thrown together") {
  ckpt_test::TempDir tmp("async-unreported");
  FsyncFailFs faulty("shard-00000-of");
  Installed on(faulty);
  SUBCASE("a failed save whose handle was dropped unwaited is printed when the Comm goes") {
    StderrCapture err(tmp / "stderr");
    {
      SingleComm comm;
      RankState s(comm, 1);
      SaveAsync(tmp / "dropped", s.sd, comm);  // the handle goes at once
    }
    const std::string printed = err.Stop();
    CHECK(printed.find("asynchronous save to " + (tmp / "dropped").string() + " failed") != std::string::npos);
    CHECK(printed.find("shard-00000-of-00001.h5") != std::string::npos);
  }
  SUBCASE("one reported by Wait is not printed, nor thrown again") {
    StderrCapture err(tmp / "stderr");
    {
      SingleComm comm;
      RankState s(comm, 1);
      CHECK(CodeOf([&] { SaveAsync(tmp / "waited", s.sd, comm).Wait(); }) == ErrorCode::kIO);
      WaitForSaves(comm);
    }
    CHECK(err.Stop().find("asynchronous save") == std::string::npos);
  }
  SUBCASE("two unwaited failures: the next SaveAsync throws one error naming both, then none") {
    SingleComm comm;
    RankState s(comm, 1);
    AsyncSaveOptions two;
    two.max_in_flight = 2;
    const SaveHandle h1 = SaveAsync(tmp / "one", s.sd, comm, two);
    const SaveHandle h2 = SaveAsync(tmp / "two", s.sd, comm, two);
    h1.WaitQuietly();  // finished, and reported to nobody
    h2.WaitQuietly();
    CHECK(h1.Done());
    std::string message;
    CHECK(CodeOf([&] { SaveAsync(tmp / "three", s.sd, comm, two); }, &message) == ErrorCode::kIO);
    CHECK(message.find("2 asynchronous saves failed") != std::string::npos);
    CHECK(message.find((tmp / "one").string() + ": ") != std::string::npos);
    CHECK(message.find((tmp / "two").string() + ": ") != std::string::npos);
    faulty.armed = false;
    SaveAsync(tmp / "four", s.sd, comm, two).Wait();
    WaitForSaves(comm);
    CHECK(VersionOf(tmp / "four") == 1);
  }
}

TEST_CASE("async save: bytes entries are staged in the pool too, so its bound holds for every byte") {
  ckpt_test::TempDir tmp("async-bytes");
  SingleComm comm;
  std::vector<float> w(1024, 1.0f);  // 4 KiB
  StateDict sd;
  sd.Add("w", Tensor::Full(DType::kFloat32, {1024}, w.data()));
  sd.Add("blob", Bytes{std::vector<uint8_t>(256 * 1024, 7)});
  sd.Add("empty", Bytes{});
  sd.Add("step", Scalar::Int(3));
  // A pool with room for the tensor but not the bytes entry refuses the snapshot.
  AsyncSaveOptions small;
  small.staging = std::make_shared<StagingPool>(64 * 1024);
  std::string message;
  CHECK(CodeOf([&] { SaveAsync(tmp / "small", sd, comm, small); }, &message) == ErrorCode::kInvalidArgument);
  CHECK(message.find("staging") != std::string::npos);
  CHECK(small.staging->reserved_bytes() == 0);
  // With room for both, the snapshot holds both, and only the pool's memory.
  AsyncSaveOptions o;
  o.staging = std::make_shared<StagingPool>(1024 * 1024);
  {
    GateFs gate;
    Installed on(gate);
    const SaveHandle h = SaveAsync(tmp / "ck", sd, comm, o);
    CHECK(h.staging_bytes() >= 4096 + 256 * 1024);
    CHECK(o.staging->in_use_bytes() == h.staging_bytes());
    // The caller's bytes change, and their old memory is freed, while the write is held.
    std::get<Bytes>(sd.At("blob")).data = std::vector<uint8_t>(10, 9);
    std::get<Bytes>(sd.At("empty")).data = std::vector<uint8_t>(5, 1);
    gate.Open();
    h.Wait();
  }
  CHECK(o.staging->in_use_bytes() == 0);
  auto r = CheckpointReader::Open(tmp / "ck");
  CHECK(r->ReadBytes("blob") == std::vector<uint8_t>(256 * 1024, 7));
  CHECK(r->ReadBytes("empty").empty());
  // A state of bytes entries only is staged the same way.
  StateDict only;
  only.Add("blob", Bytes{std::vector<uint8_t>(100, 5)});
  const SaveHandle h = SaveAsync(tmp / "only", only, comm, o);
  CHECK(h.staging_bytes() >= 100);
  h.Wait();
  CHECK(CheckpointReader::Open(tmp / "only")->ReadBytes("blob") == std::vector<uint8_t>(100, 5));
}

TEST_CASE("async save: a failure on one rank's SaveAsync fails that save on every rank") {
  ckpt_test::TempDir tmp("async-foreground");
  RunThreads(2, [&](Comm& comm) {
    RankState s(comm, 1);
    AsyncSaveOptions o;
    if (comm.rank() == 1) o.staging = std::make_shared<StagingPool>(1);  // too small for its snapshot
    std::string message;
    if (comm.rank() == 1) {
      CHECK(CodeOf([&] { SaveAsync(tmp / "ck", s.sd, comm, o); }, &message) == ErrorCode::kInvalidArgument);
      CHECK(message.find("staging") != std::string::npos);
    } else {
      const SaveHandle h = SaveAsync(tmp / "ck", s.sd, comm, o);
      CHECK(CodeOf([&] { h.Wait(); }, &message) == ErrorCode::kInvalidArgument);
      CHECK(message.find("rank 1: SaveAsync: the snapshot needs") != std::string::npos);
    }
    // Reported where it happened (a SaveAsync that threw), so not again: the next one commits.
    SaveAsync(tmp / "ck", s.sd, comm).Wait();
  });
  CHECK(VersionOf(tmp / "ck") == 1);
}

TEST_CASE("async save: cancel on one rank commits nothing and keeps the last checkpoint") {
  ckpt_test::TempDir tmp("async-cancel");
  const fs::path dir = tmp / "ck";
  SaveSync(dir, 1, 2);
  {
    GateFs gate;
    Installed on(gate);
    RunThreads(2, [&](Comm& comm) {
      RankState s(comm, 2);
      AsyncSaveOptions o;
      o.overwrite = true;
      const SaveHandle h = SaveAsync(dir, s.sd, comm, o);
      if (comm.rank() == 1) h.Cancel();
      comm.Barrier();
      if (comm.rank() == 0) gate.Open();
      std::string message;
      CHECK(CodeOf([&] { h.Wait(); }, &message) == ErrorCode::kCancelled);
      CHECK(message.find("save cancelled") != std::string::npos);
      // Cancelling is not a failure: the next save runs and commits.
      RankState t(comm, 3);
      SaveAsync(tmp / "after", t.sd, comm).Wait();
    });
  }
  CHECK(VersionOf(dir) == 1);
  CHECK(VersionOf(tmp / "after") == 3);
  CHECK(Leftovers(tmp.path()).empty());
}

TEST_CASE("async save: at most max_in_flight saves in flight; the staging is reused") {
  ckpt_test::TempDir tmp("async-inflight");
  SingleComm comm;
  RankState s(comm, 1);
  auto pool = std::make_shared<StagingPool>();
  AsyncSaveOptions two;
  two.max_in_flight = 2;
  two.staging = pool;
  GateFs gate;
  std::optional<Installed> on(std::in_place, gate);
  std::atomic<bool> waited{false};
  internal::SetSlotWaitHookForTest([&] {
    waited = true;
    gate.Open();
  });
  const SaveHandle h1 = SaveAsync(tmp / "1", s.sd, comm, two);
  const SaveHandle h2 = SaveAsync(tmp / "2", s.sd, comm, two);  // two in flight, both held
  CHECK_FALSE(h1.Done());
  CHECK_FALSE(h2.Done());
  CHECK_FALSE(waited);
  CHECK(pool->in_use_bytes() == 2 * h1.staging_bytes());
  const SaveHandle h3 = SaveAsync(tmp / "3", s.sd, comm, two);  // a third waits for the first
  CHECK(waited);
  CHECK(h1.Done());
  internal::SetSlotWaitHookForTest({});
  for (const SaveHandle& h : {h1, h2, h3}) h.Wait();
  on.reset();
  const uint64_t reserved = pool->reserved_bytes();
  CHECK(pool->in_use_bytes() == 0);
  CHECK(reserved == 2 * h1.staging_bytes());  // three snapshots in two buffers
  SaveAsync(tmp / "4", s.sd, comm, two).Wait();
  CHECK(pool->reserved_bytes() == reserved);  // reused, not allocated again
  pool->Trim();
  CHECK(pool->reserved_bytes() == 0);
  for (const char* d : {"1", "2", "3", "4"}) CHECK(VersionOf(tmp / d) == 1);
  // A bounded pool refuses a snapshot that does not fit beside those in flight.
  AsyncSaveOptions bounded = two;
  bounded.staging = std::make_shared<StagingPool>(h1.staging_bytes());
  GateFs held;
  Installed hold(held);
  const SaveHandle first = SaveAsync(tmp / "5", s.sd, comm, bounded);
  CHECK(CodeOf([&] { SaveAsync(tmp / "6", s.sd, comm, bounded); }) == ErrorCode::kInvalidArgument);
  held.Open();
  first.Wait();
  CHECK(VersionOf(tmp / "5") == 1);
  CHECK_FALSE(fs::exists(tmp / "6"));
  CHECK(CodeOf([&] {
          AsyncSaveOptions zero;
          zero.max_in_flight = 0;
          SaveAsync(tmp / "7", s.sd, comm, zero);
        }) == ErrorCode::kInvalidArgument);
  WaitForSaves(comm);
}

TEST_CASE("Comm::Dup: a group of the same ranks usable from another thread at the same time") {
  RunThreads(3, [](Comm& comm) {
    std::unique_ptr<Comm> dup = comm.Dup();
    CHECK(dup->rank() == comm.rank());
    CHECK(dup->size() == comm.size());
    // Both groups busy at once, from two threads of every rank: neither sees the other's data.
    std::vector<std::vector<ByteBuffer>> from_dup;
    std::thread other([&] {
      for (int i = 0; i < 200; ++i) {
        const uint8_t mine[2] = {static_cast<uint8_t>(100 + dup->rank()), static_cast<uint8_t>(i)};
        from_dup.push_back(dup->AllGather(mine));
      }
    });
    for (int i = 0; i < 200; ++i) {
      const uint8_t mine[2] = {static_cast<uint8_t>(comm.rank()), static_cast<uint8_t>(i)};
      const auto all = comm.AllGather(mine);
      for (int r = 0; r < 3; ++r) CHECK(all[r] == ByteBuffer{static_cast<uint8_t>(r), static_cast<uint8_t>(i)});
    }
    other.join();
    for (int i = 0; i < 200; ++i)
      for (int r = 0; r < 3; ++r)
        CHECK(from_dup[i][r] == ByteBuffer{static_cast<uint8_t>(100 + r), static_cast<uint8_t>(i)});
  });
}
