// Save, SaveAsync and CheckpointWriter to s3:// on the project's own Ceph gateway
// (checkpoint/object_save.h): shards staged locally and uploaded under names unique to the
// save, metadata.json committed by one conditional PUT. Each checkpoint is read back by
// downloading it (files::DownloadObjectCheckpoint) and loading it locally, bytes compared.
// Races (new path, replace), a fault in the upload, a store without conditional PUT, and
// the leftovers' grace period.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <mutex>
#include <thread>

#include "checkpoint/object_save.h"
#include "ckpt/checkpoint.h"
#include "ckpt/files.h"
#include "ckpt/verify.h"
#include "error_of.h"
#include "forwarding_store.h"
#include "s3_gateway.h"
#include "storage/object_store.h"
#include "storage/s3_sign.h"
#include "storage/s3_store.h"
#include "test_util.h"

namespace st = ckpt::storage;
using ckpt::ErrorCode;

namespace {

// Delegates to the real store; a test sets the hooks it needs (run before the call).
class Wrapper : public s3_test::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::function<void(const std::string& key)> before_put;   // PutIfAbsent, PutIfMatch, Put
  std::function<void(const std::string& key, int part)> before_part;
  std::function<void(const std::string& key)> before_get_range;
  bool plain_puts = false;  // a store that ignores If-None-Match / If-Match

  std::string Put(const std::string& b, const std::string& k, st::ByteSpan body) override {
    if (before_put) before_put(k);
    return ForwardingStore::Put(b, k, body);
  }
  std::optional<std::string> PutIfAbsent(const std::string& b, const std::string& k, st::ByteSpan body) override {
    if (before_put) before_put(k);
    if (plain_puts) return ForwardingStore::Put(b, k, body);
    return ForwardingStore::PutIfAbsent(b, k, body);
  }
  std::optional<std::string> PutIfMatch(const std::string& b, const std::string& k, st::ByteSpan body,
                                        const std::string& etag) override {
    if (before_put) before_put(k);
    if (plain_puts) return ForwardingStore::Put(b, k, body);
    return ForwardingStore::PutIfMatch(b, k, body, etag);
  }
  std::string UploadPart(const std::string& b, const std::string& k, const std::string& id, int n,
                         st::ByteSpan body) override {
    if (before_part) before_part(k, n);
    return ForwardingStore::UploadPart(b, k, id, n, body);
  }
  void GetRange(const std::string& b, const std::string& k, uint64_t offset, std::span<std::byte> out) override {
    if (before_get_range) before_get_range(k);
    ForwardingStore::GetRange(b, k, offset, out);
  }
};

// Every store a save opens goes through one Wrapper while this lives (hooks on `hooks`).
struct Wrapped {
  Wrapper hooks{nullptr};
  Wrapped() {
    ckpt::internal::SetObjectStoreWrapperForTest([this](std::shared_ptr<st::ObjectStore> inner) {
      auto w = std::make_shared<Wrapper>(std::move(inner));
      w->before_put = [this](const std::string& k) {
        if (hooks.before_put) hooks.before_put(k);
      };
      w->before_part = [this](const std::string& k, int n) {
        if (hooks.before_part) hooks.before_part(k, n);
      };
      w->before_get_range = [this](const std::string& k) {
        if (hooks.before_get_range) hooks.before_get_range(k);
      };
      w->plain_puts = hooks.plain_puts;
      return w;
    });
  }
  ~Wrapped() { ckpt::internal::SetObjectStoreWrapperForTest(nullptr); }
};

// The gateway, a bucket of the test's own, and options that reach them
// (s3_test::StoreFixture); save options over them, and whether the staging is empty.
struct Fixture : s3_test::StoreFixture {
  Fixture() : StoreFixture("s3save") {}
  ckpt::SaveOptions Save(bool overwrite = false) const {
    ckpt::SaveOptions o;
    o.overwrite = overwrite;
    o.s3 = options;
    return o;
  }
  // Nothing is left in the local staging (each rank's shard goes once uploaded).
  bool StagingEmpty() const {
    std::error_code ec;
    return !std::filesystem::exists(options.staging_dir) || std::filesystem::is_empty(options.staging_dir, ec);
  }
};

