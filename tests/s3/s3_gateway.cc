#include "s3_gateway.h"

#include <cstdio>
#include <cstdlib>
#include <random>

#include <doctest/doctest.h>

#include "ckpt/error.h"

namespace s3_test {
namespace {

[[noreturn]] void Unavailable(const std::string& why) {
  const char* ci = std::getenv("CI");
  if (ci && std::string(ci) == "true") {
    FAIL("the S3 gateway is needed here (CI=true) but " << why
                                                       << ": scripts/test.sh starts it (scripts/s3-gateway.sh)");
  }
  std::fprintf(stderr, "SKIPPED: the S3 gateway %s (run scripts/s3-gateway.sh start and pass its endpoint as CKPT_TEST_S3_*; scripts/test.sh does)\n",
               why.c_str());
  std::fflush(nullptr);
  std::_Exit(77);  // CTest's SKIP_RETURN_CODE
}

std::string Var(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

}  // namespace

ckpt::storage::s3::S3Config GatewayConfig() {
  static const ckpt::storage::s3::S3Config config = [] {
    ckpt::storage::s3::S3Options o;
    o.endpoint = Var("CKPT_TEST_S3_ENDPOINT_URL");
    o.access_key_id = Var("CKPT_TEST_S3_ACCESS_KEY_ID");
    o.secret_access_key = Var("CKPT_TEST_S3_SECRET_ACCESS_KEY");
    o.region = Var("CKPT_TEST_S3_REGION");
    if (o.endpoint.empty() || o.access_key_id.empty() || o.secret_access_key.empty()) {
      Unavailable("is not configured (CKPT_TEST_S3_ENDPOINT_URL, _ACCESS_KEY_ID, _SECRET_ACCESS_KEY unset)");
    }
    o.addressing = ckpt::storage::s3::Addressing::kPath;
    o.max_attempts = 3;
    o.connect_timeout_ms = 2000;
    o.stall_timeout_s = 20;
    ckpt::storage::s3::S3Config c = ckpt::storage::s3::ResolveS3Config(o);
    try {  // does it answer? HEAD of a bucket that need not exist
      ckpt::storage::S3Store probe(c);
      probe.Head("ckpt-test-reachability", "k");
    } catch (const ckpt::Error& e) {
      const std::string what = e.what();
      if (what.find("HTTP") == std::string::npos) Unavailable("does not answer at " + o.endpoint + ": " + what);
    }
    return c;
  }();
  return config;
}

ckpt::ObjectStoreOptions GatewayOptions(const ckpt::storage::s3::S3Config& config) {
  ckpt::ObjectStoreOptions o;
  o.endpoint = config.endpoint;
  o.region = config.region;
  o.access_key_id = config.credentials.access_key_id;
  o.secret_access_key = config.credentials.secret_access_key;
  o.addressing = "path";
  return o;
}

int PortOf(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < 6) FAIL("no port in the endpoint " << endpoint);
  return std::stoi(endpoint.substr(colon + 1));
}

TestBucket::TestBucket(ckpt::storage::ObjectStore& store) : store_(store) {
  std::random_device rd;
  char buf[32];
  std::snprintf(buf, sizeof buf, "ckpt-test-%08x%08x", rd(), rd());
  name_ = buf;
  store_.CreateBucket(name_);
}

TestBucket::~TestBucket() {
  try {
    for (const auto& u : store_.ListMultipartUploads(name_, "")) store_.AbortMultipart(name_, u.key, u.upload_id);
    std::vector<std::string> keys;
    for (const auto& o : ckpt::storage::ListAll(store_, name_, "")) keys.push_back(o.key);
    store_.DeleteBatch(name_, keys);
    store_.DeleteBucket(name_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: could not remove test bucket %s: %s\n", name_.c_str(), e.what());
  }
}

StoreFixture::StoreFixture(const std::string& tmp_tag)
    : config(GatewayConfig()),
      s3(std::make_shared<ckpt::storage::S3Store>(config)),
      store(*s3),
      bucket(store),
      tmp(tmp_tag),
      options(GatewayOptions(config)) {
  options.staging_dir = tmp / "staging";
  options.part_bytes = 5ull << 20;
}

std::string StoreFixture::Url(const std::string& name) const { return "s3://" + bucket.name() + "/" + name; }

std::vector<std::string> StoreFixture::Keys(const std::string& prefix) const {
  std::vector<std::string> out;
  for (const ckpt::storage::ObjectInfo& o : ckpt::storage::ListAll(store, bucket.name(), prefix)) out.push_back(o.key);
  return out;
}

}  // namespace s3_test
