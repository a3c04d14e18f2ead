// The project's own S3 gateway for the tests (scripts/s3-gateway.sh; scripts/test.sh starts it
// and passes CKPT_TEST_S3_ENDPOINT_URL, _ACCESS_KEY_ID, _SECRET_ACCESS_KEY, _REGION).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "storage/s3_config.h"
#include "storage/s3_store.h"
#include "test_util.h"

namespace s3_test {

// The gateway's configuration. Where it is not set or does not answer, the test process exits
// 77 (CTest: SKIPPED) with the reason, or, where CI=true, fails: CI must test against it.
ckpt::storage::s3::S3Config GatewayConfig();

// Options that reach the gateway of `config`, as a caller gives them (they override the
// AWS environment): its endpoint, region and keys, path-style addressing.
ckpt::ObjectStoreOptions GatewayOptions(const ckpt::storage::s3::S3Config& config);

// The port of an http://host:port endpoint.
int PortOf(const std::string& endpoint);

// A bucket of its own for one test case ("ckpt-test-<random>"), emptied (objects and
// unfinished uploads) and removed on destruction.
class TestBucket {
 public:
  explicit TestBucket(ckpt::storage::ObjectStore& store);
  ~TestBucket();
  TestBucket(const TestBucket&) = delete;
  TestBucket& operator=(const TestBucket&) = delete;
  const std::string& name() const { return name_; }

 private:
  ckpt::storage::ObjectStore& store_;
  std::string name_;
};

// What a test case of Save, Load or the tools on s3:// needs: the gateway (a store on it), a
// bucket of the case's own, a scratch directory (`tmp_tag`: its name's start), and `options`
// that reach them as a caller gives them, with the local staging under the scratch directory
// and parts of 5 MiB (the least S3 allows: a few MiB make a multipart upload).
struct StoreFixture {
  explicit StoreFixture(const std::string& tmp_tag);

  ckpt::storage::s3::S3Config config;
  std::shared_ptr<ckpt::storage::S3Store> s3;  // for a store that wraps it
  ckpt::storage::S3Store& store;               // *s3
  TestBucket bucket;
  ckpt_test::TempDir tmp;
  ckpt::ObjectStoreOptions options;

  // "s3://<bucket>/<name>".
  std::string Url(const std::string& name) const;
  // The keys of the objects under `prefix` in the bucket, in order.
  std::vector<std::string> Keys(const std::string& prefix) const;
};

}  // namespace s3_test