constexpr int64_t kRows = 64, kCols = 1024;  // 256 KiB of float32: 64 KiB a rank of 4

std::vector<float> Values(uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(kRows * kCols));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 2654435761u + seed * 977) % 100003) / 7.0f;
  return v;
}

// Rank `rank` of `world` holds its rows of "w" (and rank 0 the step).
ckpt::StateDict RankState(std::vector<float>& all, int rank, int world, int64_t step) {
  ckpt::StateDict s;
  const int64_t rows = kRows / world;
  s.Add("w", ckpt::Tensor::Slice(ckpt::DType::kFloat32, {kRows, kCols}, 0, rows * rank, rows,
                                 all.data() + rows * rank * kCols));
  s.Add("step", ckpt::Scalar::Int(step));
  return s;
}

// The checkpoint at `url`, downloaded and loaded: "w" and the step.
std::pair<std::vector<float>, int64_t> ReadBack(Fixture& f, const std::string& url) {
  ckpt_test::TempDir local("s3dl");
  ckpt::files::DownloadObjectCheckpoint(url, f.options, local / "ckpt", 64 << 20);
  std::vector<float> w(static_cast<std::size_t>(kRows * kCols), -1.0f);
  ckpt::StateDict target;
  target.Add("w", ckpt::Tensor::Full(ckpt::DType::kFloat32, {kRows, kCols}, w.data()));
  target.Add("step", ckpt::Scalar::Int(0));
  ckpt::SingleComm comm;
  ckpt::Load(local / "ckpt", target, comm);
  return {w, std::get<ckpt::Scalar>(target.At("step")).AsInt()};
}

void SaveRanks(Fixture& f, const std::string& url, int world, std::vector<float>& all, int64_t step,
               bool overwrite = false) {
  ckpt::RunThreads(world, [&](ckpt::Comm& c) {
    ckpt::StateDict s = RankState(all, c.rank(), world, step);
    ckpt::Save(url, s, c, f.Save(overwrite));
  });
}

// Each rank's error code after a save of `world` ranks (kInternal: it succeeded).
std::vector<ErrorCode> SaveCodes(const std::string& url, int world, std::vector<float>& all, int64_t step,
                                 const ckpt::SaveOptions& options, std::vector<std::string>* messages = nullptr) {
  std::vector<ErrorCode> codes(static_cast<std::size_t>(world), ErrorCode::kInternal);
  if (messages) messages->assign(static_cast<std::size_t>(world), "");
  ckpt::RunThreads(world, [&](ckpt::Comm& c) {
    ckpt::StateDict s = RankState(all, c.rank(), world, step);
    try {
      ckpt::Save(url, s, c, options);
    } catch (const ckpt::Error& e) {
      codes[static_cast<std::size_t>(c.rank())] = e.code();
      if (messages) (*messages)[static_cast<std::size_t>(c.rank())] = e.what();
    }
  });
  return codes;
}

int CountShards(const std::vector<std::string>& keys) {
  int n = 0;
  for (const std::string& k : keys) n += k.find("/shard-") != std::string::npos;
  return n;
}

}  // namespace

TEST_CASE("s3 save: 1 rank and 4 ranks, shards under names unique to the save, read back equal") {
  Fixture f;
  for (int world : {1, 4}) {
    CAPTURE(world);
    std::vector<float> all = Values(static_cast<uint64_t>(world));
    const std::string name = "run/w" + std::to_string(world);
    SaveRanks(f, f.Url(name), world, all, 10 * world);
    const std::vector<std::string> keys = f.Keys(name + "/");
    REQUIRE(keys.size() == static_cast<std::size_t>(world) + 1);
    CHECK(keys.front() == name + "/metadata.json");  // keys in binary order
    for (int r = 0; r < world; ++r) {
      // shard-0000r-of-0000w.<16 hex>.h5
      const std::string& k = keys[static_cast<std::size_t>(r) + 1];
      CHECK(k.rfind(name + "/shard-0000" + std::to_string(r) + "-of-0000" + std::to_string(world) + ".", 0) == 0);
      CHECK(k.size() == name.size() + 1 + 40);
    }
    const auto [w, step] = ReadBack(f, f.Url(name));
    CHECK(step == 10 * world);
    CHECK(std::memcmp(w.data(), all.data(), all.size() * sizeof(float)) == 0);
    CHECK(f.StagingEmpty());
    CHECK(f.store.ListMultipartUploads(f.bucket.name(), "").empty());
    // The local staging copies are transient: never fsynced (the save's fsync phase is 0).
    const std::vector<std::byte> text = f.store.Get(f.bucket.name(), name + "/metadata.json", 1 << 20);
    const ckpt::Metadata md = ckpt::ParseMetadata({reinterpret_cast<const char*>(text.data()), text.size()});
    REQUIRE(md.save_timings.has_value());
    CHECK(md.save_timings->fsync.max == 0.0);
  }
}

