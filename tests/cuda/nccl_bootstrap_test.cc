// ckpt::nccl's file bootstrap fails clearly, without a device: a rank waiting for an id that
// never comes, an id file left from an earlier job, a rank outside the group, no device.
#include <doctest/doctest.h>

#include <fstream>

#include "ckpt/ckpt.h"
#include "ckpt/cuda.h"
#include "ckpt/nccl.h"
#include "device_util.h"

using namespace ckpt;
using namespace std::chrono_literals;

using ckpt_test::ErrorOf;

TEST_CASE("a rank waiting for the NCCL id file gives up at the timeout, naming the file") {
  ckpt_test::TempDir tmp("nccl");
  nccl::Options options;
  options.timeout = 200ms;
  const auto [code, msg] = ErrorOf([&] { (void)nccl::OverFile(tmp / "nccl-id", 1, 2, options); });
  CHECK(code == ErrorCode::kComm);
  CHECK(msg.find((tmp / "nccl-id").string()) != std::string::npos);
  CHECK(msg.find("rank 1") != std::string::npos);
}

TEST_CASE("rank 0 refuses an NCCL id file left by an earlier job") {
  ckpt_test::TempDir tmp("nccl");
  std::ofstream(tmp / "nccl-id") << "stale";
  const auto [code, msg] = ErrorOf([&] { (void)nccl::OverFile(tmp / "nccl-id", 0, 2); });
  CHECK(code == ErrorCode::kAlreadyExists);
  CHECK(msg.find("already exists") != std::string::npos);
}

TEST_CASE("a malformed id file and a rank outside the group are errors") {
  ckpt_test::TempDir tmp("nccl");
  std::ofstream(tmp / "nccl-id") << "short";
  nccl::Options options;
  options.timeout = 200ms;
  auto [code, msg] = ErrorOf([&] { (void)nccl::OverFile(tmp / "nccl-id", 1, 2, options); });
  CHECK(code == ErrorCode::kComm);
  CHECK(msg.find("not an NCCL unique id") != std::string::npos);
  std::tie(code, msg) = ErrorOf([&] { (void)nccl::OverFile(tmp / "x", 2, 2); });
  CHECK(code == ErrorCode::kInvalidArgument);
}

TEST_CASE("bootstrap over a host Comm: one rank, a clear error where there is no device") {
  SingleComm host;
  nccl::Options options;
  options.timeout = std::chrono::seconds(30);
  if (cuda::DeviceCount() == 0) {
    const auto [code, msg] = ErrorOf([&] { (void)nccl::OverComm(host, options); });
    CHECK(code == ErrorCode::kComm);
    CHECK(msg.find("bootstrap") != std::string::npos);
  } else {
    auto comm = nccl::OverComm(host, options);
    CHECK(comm->size() == 1);
    CHECK(comm->AllOk(true));
  }
}
