// S3Store through a fault-injecting proxy in front of the real gateway: 503 SlowDown, 500,
// dropped connections, a stalled server and a cut-short answer are retried with backoff; a
// request that keeps failing gives up with a clear error naming bucket, key and status; and a
// conditional write or a Complete whose answer was lost is still reported exactly (our own
// write after a retry is a success, another writer's object is not).
#include <doctest/doctest.h>

#include <chrono>

#include "ckpt/error.h"
#include "error_of.h"
#include "fault_proxy.h"
#include "s3_gateway.h"
#include "storage/object_store.h"
#include "storage/s3_sign.h"
#include "storage/s3_store.h"

using ckpt::storage::S3Store;
using s3_test::ErrorOf;
using s3_test::FaultProxy;
using A = s3_test::FaultProxy::Action;
namespace s3 = ckpt::storage::s3;

namespace {

// A client of the gateway through `proxy`: one connection per request (so each request meets
// one planned action), short backoffs.
s3::S3Config Through(const FaultProxy& proxy, int attempts = 5) {
  s3::S3Config c = s3_test::GatewayConfig();
  c.endpoint = proxy.endpoint();
  c.transfer.max_connections = 0;
  c.transfer.max_attempts = attempts;
  c.transfer.base_backoff_ms = 5;
  c.transfer.max_backoff_ms = 50;
  c.transfer.stall_timeout_s = 1;
  return c;
}

int GatewayPort() { return s3_test::PortOf(s3_test::GatewayConfig().endpoint); }

ckpt::storage::ByteSpan Span(const std::string& s) { return s3::AsBytes(s); }

}  // namespace

TEST_CASE("503 SlowDown, a dropped connection and a 500 are retried; the PUT then lands once") {
  S3Store direct(s3_test::GatewayConfig());
  s3_test::TestBucket b(direct);
  FaultProxy proxy(GatewayPort(), {A::k503, A::kDrop, A::k500, A::kForward});
  S3Store store(Through(proxy));
  const std::string body = "retried body";
  CHECK(store.Put(b.name(), "k", Span(body)) == s3::Md5Hex(Span(body)));
  CHECK(store.stats().retries == 3);
  CHECK(store.stats().requests == 4);
  CHECK(direct.Get(b.name(), "k", 100) == std::vector<std::byte>(Span(body).begin(), Span(body).end()));
}

TEST_CASE("a ranged GET whose answer is cut short is retried, and the buffer holds exactly the range") {
  S3Store direct(s3_test::GatewayConfig());
  s3_test::TestBucket b(direct);
  std::string body(50000, '\0');
  for (std::size_t i = 0; i < body.size(); ++i) body[i] = static_cast<char>('a' + i % 23);
  direct.Put(b.name(), "obj", Span(body));
  FaultProxy proxy(GatewayPort(), {A::kTruncate, A::kTruncate, A::kForward});
  S3Store store(Through(proxy));
  std::vector<std::byte> out(20000);
  store.GetRange(b.name(), "obj", 1234, out);
  CHECK(std::string(reinterpret_cast<const char*>(out.data()), out.size()) == body.substr(1234, 20000));
  CHECK(store.stats().retries == 2);
}

TEST_CASE("a stalled server is a timeout, retried") {
  S3Store direct(s3_test::GatewayConfig());
  s3_test::TestBucket b(direct);
  direct.Put(b.name(), "k", Span(std::string("v")));
  FaultProxy proxy(GatewayPort(), {A::kStall, A::kForward});
  S3Store store(Through(proxy));
  const auto t0 = std::chrono::steady_clock::now();
  const auto info = store.Head(b.name(), "k");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(info);
  CHECK(info->size == 1);
  CHECK(store.stats().retries == 1);
  CHECK(s >= 0.9);  // the stall timeout (1 s) passed before the retry
  CHECK(s < 10);
}

TEST_CASE("a server that keeps failing: a clear error after max_attempts, naming bucket, key, status and code") {
  S3Store direct(s3_test::GatewayConfig());
  s3_test::TestBucket b(direct);
  {
    FaultProxy proxy(GatewayPort(), {}, A::k503);
    S3Store store(Through(proxy, 3));
    ckpt::ErrorCode code{};
    const std::string e = ErrorOf([&] { store.Put(b.name(), "dir/key", Span(std::string("x"))); }, &code);
    CHECK(code == ckpt::ErrorCode::kIO);
    CHECK(e.find("s3://" + b.name() + "/dir/key") != std::string::npos);
    CHECK(e.find("HTTP 503 SlowDown") != std::string::npos);
    CHECK(e.find("after 3 attempts") != std::string::npos);
    CHECK(store.stats().requests == 3);
  }
  {
    FaultProxy proxy(GatewayPort(), {}, A::kDrop);
    S3Store store(Through(proxy, 2));
    const std::string e = ErrorOf([&] { store.Get(b.name(), "dir/key", 10); });
    CHECK(e.find("s3://" + b.name() + "/dir/key") != std::string::npos);
    CHECK(e.find("after 2 attempts") != std::string::npos);
    CHECK(e.find(s3_test::GatewayConfig().credentials.secret_access_key) == std::string::npos);
  }
  CHECK_FALSE(direct.Head(b.name(), "dir/key"));  // nothing was written
}