TEST_CASE("s3 save: a shard larger than a part goes up in parts, checked, and reads back equal") {
  Fixture f;
  // 6 MiB of one rank: two parts of 5 MiB.
  std::vector<float> big((6u << 20) / sizeof(float));
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 65521);
  ckpt::StateDict s;
  s.Add("big", ckpt::Tensor::Full(ckpt::DType::kFloat32, {static_cast<int64_t>(big.size())}, big.data()));
  ckpt::SingleComm comm;
  std::atomic<int> parts{0};
  {
    Wrapped wrap;
    wrap.hooks.before_part = [&](const std::string&, int) { ++parts; };
    ckpt::Save(f.Url("big"), s, comm, f.Save());
  }
  CHECK(parts.load() == 2);
  ckpt_test::TempDir local("s3dl");
  ckpt::files::DownloadObjectCheckpoint(f.Url("big"), f.options, local / "c", 64 << 20);
  std::vector<float> back(big.size());
  ckpt::StateDict t;
  t.Add("big", ckpt::Tensor::Full(ckpt::DType::kFloat32, {static_cast<int64_t>(big.size())}, back.data()));
  ckpt::Load(local / "c", t, comm);
  CHECK(back == big);
  // The download refuses more than its bound before fetching anything.
  CHECK(s3_test::ErrorOf([&] {
          ckpt::files::DownloadObjectCheckpoint(f.Url("big"), f.options, local / "d", 1 << 20);
        }).find("more than the 1048576 allowed") != std::string::npos);
}

TEST_CASE("s3 save: the shard's parts go up while it is written, part 1 (HDF5's superblock) last; verified") {
  Fixture f;
  // 26 MiB of one rank: six parts of 5 MiB. Those made only of the tensor's bytes are final
  // once written and go while the rest is written; part 1 holds the superblock, which HDF5
  // writes again at the close, so it goes with the last one at the end.
  std::vector<float> big((26u << 20) / sizeof(float));
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 65521) * 0.5f;
  ckpt::StateDict s;
  s.Add("big", ckpt::Tensor::Full(ckpt::DType::kFloat32, {static_cast<int64_t>(big.size())}, big.data()));
  ckpt::SingleComm comm;
  // One part in flight at a time, so that the order is the one they were sent in: without
  // streaming 1, 2, ..., 6 once the shard is complete.
  f.options.upload_concurrency = 1;
  std::vector<int> order;
  std::mutex mu;
  {
    Wrapped wrap;
    wrap.hooks.before_part = [&](const std::string&, int n) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(n);
    };
    ckpt::Save(f.Url("stream"), s, comm, f.Save());
  }
  CHECK(order == std::vector<int>{2, 3, 4, 5, 1, 6});
  CHECK(f.StagingEmpty());
  // The object is the shard HDF5 closed: every check of ckpt-verify passes on a download.
  ckpt_test::TempDir local("s3stream");
  ckpt::files::DownloadObjectCheckpoint(f.Url("stream"), f.options, local / "c", 64 << 20);
  const ckpt::VerifyReport report = ckpt::VerifyCheckpoint(local / "c", {});
  for (const auto& p : report.problems) INFO(p.check << ": " << p.message);
  CHECK(report.ok());
  std::vector<float> back(big.size());
  ckpt::StateDict t;
  t.Add("big", ckpt::Tensor::Full(ckpt::DType::kFloat32, {static_cast<int64_t>(big.size())}, back.data()));
  ckpt::LoadOptions lo;
  lo.s3 = f.options;
  ckpt::Load(f.Url("stream"), t, comm, lo);
  CHECK(back == big);
}

