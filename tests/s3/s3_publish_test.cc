// Publishing a staged checkpoint on the real gateway (storage/object_commit.h): multipart
// uploads checked by HEAD, and the commit by one conditional PUT of metadata.json. Two
// publishers racing for a new path, and two racing to replace one checkpoint: exactly one
// commits in every round, the other is told "another writer committed first", and the
// committed metadata.json names only the winner's objects, all there and intact.
#include <doctest/doctest.h>

#include <barrier>
#include <fstream>
#include <thread>

#include "ckpt/error.h"
#include "error_of.h"
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
