// Save, SaveAsync and Load of s3:// checkpoints across real processes (mpiexec -n 4), on the
// project's own Ceph gateway (scripts/s3-gateway.sh; CKPT_TEST_S3_* name it): each process
// stages and uploads its own shard, rank 0 commits by exactly one PUT of metadata.json once
// every shard is complete on the store; 4 processes save, 4 and 3 load (resharded); one
// process's failed upload fails the save on every process and leaves nothing visible.
// Without a gateway every process exits 77 (CTest: SKIPPED), or fails where CI=true.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/object_save.h"
#include "ckpt/ckpt.h"
#include "ckpt/mpi.h"
#include "s3/forwarding_store.h"
#include "s3/s3_gateway.h"

using namespace ckpt;
namespace st = ckpt::storage;

namespace {

constexpr int64_t kRows = 301, kCols = 1024;  // float32: 1.2 MiB, uneven row blocks
float Value(int64_t r, int64_t c) { return static_cast<float>(r * 4096 + c); }

std::pair<int64_t, int64_t> Rows(int rank, int size) {
  const int64_t base = kRows / size, extra = kRows % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, base + (rank < extra ? 1 : 0)};
}

std::string g_bucket;  // made by rank 0, its name broadcast

// What this process's saves did on the store: the PUTs of metadata.json, and at each one
// whether every file it names was complete there (HEAD: present, of its recorded size).
// `fail` makes this process's shard upload fail.
struct Watch {
  std::mutex mu;
  int metadata_puts = 0;
  int complete_at_commit = -1;  // files found complete when metadata.json was PUT
  int named_at_commit = -1;
  std::atomic<bool> fail{false};
};
Watch g_watch;

class WatchingStore : public s3_test::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::string Put(const std::string& b, const std::string& k, st::ByteSpan body) override {
    Before(b, k, body);
    return ForwardingStore::Put(b, k, body);
  }
  std::optional<std::string> PutIfAbsent(const std::string& b, const std::string& k, st::ByteSpan body) override {
    Before(b, k, body);
    return ForwardingStore::PutIfAbsent(b, k, body);
  }
  std::optional<std::string> PutIfMatch(const std::string& b, const std::string& k, st::ByteSpan body,
                                        const std::string& etag) override {
    Before(b, k, body);
    return ForwardingStore::PutIfMatch(b, k, body, etag);
  }
  std::string CreateMultipart(const std::string& b, const std::string& k) override {
    Before(b, k, {});
    return ForwardingStore::CreateMultipart(b, k);
  }

 private:
  void Before(const std::string& b, const std::string& k, st::ByteSpan body) {
    if (k.find("/shard-") != std::string::npos && g_watch.fail) {
      throw Error(ErrorCode::kIO, "s3://" + b + "/" + k + ": injected upload failure (HTTP 500)");
    }
    const std::string suffix = "/metadata.json";
    if (k.size() < suffix.size() || k.compare(k.size() - suffix.size(), suffix.size(), suffix) != 0) return;
    const Metadata m = ParseMetadata({reinterpret_cast<const char*>(body.data()), body.size()}, k);
    const std::string dir = k.substr(0, k.size() - suffix.size() + 1);
    int complete = 0;
    for (const FileMeta& f : m.files) {
      const auto info = inner().Head(b, dir + f.name);
      if (info && info->size == f.bytes) ++complete;
    }
    std::lock_guard lock(g_watch.mu);
    ++g_watch.metadata_puts;
    g_watch.complete_at_commit = complete;
    g_watch.named_at_commit = static_cast<int>(m.files.size());
  }
};

ObjectStoreOptions Options() { return s3_test::GatewayOptions(s3_test::GatewayConfig()); }

std::string Url(const std::string& name) { return "s3://" + g_bucket + "/mpi/" + name; }

