// The project's own S3 gateway for the tests (scripts/s3-gateway.sh; scripts/test.sh starts it
// and passes CKPT_TEST_S3_ENDPOINT_URL, _ACCESS_KEY_ID, _SECRET_ACCESS_KEY, _REGION).
#pragma once

#include <memory>
#include <string>

#include "ckpt/checkpoint.h"
#include "storage/s3_config.h"
#include "storage/s3_store.h"

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

}  // namespace s3_test