TEST_CASE("s3 save: an existing checkpoint is refused without overwrite, replaced with it") {
  Fixture f;
  std::vector<float> a = Values(1), b = Values(2);
  SaveRanks(f, f.Url("ck"), 2, a, 1);
  std::vector<std::string> messages;
  const auto codes = SaveCodes(f.Url("ck"), 2, b, 2, f.Save(false), &messages);
  CHECK(codes == std::vector<ErrorCode>{ErrorCode::kAlreadyExists, ErrorCode::kAlreadyExists});
  CHECK(messages[1].find("pass overwrite") != std::string::npos);
  CHECK(ReadBack(f, f.Url("ck")).second == 1);
  const auto before = f.Keys("ck/");
  SaveRanks(f, f.Url("ck"), 2, b, 2, /*overwrite=*/true);
  const auto [w, step] = ReadBack(f, f.Url("ck"));
  CHECK(step == 2);
  CHECK(w == b);
  // The replaced checkpoint's objects stay for its readers until the grace period is over.
  CHECK(CountShards(f.Keys("ck/")) == 4);
  CHECK(ckpt::files::CleanObjectLeftovers(f.Url("ck"), f.options) == 0);
  ckpt::ObjectStoreOptions now = f.options;
  now.leftover_grace_seconds = 0;
  CHECK(ckpt::files::CleanObjectLeftovers(f.Url("ck"), now) == 2);
  CHECK(CountShards(f.Keys("ck/")) == 2);
  CHECK(ReadBack(f, f.Url("ck")).first == b);
  (void)before;
}

