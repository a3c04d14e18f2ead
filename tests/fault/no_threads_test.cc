// A process the system lets start no thread (an address-space limit leaves no room for a
// thread's stack): Load, verify and merge still work, on fewer threads, without a crash.
// Under ASan and TSan it cannot run (they reserve terabytes of address space, which the limit
// would take away): it exits 77 there, which CTest reports as SKIPPED (SKIP_RETURN_CODE),
// not as a pass that ran nothing.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <system_error>
#include <thread>

#include "ckpt/ops/merge.h"
#include "fault/fault_util.h"
#include "storage/pool.h"
#include "test_util.h"

using namespace ckpt;
using ckpt_test::kCols;
using ckpt_test::kRows;
using ckpt_test::SaveVersion;
using ckpt_test::Value;

// ASan and TSan reserve terabytes of address space: a limit on it stops them, not threads.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CKPT_TEST_NO_ADDRESS_LIMIT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define CKPT_TEST_NO_ADDRESS_LIMIT 1
#endif
#endif

TEST_CASE("a process the system lets start no thread still loads and verifies (fewer threads, no crash)") {
#ifdef CKPT_TEST_NO_ADDRESS_LIMIT
  std::fprintf(stderr, "SKIPPED: under a sanitizer (it needs the address space a limit would take away)\n");
  std::fflush(nullptr);
  std::_Exit(77);  // CTest's SKIP_RETURN_CODE
#else
  ckpt_test::TempDir tmp("no-threads");
  const std::filesystem::path dst = tmp / "ck";
  SaveVersion(dst, 3, false);
  // In a child: an address-space limit a few MiB above what it maps now leaves no room for a
  // thread's 8 MiB stack, so every pthread_create fails with EAGAIN, as under a process or
  // memory limit. Before, Load failed with "Resource temporarily unavailable" (a refusal after
  // some threads had started unwound a vector of joinable threads: std::terminate), and so
  // did a merge, whose shard writer copies on a thread of its own.
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (rlim_t{6} << 20);
    const rlimit as{limit, limit};
    if (setrlimit(RLIMIT_AS, &as) != 0) _exit(10);
    // glibc reuses the stacks of threads that have ended without a new mapping: threads that
    // wait forever take those first (the child ends with _exit, never joining them).
    auto* hold = new std::vector<std::thread>;
    static std::mutex mu;
    static std::condition_variable never;
    try {
      for (int i = 0; i < 4096; ++i)
        hold->emplace_back([] {
          std::unique_lock lock(mu);
          never.wait(lock, [] { return false; });
        });
    } catch (const std::system_error&) {
    }
    if (!storage::SpawnThreads(3, [](std::size_t) {}).empty()) _exit(11);  // the limit did not bite
    try {
      std::vector<float> w(kRows * kCols), b(kCols);
      StateDict sd;
      sd.Add("w", Tensor::Full(DType::kFloat32, {kRows, kCols}, w.data()));
      sd.Add("b", Tensor::Full(DType::kFloat32, {kCols}, b.data()));
      sd.Add("version", Scalar::Int(0));
      LoadOptions o;
      o.io_threads = 4;
      SingleComm one;
      Load(dst, sd, one, o);
      for (std::size_t i = 0; i < w.size(); ++i)
        if (w[i] != Value(3, static_cast<int64_t>(i))) _exit(12);
      ops::VerifyOptions vo;
      vo.threads = 4;
      if (!ops::Verify(dst, vo).ok()) _exit(13);
      const std::filesystem::path merged = tmp / "merged";
      ops::MergeOptions mo;
      mo.copy_min_bytes = 0;  // every chunk copied in the kernel by the shard writer's copier
      if (ops::Merge(dst, merged, mo).bytes_copied == 0) _exit(15);  // the copier was not used
      if (ckpt_test::VersionOf(merged) != 3) _exit(15);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      _exit(14);
    }
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  INFO("child status " << status << " (exit 11: no refusal; 12: wrong data; 13: verify; 14: an error; 15: merge)");
  REQUIRE(WIFEXITED(status));  // not killed by std::terminate's abort
  CHECK(WEXITSTATUS(status) == 0);
#endif
}