StateDict RowShards(int rank, int size, std::vector<float>& rows) {
  const auto [begin, count] = Rows(rank, size);
  rows.resize(static_cast<std::size_t>(count * kCols));
  for (int64_t r = 0; r < count; ++r)
    for (int64_t c = 0; c < kCols; ++c) rows[r * kCols + c] = Value(begin + r, c);
  StateDict sd;
  sd.Add("model.w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 0, begin, count, rows.data()));
  sd.Add("rng.rank" + std::to_string(rank), Bytes{std::vector<uint8_t>(16, static_cast<uint8_t>(rank))});
  sd.Add("step", Scalar::Int(42));
  return sd;
}

// Every process's count of metadata.json PUTs since the last call, summed; rank 0's view of
// the commit (files named, files complete then) broadcast.
struct Commits {
  int puts = 0, named = -1, complete = -1;
};
Commits TakeCommits(Comm& comm) {
  int32_t v[3];
  {
    std::lock_guard lock(g_watch.mu);
    v[0] = g_watch.metadata_puts;
    v[1] = g_watch.named_at_commit;
    v[2] = g_watch.complete_at_commit;
    g_watch.metadata_puts = 0;
    g_watch.named_at_commit = g_watch.complete_at_commit = -1;
  }
  int32_t puts = v[0];
  comm.AllReduce(&puts, 1, DType::kInt32, ReduceOp::kSum);
  ByteBuffer b(sizeof v);
  std::memcpy(b.data(), v, sizeof v);
  comm.Broadcast(b, 0);
  std::memcpy(v, b.data(), sizeof v);
  return {puts, v[1], v[2]};
}

// Whether `prefix` ("mpi/x/") holds any object, as rank 0 lists it, on every process.
bool AnyObject(Comm& comm, const std::string& prefix) {
  int32_t n = 0;
  if (comm.rank() == 0) {
    st::S3Store store(s3_test::GatewayConfig());
    n = static_cast<int32_t>(st::ListAll(store, g_bucket, prefix).size());
  }
  comm.AllReduce(&n, 1, DType::kInt32, ReduceOp::kMax);
  return n > 0;
}

// model.w loaded by `comm`'s processes, each its own row block, compared.
void LoadRowsAndCheck(const std::string& url, Comm& comm) {
  const auto [begin, count] = Rows(comm.rank(), comm.size());
  std::vector<float> got(static_cast<std::size_t>(count * kCols), -1.0f);
  StateDict t;
  t.Add("model.w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 0, begin, count, got.data()));
  LoadOptions lo;
  lo.strict = false;
  lo.s3 = Options();
  Load(url, t, comm, lo);
  bool same = true;
  for (int64_t r = 0; r < count && same; ++r)
    for (int64_t c = 0; c < kCols && same; ++c) same = got[r * kCols + c] == Value(begin + r, c);
  CHECK(same);
}

// Resharded: all but the last process load row blocks of their own count.
void LoadRowsOnAllButLast(const std::string& url, Comm& comm) {
  const bool last = comm.rank() == comm.size() - 1;
  auto sub = comm.Split(last ? 1 : 0, comm.rank());
  if (!last) LoadRowsAndCheck(url, *sub);
}

// Since the last TakeCommits: exactly one PUT of metadata.json, made once every process's
// shard was complete on the store.
void CheckOneCommitOfCompleteShards(Comm& comm) {
  const Commits c = TakeCommits(comm);
  CHECK(c.puts == 1);
  CHECK(c.complete == comm.size());
}

// This process in a test case: the world, and its row block of model.w (with its rng entry
// and the step) to save, with options that reach the gateway.
struct Process {
  std::unique_ptr<Comm> comm = MpiWorld();
  int rank = comm->rank(), size = comm->size();
  std::vector<float> rows;
  StateDict sd = RowShards(rank, size, rows);
  SaveOptions so = [] {
    SaveOptions o;
    o.s3 = Options();
    return o;
  }();
};

}  // namespace

TEST_CASE("4 processes save to s3://: one PUT of metadata.json after every shard is complete; 4 load columns, 3 load rows") {
  Process p;
  auto& [comm, rank, size, rows, sd, so] = p;
  Save(Url("ck"), sd, *comm, so);
  const Commits c = TakeCommits(*comm);
  CHECK(c.puts == 1);
  CHECK(c.named == size);
  CHECK(c.complete == size);  // every shard on the store, whole, before the commit

  const Metadata md = CheckpointReader::Open(Url("ck"), Options())->metadata();
  CHECK(md.world_size == size);
  CHECK(md.files.size() == static_cast<std::size_t>(size));

  // Every process loads a column block (each reads from every shard) and every rng entry.
  const int64_t cbegin = kCols * rank / size, cend = kCols * (rank + 1) / size;
  std::vector<float> cols(static_cast<std::size_t>(kRows * (cend - cbegin)));
  StateDict target;
  target.Add("model.w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 1, cbegin, cend - cbegin, cols.data()));
  for (int r = 0; r < size; ++r) target.Add("rng.rank" + std::to_string(r), Bytes{});
  target.Add("step", Scalar{});
  LoadOptions lo;
  lo.s3 = so.s3;
  Load(Url("ck"), target, *comm, lo);
  bool same = true;
  for (int64_t r = 0; r < kRows && same; ++r)
    for (int64_t c2 = cbegin; c2 < cend && same; ++c2) same = cols[r * (cend - cbegin) + (c2 - cbegin)] == Value(r, c2);
  CHECK(same);
  CHECK(std::get<Bytes>(target.At("rng.rank" + std::to_string(size - 1))).data ==
        std::vector<uint8_t>(16, static_cast<uint8_t>(size - 1)));
  CHECK(std::get<Scalar>(target.At("step")).AsInt() == 42);

  LoadRowsOnAllButLast(Url("ck"), *comm);

  // An overwrite: If-Match on what rank 0 saw; still one PUT, the new values loaded.
  so.overwrite = true;
  std::vector<float> rows2;
  StateDict sd2 = RowShards(rank, size, rows2);
  Save(Url("ck"), sd2, *comm, so);
  CheckOneCommitOfCompleteShards(*comm);
  LoadRowsAndCheck(Url("ck"), *comm);
  comm->Barrier();
}

TEST_CASE("SaveAsync from 4 processes to s3://: the upload in the background, one commit, loaded back by 3") {
  Process p;
  auto& [comm, rank, size, rows, sd, so] = p;
  AsyncSaveOptions ao;
  ao.s3 = so.s3;
  SaveHandle h = SaveAsync(Url("async"), sd, *comm, ao);
  std::fill(rows.begin(), rows.end(), -1.0f);  // the snapshot was taken: not saved
  comm->Barrier();
  h.Wait();
  CheckOneCommitOfCompleteShards(*comm);
  const Metadata md = CheckpointReader::Open(Url("async"), Options())->metadata();
  REQUIRE(md.save_timings.has_value());
  CHECK(md.save_timings->async);
  LoadRowsOnAllButLast(Url("async"), *comm);
  comm->Barrier();
}

TEST_CASE("one process's upload failing fails the s3:// save on every process, nothing visible") {
  Process p;
  auto& [comm, rank, size, rows, sd, so] = p;
  const int failing = size - 2;  // not rank 0, which commits
  const std::string expected = "rank " + std::to_string(failing) + ": ";
  g_watch.fail = rank == failing;
  std::string message;
  try {
    Save(Url("failing"), sd, *comm, so);
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find(expected) != std::string::npos);
  CHECK(message.find("injected upload failure") != std::string::npos);
  g_watch.fail = false;
  CHECK(TakeCommits(*comm).puts == 0);
  comm->Barrier();
  // No metadata.json, and the other processes' shards deleted again.
  CHECK_FALSE(AnyObject(*comm, "mpi/failing/"));

  // The same in the background: every process's Wait throws it; the next save commits.
  AsyncSaveOptions ao;
  ao.s3 = so.s3;
  g_watch.fail = rank == failing;
  SaveHandle h = SaveAsync(Url("async-failing"), sd, *comm, ao);
  CHECK_THROWS_WITH_AS(h.Wait(), doctest::Contains(expected.c_str()), Error);
  g_watch.fail = false;
  CHECK(TakeCommits(*comm).puts == 0);
  comm->Barrier();
  CHECK_FALSE(AnyObject(*comm, "mpi/async-failing/"));
  SaveAsync(Url("async-failing"), sd, *comm, ao).Wait();
  CHECK(TakeCommits(*comm).puts == 1);
  LoadRowsAndCheck(Url("async-failing"), *comm);
  comm->Barrier();
}

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  auto comm = MpiWorld();
  // The gateway, as every process sees its configuration (the same environment): absent,
  // every process skips together, or fails together where CI=true.
  const char* endpoint = std::getenv("CKPT_TEST_S3_ENDPOINT_URL");
  if (!endpoint || !*endpoint) {
    const char* ci = std::getenv("CI");
    if (ci && std::string(ci) == "true") {
      if (comm->rank() == 0) std::fprintf(stderr, "FAILED: the S3 gateway is needed here (CI=true), CKPT_TEST_S3_* unset\n");
      return 1;
    }
    if (comm->rank() == 0) std::fprintf(stderr, "SKIPPED: the S3 gateway is not configured (CKPT_TEST_S3_* unset)\n");
    return 77;
  }
  std::optional<s3_test::TestBucket> bucket;
  std::shared_ptr<st::S3Store> store;
  {
    ByteBuffer name;
    if (comm->rank() == 0) {
      store = std::make_shared<st::S3Store>(s3_test::GatewayConfig());
      bucket.emplace(*store);
      name.assign(bucket->name().begin(), bucket->name().end());
    }
    comm->Broadcast(name, 0);
    g_bucket.assign(name.begin(), name.end());
  }
  internal::SetObjectStoreWrapperForTest(
      [](std::shared_ptr<st::ObjectStore> inner) { return std::make_shared<WatchingStore>(std::move(inner)); });
  doctest::Context ctx;
  ctx.setOption("no-path-filenames", true);
  const int rc = ctx.run();
  internal::SetObjectStoreWrapperForTest(nullptr);
  int32_t worst = rc;
  comm->AllReduce(&worst, 1, DType::kInt32, ReduceOp::kMax);
  comm->Barrier();
  bucket.reset();  // emptied and removed, once every process is done with it
  return worst;
}
