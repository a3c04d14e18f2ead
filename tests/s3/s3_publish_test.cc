// Publishing a staged checkpoint on the real gateway (storage/object_commit.h): multipart
// uploads checked by HEAD, and the commit by one conditional PUT of metadata.json. Two
// publishers racing for a new path, and two racing to replace one checkpoint: exactly one
// commits in every round, the other is told "another writer committed first", and the
// committed metadata.json names only the winner's objects, all there and intact.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <functional>
#include <mutex>
#include <fstream>
#include <thread>

#include "ckpt/error.h"
#include "error_of.h"
#include "forwarding_store.h"
#include "s3_gateway.h"
#include "storage/object_commit.h"
#include "storage/s3_sign.h"
#include "storage/s3_store.h"
#include "test_util.h"

using ckpt::storage::S3Store;
using s3_test::ErrorOf;
namespace s3 = ckpt::storage::s3;
namespace st = ckpt::storage;

namespace {

constexpr uint64_t kPart = 5ull << 20;

std::string RandomBytes(std::size_t n, uint64_t seed) {
  std::string s(n, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 7;
  for (char& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

void Write(const std::filesystem::path& p, const std::string& data) { std::ofstream(p, std::ios::binary) << data; }

// A staged checkpoint of one writer: a 6 MiB shard (two parts) and a small file, both under
// names unique to this save, and a metadata.json naming them.
struct Staged {
  ckpt_test::TempDir dir{"s3-stage"};
  std::string nonce = st::SaveNonce();
  std::string shard = st::UniqueObjectName("shard-00000-of-00001.h5", nonce);
  std::string small = st::UniqueObjectName("extra.bin", nonce);
  std::string shard_bytes, small_bytes, metadata;
  explicit Staged(int writer) {
    shard_bytes = RandomBytes(kPart + (1 << 20), static_cast<uint64_t>(writer) * 1000 + 1);
    small_bytes = RandomBytes(1000, static_cast<uint64_t>(writer) * 1000 + 2);
    metadata = "{\"writer\": " + std::to_string(writer) + ", \"files\": [\"" + shard + "\", \"" + small + "\"]}";
    Write(dir / shard, shard_bytes);
    Write(dir / small, small_bytes);
    Write(dir / "metadata.json", metadata);
  }
};

std::string GetAll(S3Store& store, const std::string& bucket, const std::string& key) {
  const auto v = store.Get(bucket, key, 64 << 20);
  return {reinterpret_cast<const char*>(v.data()), v.size()};
}

// The committed checkpoint under `prefix` is exactly `w`'s.
void CheckCommitted(S3Store& store, const std::string& bucket, const std::string& prefix, const Staged& w) {
  CHECK(GetAll(store, bucket, prefix + "/metadata.json") == w.metadata);
  CHECK(GetAll(store, bucket, prefix + "/" + w.shard) == w.shard_bytes);
  CHECK(GetAll(store, bucket, prefix + "/" + w.small) == w.small_bytes);
}

// Two publishers race on `prefix` with `expected`; returns the winner's index (REQUIREs one).
int Race(S3Store& store, const std::string& bucket, const std::string& prefix, Staged& a, Staged& b,
         const std::optional<std::string>& expected) {
  std::barrier start(2);
  std::string errors[2];
  ckpt::ErrorCode codes[2] = {ckpt::ErrorCode::kInternal, ckpt::ErrorCode::kInternal};
  bool won[2] = {false, false};
  Staged* staged[2] = {&a, &b};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      errors[i] = ErrorOf(
          [&] {
            st::PublishDirectory(store, staged[i]->dir.path(), bucket, prefix, expected, {kPart, 4});
            won[i] = true;
          },
          &codes[i]);
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(won[0] != won[1]);
  const int loser = won[0] ? 1 : 0;
  CAPTURE(errors[loser]);
  CHECK(codes[loser] == ckpt::ErrorCode::kAlreadyExists);
  CHECK(errors[loser].find("s3://" + bucket + "/" + prefix + "/metadata.json: another writer committed first") !=
        std::string::npos);
  return 1 - loser;
}

}  // namespace

TEST_CASE("unique object names carry the save's nonce before the extension") {
  CHECK(st::UniqueObjectName("shard-00000-of-00002.h5", "0123456789abcdef") == "shard-00000-of-00002.0123456789abcdef.h5");
  CHECK(st::UniqueObjectName("noext", "n") == "noext.n");
  CHECK(st::UniqueObjectName(".hidden", "n") == ".hidden.n");
  const std::string a = st::SaveNonce(), b = st::SaveNonce();
  CHECK(a.size() == 16);
  CHECK(a != b);
}

TEST_CASE("UploadFile: multipart in parallel with the ETag and size checked by HEAD; one PUT for a small file") {
  S3Store store(s3_test::GatewayConfig());
  s3_test::TestBucket b(store);
  ckpt_test::TempDir dir("s3-upload");
  const std::string big = RandomBytes(2 * kPart + 12345, 5);
  Write(dir / "big", big);
  const auto info = st::UploadFile(store, b.name(), "up/big", dir / "big", {kPart, 3});
  CHECK(info.size == big.size());
  CHECK(info.etag.size() > 2);
  CHECK(info.etag.substr(info.etag.size() - 2) == "-3");
  CHECK(GetAll(store, b.name(), "up/big") == big);
  CHECK(store.ListMultipartUploads(b.name(), "").empty());
  Write(dir / "small", "small file");
  CHECK(st::UploadFile(store, b.name(), "up/small", dir / "small", {kPart, 3}).etag ==
        s3::Md5Hex(s3::AsBytes(std::string("small file"))));
  ckpt::ErrorCode code{};
  const std::string e = ErrorOf([&] { st::UploadFile(store, b.name(), "up/small", dir / "small", {kPart, 3}); }, &code);
  CHECK(code == ckpt::ErrorCode::kAlreadyExists);
  CHECK(e.find("up/small") != std::string::npos);
  CHECK_THROWS_AS(st::UploadFile(store, b.name(), "up/x", dir / "big", {1 << 20, 3}), ckpt::Error);  // part < 5 MiB
  CHECK_THROWS_AS(st::UploadFile(store, b.name(), "up/x", dir / "absent", {kPart, 3}), ckpt::Error);
}

// Writes `data[from, to)` at the same place of the open file `out`.
void WriteAt(std::fstream& out, const std::string& data, uint64_t from, uint64_t to) {
  out.seekp(static_cast<std::streamoff>(from));
  out.write(data.data() + from, static_cast<std::streamsize>(to - from));
  out.flush();
}

TEST_CASE("StreamingUpload: parts of final bytes go while the file is written, the rest at Finish; equal object") {
  auto store = std::make_shared<S3Store>(s3_test::GatewayConfig());
  s3_test::TestBucket b(*store);
  ckpt_test::TempDir dir("s3-stream");
  // Five parts: data everywhere but two "metadata" ranges (in parts 0 and 2) that are
  // written again after the data, as HDF5 does at close; part 4 is the short last one.
  const uint64_t size = 4 * kPart + 1000;
  const std::string first = RandomBytes(size, 11), last = RandomBytes(size, 12);
  const std::vector<std::pair<uint64_t, uint64_t>> meta{{0, 4096}, {2 * kPart + 100, 2 * kPart + 200}};
  std::vector<std::pair<uint64_t, uint64_t>> data;  // 1 MiB pieces of the rest, out of order
  for (uint64_t at = 4096; at < size;) {
    const uint64_t end = at < meta[1].first ? std::min(meta[1].first, at + (1u << 20)) : std::min(size, at + (1u << 20));
    data.emplace_back(at, end);
    at = end == meta[1].first ? meta[1].second : end;
  }
  std::reverse(data.begin(), data.end());
  struct Watch : s3_test::ForwardingStore {
    using ForwardingStore::ForwardingStore;
    std::function<void(int)> part;
    std::string UploadPart(const std::string& bk, const std::string& k, const std::string& id, int n,
                           st::ByteSpan body) override {
      if (part) part(n);
      return ForwardingStore::UploadPart(bk, k, id, n, body);
    }
  };
  auto watch = std::make_shared<Watch>(store);
  std::vector<int> order;
  std::mutex mu;
  watch->part = [&](int n) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(n);
  };
  {
    std::fstream out;
    {
      std::ofstream create(dir / "f", std::ios::binary);
      create << first;  // the metadata ranges' first version
    }
    out.open(dir / "f", std::ios::in | std::ios::out | std::ios::binary);
    st::StreamingUpload up(*watch, b.name(), "stream/f", dir / "f", {kPart, 3});
    for (const auto& [from, to] : data) {
      WriteAt(out, last, from, to);
      up.Final(from, to - from);
    }
    for (const auto& [from, to] : meta) WriteAt(out, last, from, to);  // the close: final only now
    out.close();
    const st::ObjectInfo info = up.Finish();
    CHECK(up.early_parts() == 2);  // parts 1 and 3 (numbers 2 and 4): only final bytes
    CHECK(info.size == size);
    CHECK(info.etag.substr(info.etag.size() - 2) == "-5");
  }
  CHECK(GetAll(*store, b.name(), "stream/f") == last);
  REQUIRE(order.size() == 5);
  CHECK(std::count(order.begin(), order.end(), 1) == 1);
  CHECK(order[0] != 1);  // part 1 held the superblock-like range: sent last, at Finish
  CHECK(store->ListMultipartUploads(b.name(), "").empty());

  // Destroyed unfinished after early parts (a failed save): its multipart upload is aborted.
  {
    st::StreamingUpload up(*store, b.name(), "stream/g", dir / "f", {kPart, 2});
    up.Final(kPart, 3 * kPart);
    while (up.early_parts() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(store->ListMultipartUploads(b.name(), "stream/g").size() == 1);
  }
  CHECK(store->ListMultipartUploads(b.name(), "").empty());
  CHECK(!store->Head(b.name(), "stream/g"));

  // A part the server refuses fails Finish, naming the object; nothing is left.
  struct Refuse : s3_test::ForwardingStore {
    using ForwardingStore::ForwardingStore;
    std::string UploadPart(const std::string& bk, const std::string& k, const std::string& id, int n,
                           st::ByteSpan body) override {
      if (n == 3) throw ckpt::Error(ckpt::ErrorCode::kIO, "s3://" + bk + "/" + k + ": part 3: HTTP 500");
      return ForwardingStore::UploadPart(bk, k, id, n, body);
    }
  } refuse(store);
  {
    st::StreamingUpload up(refuse, b.name(), "stream/h", dir / "f", {kPart, 2});
    up.Final(kPart, 3 * kPart);
    const std::string e = ErrorOf([&] { up.Finish(); });
    CHECK(e.find("stream/h") != std::string::npos);
  }
  CHECK(store->ListMultipartUploads(b.name(), "").empty());
  CHECK(!store->Head(b.name(), "stream/h"));
}

TEST_CASE("two publishers racing for a new checkpoint: exactly one commits, in each of 3 rounds") {
  S3Store store(s3_test::GatewayConfig());
  s3_test::TestBucket b(store);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    const std::string prefix = "ck/round-" + std::to_string(round);
    Staged w0(2 * round), w1(2 * round + 1);
    CHECK_FALSE(st::CommittedEtag(store, b.name(), prefix));
    const int winner = Race(store, b.name(), prefix, w0, w1, std::nullopt);
    const Staged& win = winner == 0 ? w0 : w1;
    CheckCommitted(store, b.name(), prefix, win);
    CHECK(st::CommittedEtag(store, b.name(), prefix) == s3::Md5Hex(s3::AsBytes(win.metadata)));
    CHECK(store.ListMultipartUploads(b.name(), prefix).empty());
  }
}

TEST_CASE("replace racing replace: only the writer whose seen ETag still holds commits; a stale one is refused") {
  S3Store store(s3_test::GatewayConfig());
  s3_test::TestBucket b(store);
  const std::string prefix = "ck/step-100";
  Staged first(10);
  const std::string e0 = st::PublishDirectory(store, first.dir.path(), b.name(), prefix, std::nullopt, {kPart, 4});
  CHECK(st::CommittedEtag(store, b.name(), prefix) == e0);
  // Saving anew without overwrite: refused, the first checkpoint untouched.
  Staged again(11);
  ckpt::ErrorCode code{};
  std::string e = ErrorOf([&] { st::PublishDirectory(store, again.dir.path(), b.name(), prefix, std::nullopt, {kPart, 4}); }, &code);
  CHECK(code == ckpt::ErrorCode::kAlreadyExists);
  CHECK(e.find("metadata.json exists now") != std::string::npos);
  CheckCommitted(store, b.name(), prefix, first);

  Staged r0(12), r1(13);
  const int winner = Race(store, b.name(), prefix, r0, r1, e0);
  const Staged& win = winner == 0 ? r0 : r1;
  CheckCommitted(store, b.name(), prefix, win);
  // The old checkpoint's objects are untouched (a reader still on it reads them whole).
  CHECK(GetAll(store, b.name(), prefix + "/" + first.shard) == first.shard_bytes);
  // A writer that saw e0 and comes late: refused, naming the ETag it saw.
  Staged late(14);
  e = ErrorOf([&] { st::PublishDirectory(store, late.dir.path(), b.name(), prefix, e0, {kPart, 4}); }, &code);
  CHECK(code == ckpt::ErrorCode::kAlreadyExists);
  CHECK(e.find("no longer the one with ETag " + e0) != std::string::npos);
  CheckCommitted(store, b.name(), prefix, win);
}

TEST_CASE("a staged name that exists under the prefix is refused before anything is written") {
  S3Store store(s3_test::GatewayConfig());
  s3_test::TestBucket b(store);
  Staged w(20);
  store.Put(b.name(), "ck/" + w.small, s3::AsBytes(std::string("someone else's")));
  ckpt::ErrorCode code{};
  const std::string e =
      ErrorOf([&] { st::PublishDirectory(store, w.dir.path(), b.name(), "ck", std::nullopt, {kPart, 4}); }, &code);
  CHECK(code == ckpt::ErrorCode::kAlreadyExists);
  CHECK(e.find("s3://" + b.name() + "/ck/" + w.small) != std::string::npos);
  CHECK_FALSE(store.Head(b.name(), "ck/" + w.shard));
  CHECK_FALSE(store.Head(b.name(), "ck/metadata.json"));
  CHECK(GetAll(store, b.name(), "ck/" + w.small) == "someone else's");
}