TEST_CASE("put-if-absent whose answer was lost: the retry's 412 is our own write, not a lost race") {
  S3Store direct(s3_test::GatewayConfig());
  s3_test::TestBucket b(direct);
  const std::string body = "metadata of writer A";
  {
    FaultProxy proxy(GatewayPort(), {A::kLoseResponse});  // written, answer lost; then retried
    S3Store store(Through(proxy));
    const auto etag = store.PutIfAbsent(b.name(), "metadata.json", Span(body));
    REQUIRE(etag);
    CHECK(*etag == s3::Md5Hex(Span(body)));
    CHECK(store.stats().retries == 1);
  }
  {  // Another writer's object there, the first attempt failed before reaching it: a lost race.
    FaultProxy proxy(GatewayPort(), {A::k503});
    S3Store store(Through(proxy));
    CHECK_FALSE(store.PutIfAbsent(b.name(), "metadata.json", Span(std::string("metadata of writer B"))));
    CHECK(store.stats().retries == 1);
  }
  {  // If-Match likewise: the replaced object is ours after a lost answer.
    FaultProxy proxy(GatewayPort(), {A::kLoseResponse});
    S3Store store(Through(proxy));
    const std::string v2 = "metadata of writer A, version 2";
    const auto etag = store.PutIfMatch(b.name(), "metadata.json", Span(v2), s3::Md5Hex(Span(body)));
    REQUIRE(etag);
    CHECK(*etag == s3::Md5Hex(Span(v2)));
  }
}

// radosgw 16 answers a retried Complete of an upload it has just completed with 200 and the
// ETag; a server that answers NoSuchUpload instead (AWS) is handled by a HEAD (the object's
// ETag must be the one these parts make), which this gateway does not reach.
TEST_CASE("CompleteMultipart whose answer was lost is retried and reports the object's ETag") {
  S3Store direct(s3_test::GatewayConfig());
  s3_test::TestBucket b(direct);
  const std::string part = "a single (last) part may be small";
  const std::string id = direct.CreateMultipart(b.name(), "shard.h5");
  const std::string etag = direct.UploadPart(b.name(), "shard.h5", id, 1, Span(part));
  FaultProxy proxy(GatewayPort(), {A::kLoseResponse});
  S3Store store(Through(proxy));
  const std::string done = store.CompleteMultipart(b.name(), "shard.h5", id, {{1, etag}});
  CHECK(done == s3::MultipartEtag({etag}));
  CHECK(store.stats().retries == 1);
  const auto info = direct.Head(b.name(), "shard.h5");
  REQUIRE(info);
  CHECK(info->etag == done);
  CHECK(info->size == part.size());
}

TEST_CASE("a server that answers another range, or more bytes than asked: refused, naming key and range") {
  S3Store direct(s3_test::GatewayConfig());
  s3_test::TestBucket b(direct);
  direct.Put(b.name(), "obj", Span(std::string(10000, 'x')));
  {
    FaultProxy proxy(GatewayPort(), {A::kShiftRange});
    S3Store store(Through(proxy));
    std::vector<std::byte> out(100);
    const std::string e = ErrorOf([&] { store.GetRange(b.name(), "obj", 1000, out); });
    CHECK(e.find("s3://" + b.name() + "/obj: GET bytes 1000-1099: the server answered the range 'bytes 1001-1100/10000'") !=
          std::string::npos);
  }
  {
    FaultProxy proxy(GatewayPort(), {A::kWidenRange});
    S3Store store(Through(proxy));
    std::vector<std::byte> out(100);
    const std::string e = ErrorOf([&] { store.GetRange(b.name(), "obj", 1000, out); });
    CHECK(e.find("s3://" + b.name() + "/obj: GET: the server sent more than 100 bytes") != std::string::npos);
  }
}

// A body damaged on the way is refused by the server, never stored: PUT and UploadPart sign
// a Content-MD5 of the body (and send it as UNSIGNED-PAYLOAD: the MD5 is what covers it).
TEST_CASE("a PUT or a part whose body is damaged on the way: refused (BadDigest), nothing stored") {
  S3Store direct(s3_test::GatewayConfig());
  s3_test::TestBucket b(direct);
  const std::string body(100000, 'b');
  {
    FaultProxy proxy(GatewayPort(), {}, A::kFlipBody);
    S3Store store(Through(proxy, 2));
    const std::string e = ErrorOf([&] { store.Put(b.name(), "damaged", Span(body)); });
    CHECK(e.find("s3://" + b.name() + "/damaged") != std::string::npos);
    CHECK(e.find("BadDigest") != std::string::npos);
    CHECK_FALSE(direct.Head(b.name(), "damaged"));
  }
  {
    const std::string id = direct.CreateMultipart(b.name(), "part.h5");
    FaultProxy proxy(GatewayPort(), {}, A::kFlipBody);
    S3Store store(Through(proxy, 2));
    const std::string e = ErrorOf([&] { store.UploadPart(b.name(), "part.h5", id, 1, Span(body)); });
    CHECK(e.find("BadDigest") != std::string::npos);
    direct.AbortMultipart(b.name(), "part.h5", id);
    CHECK_FALSE(direct.Head(b.name(), "part.h5"));
  }
}