TEST_CASE("s3 SaveAsync: the caller is blocked only for the snapshot; the upload runs behind") {
  Fixture f;
  std::vector<float> all = Values(3);
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> held{0};
  Wrapped wrap;
  wrap.hooks.before_put = [&](const std::string& key) {
    if (key.find("/shard-") == std::string::npos) return;
    ++held;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
  };
  ckpt::SingleComm comm;
  ckpt::StateDict s = RankState(all, 0, 1, 7);
  ckpt::AsyncSaveOptions o;
  static_cast<ckpt::SaveOptions&>(o) = f.Save();
  ckpt::SaveHandle h = ckpt::SaveAsync(f.Url("async"), s, comm, o);
  // SaveAsync returned while the shard's upload is held: the upload is in the background.
  for (int i = 0; i < 500 && held.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(held.load() == 1);
  CHECK_FALSE(h.Done());
  std::fill(all.begin(), all.end(), 0.0f);  // the caller trains on; the snapshot was taken
  CHECK_FALSE(f.store.Head(f.bucket.name(), "async/metadata.json").has_value());
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  h.Wait();
  const auto [w, step] = ReadBack(f, f.Url("async"));
  CHECK(step == 7);
  CHECK(w == Values(3));
}

TEST_CASE("s3 CheckpointWriter: files staged, uploaded at Commit, committed by a conditional PUT") {
  Fixture f;
  std::vector<float> all = Values(4);
  ckpt::CheckpointWriter::Options o;
  o.num_files = 2;
  o.s3 = f.options;
  {
    auto w = ckpt::CheckpointWriter::Create(f.Url("writer"), o);
    for (int file = 0; file < 2; ++file) {
      const int64_t rows = kRows / 2;
      w->WriteChunk("w", ckpt::DType::kFloat32, {kRows, kCols}, ckpt::Box{{rows * file, 0}, {rows, kCols}},
                    all.data() + rows * file * kCols, file);
    }
    w->WriteScalar("step", ckpt::Scalar::Int(5));
    CHECK(f.Keys("writer/").empty());  // nothing before Commit
    w->Commit();
  }
  CHECK(CountShards(f.Keys("writer/")) == 2);
  const auto [w, step] = ReadBack(f, f.Url("writer"));
  CHECK(step == 5);
  CHECK(w == all);
  // A second writer to the committed path is refused at Create; with overwrite it replaces.
  CHECK(s3_test::ErrorOf([&] { ckpt::CheckpointWriter::Create(f.Url("writer"), o); }).find("already there") !=
        std::string::npos);
  o.overwrite = true;
  auto w2 = ckpt::CheckpointWriter::Create(f.Url("writer"), o);
  w2->WriteScalar("step", ckpt::Scalar::Int(6));
  std::vector<float> zeros(all.size(), 0.0f);
  w2->WriteChunk("w", ckpt::DType::kFloat32, {kRows, kCols}, ckpt::Box{{0, 0}, {kRows, kCols}}, zeros.data(), 1);
  w2->Commit();
  CHECK(ReadBack(f, f.Url("writer")) == std::make_pair(zeros, int64_t{6}));
}

// Two saves of 2 ranks each race; both pass their start (the hook holds each commit PUT
// until both have reached it), so only the conditional PUT can tell them apart.
void Race(Fixture& f, const std::string& name, bool overwrite, int rounds) {
  Wrapped wrap;
  for (int round = 0; round < rounds; ++round) {
    CAPTURE(round);
    std::barrier both(2);
    wrap.hooks.before_put = [&](const std::string& key) {
      if (key.size() >= 13 && key.compare(key.size() - 13, 13, "metadata.json") == 0) both.arrive_and_wait();
    };
    std::vector<float> data[2] = {Values(100 + static_cast<uint64_t>(round) * 2),
                                  Values(101 + static_cast<uint64_t>(round) * 2)};
    std::vector<ErrorCode> codes[2];
    std::thread writers[2];
    for (int i = 0; i < 2; ++i) {
      writers[i] = std::thread([&, i] { codes[i] = SaveCodes(f.Url(name), 2, data[i], round * 2 + i, f.Save(overwrite)); });
    }
    for (auto& t : writers) t.join();
    const bool won0 = codes[0][0] == ErrorCode::kInternal;
    const bool won1 = codes[1][0] == ErrorCode::kInternal;
    REQUIRE(won0 != won1);
    const int loser = won0 ? 1 : 0;
    // Every rank of the loser was told, none hung.
    CHECK(codes[loser] == std::vector<ErrorCode>{ErrorCode::kAlreadyExists, ErrorCode::kAlreadyExists});
    CHECK(codes[1 - loser] == std::vector<ErrorCode>{ErrorCode::kInternal, ErrorCode::kInternal});
    const auto [w, step] = ReadBack(f, f.Url(name));
    CHECK(step == round * 2 + (1 - loser));
    CHECK(w == data[1 - loser]);
    if (!overwrite) {
      // Nothing of the loser is left: only the winner's two shards and its metadata.json.
      CHECK(CountShards(f.Keys(name + "/")) == 2);
      ckpt::files::RemoveObjectCheckpoint(f.Url(name), f.options);
      CHECK(f.Keys(name + "/").empty());
    }
    wrap.hooks.before_put = nullptr;
  }
}

TEST_CASE("s3 save: two writers racing on one new path, exactly one wins in each of 20 rounds") {
  Fixture f;
  Race(f, "race", /*overwrite=*/false, 20);
}

TEST_CASE("s3 save: replace racing replace, exactly one wins in each of 20 rounds") {
  Fixture f;
  std::vector<float> base = Values(9);
  SaveRanks(f, f.Url("rep"), 2, base, 1000);
  Race(f, "rep", /*overwrite=*/true, 20);
}

TEST_CASE("s3 save: a failed upload leaves the old checkpoint intact and nothing of the new one") {
  Fixture f;
  std::vector<float> a = Values(5), b = Values(6);
  SaveRanks(f, f.Url("fault"), 4, a, 1);
  const auto before = f.Keys("fault/");
  {
    Wrapped wrap;
    // Rank 2's shard upload fails: a server that answers 500 until the client gives up.
    wrap.hooks.before_put = [&](const std::string& key) {
      if (key.find("shard-00002-of-00004") != std::string::npos)
        throw ckpt::Error(ErrorCode::kIO, "s3://" + f.bucket.name() + "/" + key + ": PUT: HTTP 500 after 8 attempts");
    };
    std::vector<std::string> messages;
    const auto codes = SaveCodes(f.Url("fault"), 4, b, 2, f.Save(true), &messages);
    for (int r = 0; r < 4; ++r) {
      CAPTURE(r);
      CHECK(codes[static_cast<std::size_t>(r)] == ErrorCode::kIO);
      CHECK(messages[static_cast<std::size_t>(r)].find("HTTP 500") != std::string::npos);
    }
  }
  CHECK(f.Keys("fault/") == before);  // the others' uploads were deleted
  const auto [w, step] = ReadBack(f, f.Url("fault"));
  CHECK(step == 1);
  CHECK(w == a);
  CHECK(f.StagingEmpty());
  CHECK(f.store.ListMultipartUploads(f.bucket.name(), "").empty());
}

TEST_CASE("s3 save: a store that does not honour conditional PUT is refused unless single_writer") {
  Fixture f;
  std::vector<float> a = Values(7);
  Wrapped wrap;
  wrap.hooks.plain_puts = true;
  std::vector<std::string> messages;
  const auto codes = SaveCodes(f.Url("nocas"), 2, a, 1, f.Save(), &messages);
  CHECK(codes == std::vector<ErrorCode>{ErrorCode::kInvalidArgument, ErrorCode::kInvalidArgument});
  CHECK(messages[0].find("does not honour conditional PUT") != std::string::npos);
  CHECK(f.Keys("nocas/").empty());
  ckpt::SaveOptions o = f.Save();
  o.s3.single_writer = true;
  CHECK(SaveCodes(f.Url("nocas"), 2, a, 1, o) == std::vector<ErrorCode>{ErrorCode::kInternal, ErrorCode::kInternal});
  CHECK(ReadBack(f, f.Url("nocas")).first == a);
}

TEST_CASE("s3 leftovers: removed after the grace period, never before; the next save runs it") {
  Fixture f;
  std::vector<float> a = Values(8);
  SaveRanks(f, f.Url("lo/step-1"), 2, a, 1);
  // A killed writer's shard object and its unfinished multipart upload, a stranger's object.
  const std::string dead = "lo/step-1/shard-00001-of-00002.0123456789abcdef.h5";
  f.store.Put(f.bucket.name(), dead, st::s3::AsBytes(std::string("partial")));
  const std::string upload_key = "lo/step-2/shard-00000-of-00001.fedcba9876543210.h5";
  f.store.CreateMultipart(f.bucket.name(), upload_key);
  f.store.Put(f.bucket.name(), "lo/step-1/notes.txt", st::s3::AsBytes(std::string("mine")));
  const auto committed = f.Keys("lo/step-1/");
  // Younger than the grace period (default 1 hour): kept.
  CHECK(ckpt::files::CleanObjectLeftovers(f.Url("lo"), f.options) == 0);
  CHECK(f.Keys("lo/step-1/").size() == committed.size());
  CHECK(f.store.ListMultipartUploads(f.bucket.name(), "lo/").size() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  ckpt::ObjectStoreOptions past = f.options;
  past.leftover_grace_seconds = 1;
  CHECK(ckpt::files::CleanObjectLeftovers(f.Url("lo"), past) == 2);
  std::vector<std::string> expected = committed;
  expected.erase(std::find(expected.begin(), expected.end(), dead));
  CHECK(f.Keys("lo/step-1/") == expected);  // the committed checkpoint and notes.txt stay
  CHECK(f.store.ListMultipartUploads(f.bucket.name(), "lo/").empty());
  CHECK(ReadBack(f, f.Url("lo/step-1")).first == a);
  // The next save to a prefix cleans it first.
  f.store.Put(f.bucket.name(), dead, st::s3::AsBytes(std::string("partial")));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ckpt::SaveOptions o = f.Save(true);
  o.s3.leftover_grace_seconds = 1;
  SaveRanks(f, f.Url("lo/step-1"), 1, a, 2, true);  // default grace: the dead object stays
  const auto kept = f.Keys("lo/step-1/");
  CHECK(std::count(kept.begin(), kept.end(), dead) == 1);
  CHECK(SaveCodes(f.Url("lo/step-1"), 1, a, 3, o) == std::vector<ErrorCode>{ErrorCode::kInternal});
  const auto after = f.Keys("lo/step-1/");
  CHECK(std::find(after.begin(), after.end(), dead) == after.end());
}

// A checkpoint ranged GETs read (uncompressed) and one Load downloads (compressed chunks).
TEST_CASE("s3 Load: saved by 4 ranks, loaded by 2, equal, by ranges or by a bounded download; cleaned up") {
  Fixture f;
  std::vector<float> all = Values(11);
  SaveRanks(f, f.Url("load"), 4, all, 42);
  ckpt::LoadOptions lo;
  lo.s3 = f.options;
  std::vector<float> back(all.size(), -1.0f);
  const auto load = [&](const std::string& url, std::vector<std::string>* errors) {
    ckpt::RunThreads(2, [&](ckpt::Comm& c) {
      const int64_t rows = kRows / 2;
      ckpt::StateDict t;
      t.Add("w", ckpt::Tensor::Slice(ckpt::DType::kFloat32, {kRows, kCols}, 0, rows * c.rank(), rows,
                                     back.data() + rows * c.rank() * kCols));
      t.Add("step", ckpt::Scalar::Int(0));
      try {
        ckpt::Load(url, t, c, lo);
        CHECK(std::get<ckpt::Scalar>(t.At("step")).AsInt() == 42);
      } catch (const ckpt::Error& e) {
        if (!errors) throw;
        (*errors)[static_cast<std::size_t>(c.rank())] = e.what();
      }
    });
  };
  load(f.Url("load"), nullptr);
  CHECK(back == all);
  CHECK(f.StagingEmpty());
  ckpt::SaveOptions zstd = f.Save(false);
  zstd.compression.codec = ckpt::Compression::Codec::kZstd;
  for (ErrorCode code : SaveCodes(f.Url("loadz"), 4, all, 42, zstd)) CHECK(code == ErrorCode::kInternal);
  back.assign(all.size(), -1.0f);
  load(f.Url("loadz"), nullptr);
  CHECK(back == all);
  CHECK(f.StagingEmpty());
  std::vector<std::string> errors(2);
  lo.s3.cache_max_bytes = 1000;
  load(f.Url("loadz"), &errors);
  for (const std::string& e : errors) CHECK(e.find("more than the 1000 allowed") != std::string::npos);
  CHECK(f.StagingEmpty());
  lo.s3.cache_max_bytes = 64 << 20;
  errors.assign(2, "");
  load(f.Url("absent"), &errors);
  for (const std::string& e : errors) {
    CHECK_MESSAGE(e.find("absent: not a checkpoint (no metadata.json") != std::string::npos, e);
  }
  CHECK(f.StagingEmpty());
}

TEST_CASE("s3 save: bad options and URLs are clear errors; no secret in any message") {
  Fixture f;
  std::vector<float> a = Values(1);
  ckpt::SaveOptions o = f.Save();
  o.s3.addressing = "sideways";
  std::vector<std::string> m;
  SaveCodes(f.Url("bad"), 1, a, 1, o, &m);
  CHECK(m[0].find("'sideways' is none of auto, path, virtual") != std::string::npos);
  o = f.Save();
  o.s3.leftover_grace_seconds = -1;
  SaveCodes(f.Url("bad"), 1, a, 1, o, &m);
  CHECK(m[0].find("leftover_grace_seconds must be >= 0") != std::string::npos);
  o = f.Save();
  o.s3.part_bytes = 1 << 20;
  SaveCodes(f.Url("bad"), 1, a, 1, o, &m);
  CHECK(m[0].find("part_bytes must be 5 MiB..5 GiB") != std::string::npos);
  o = f.Save();
  SaveCodes("s3://" + f.bucket.name(), 1, a, 1, o, &m);
  CHECK(m[0].find("needs a prefix") != std::string::npos);
  o.s3.secret_access_key = "WRONG-SECRET-abcdefghijklmnop";
  const auto codes = SaveCodes(f.Url("bad"), 1, a, 1, o, &m);
  CHECK(codes[0] != ErrorCode::kInternal);
  CHECK(m[0].find("403") != std::string::npos);
  CHECK(m[0].find("WRONG-SECRET") == std::string::npos);
  CHECK(m[0].find(f.options.secret_access_key) == std::string::npos);
}

TEST_CASE("s3 save and load: no credentials anywhere is an error naming the URL it was for") {
  // No AWS_* keys, no profile files: the process's environment, restored after.
  ckpt_test::TempDir home("s3-nocreds");
  const char* vars[] = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                        "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "HOME"};
  std::vector<std::pair<std::string, std::optional<std::string>>> saved;
  for (const char* v : vars) {
    const char* old = std::getenv(v);
    saved.emplace_back(v, old ? std::optional<std::string>(old) : std::nullopt);
    ::unsetenv(v);
  }
  ::setenv("HOME", home.path().c_str(), 1);
  ckpt::ObjectStoreOptions o;
  o.endpoint = "http://127.0.0.1:9";  // never reached
  o.staging_dir = home / "staging";
  const std::string url = "s3://no-creds-bucket/run/step-7";
  std::vector<std::string> messages;
  std::vector<float> all = Values(1);
  ckpt::SaveOptions so;
  so.s3 = o;
  const std::vector<ErrorCode> codes = SaveCodes(url, 1, all, 7, so, &messages);
  ckpt::ErrorCode load_code{};
  const std::string load_error = s3_test::ErrorOf(
      [&] {
        ckpt::StateDict target;
        ckpt::SingleComm comm;
        ckpt::LoadOptions lo;
        lo.s3 = o;
        ckpt::Load(url, target, comm, lo);
      },
      &load_code);
  for (auto& [name, value] : saved) {
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
  CHECK(codes[0] == ErrorCode::kNotFound);
  CHECK_MESSAGE(messages[0].find(url + ": no S3 credentials") != std::string::npos, messages[0]);
  CHECK(load_code == ErrorCode::kNotFound);
  CHECK_MESSAGE(load_error.find(url + ": no S3 credentials") != std::string::npos, load_error);
}

TEST_CASE("s3 Load: a killed load's download cache is collected like a save's staging; a live one never") {
  Fixture f;
  std::vector<float> all = Values(12);
  ckpt::SaveOptions zstd = f.Save(false);
  zstd.compression.codec = ckpt::Compression::Codec::kZstd;  // Load downloads it
  for (ErrorCode code : SaveCodes(f.Url("cz"), 1, all, 5, zstd)) CHECK(code == ErrorCode::kInternal);
  const std::filesystem::path root = f.options.staging_dir;
  // What a load killed during its download left: its directory, nobody holding its lock.
  const auto killed_load = [&] {
    const std::filesystem::path dead = root / "load-0123456789abcdef-r0";
    std::filesystem::create_directories(dead);
    std::ofstream(dead / "metadata.json") << "{}";
    std::filesystem::last_write_time(dead, std::filesystem::file_time_type::clock::now() - std::chrono::hours(2));
    return dead;
  };
  std::filesystem::path dead = killed_load();
  ckpt::files::CleanObjectLeftovers(f.Url("cz"), f.options);  // older than the 1 h grace
  CHECK_FALSE(std::filesystem::exists(dead));
  dead = killed_load();
  SaveRanks(f, f.Url("cz2"), 1, all, 6);  // the next save
  CHECK_FALSE(std::filesystem::exists(dead));

  // A live load's cache: a cleaner with no grace at all, run while it downloads, leaves it.
  Wrapped w;
  int cleaned_during_download = 0;
  w.hooks.before_get_range = [&](const std::string& key) {
    if (key.find("/shard-") == std::string::npos || cleaned_during_download++) return;
    bool cache_seen = false;
    for (const auto& e : std::filesystem::directory_iterator(root)) {
      cache_seen |= e.path().filename().string().rfind("load-", 0) == 0;
    }
    CHECK(cache_seen);
    ckpt::ObjectStoreOptions now = f.options;
    now.leftover_grace_seconds = 0;
    ckpt::files::CleanObjectLeftovers(f.Url("cz"), now);
  };
  std::vector<float> back(all.size(), -1.0f);
  ckpt::StateDict t;
  t.Add("w", ckpt::Tensor::Full(ckpt::DType::kFloat32, {kRows, kCols}, back.data()));
  t.Add("step", ckpt::Scalar::Int(0));
  ckpt::SingleComm comm;
  ckpt::LoadOptions lo;
  lo.s3 = f.options;
  CHECK_NOTHROW(ckpt::Load(f.Url("cz"), t, comm, lo));
  CHECK(cleaned_during_download == 1);
  CHECK(back == all);
  CHECK(f.StagingEmpty());
}
