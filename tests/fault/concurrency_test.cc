// Concurrency of the commit protocol: readers racing overwrite saves see the old
// checkpoint or the new one whole, or a clear error, never a silent mix; two saves
// without overwrite to one new path: exactly one wins, the other fails clearly (also when
// the other commits between this save's check of the target and its staging).
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <latch>
#include <mutex>
#include <system_error>
#include <thread>

#include "ckpt/ops/merge.h"
#include "fault/fault_fs.h"
#include "fault/fault_util.h"
#include "storage/pool.h"
#include "test_util.h"

namespace {

using namespace ckpt;
using ckpt_test::kCols;
using ckpt_test::kRows;
using ckpt_test::SaveVersion;
using ckpt_test::Value;

// What one read saw: a version, or an error (whose message must name the checkpoint).
struct Seen {
  long whole = 0, errors = 0, torn = 0, unclear = 0;
};

// Checks that `w` (full) and `b` all carry one version; returns it or -1.
int OneVersion(const std::vector<float>& w, const std::vector<float>& b, int64_t w_offset = 0) {
  const int v = static_cast<int>(b[0] / 1000);
  for (std::size_t i = 0; i < b.size(); ++i)
    if (b[i] != Value(v, -static_cast<int64_t>(i))) return -1;
  for (std::size_t i = 0; i < w.size(); ++i)
    if (w[i] != Value(v, w_offset + static_cast<int64_t>(i))) return -1;
  return v;
}

void Judge(Seen& seen, const std::function<int()>& read, const std::string& dir) {
  try {
    const int v = read();
    if (v < 0) {
      ++seen.torn;
    } else {
      ++seen.whole;
    }
  } catch (const Error& e) {
    ++seen.errors;
    if (std::string(e.what()).find(dir) == std::string::npos) ++seen.unclear;
  }
}

}  // namespace

TEST_CASE("readers racing overwrite saves see one checkpoint whole or a clear error") {
  ckpt_test::TempDir tmp("race-read");
  const std::filesystem::path dst = tmp / "ck";
  SaveVersion(dst, 1, false);
  std::atomic<bool> done{false};
  Seen single, resharded;
  std::thread writer([&] {
    for (int v = 2; v < 42; ++v) SaveVersion(dst, v, true);
    done = true;
  });
  // One reader through CheckpointReader (one process, whole tensors) ...
  std::thread reader([&] {
    while (!done) {
      Judge(single, [&] {
        auto r = CheckpointReader::Open(dst);
        std::vector<float> w(kRows * kCols), b(kCols);
        r->ReadRegion("w", Box::Full({kRows, kCols}), w.data(), true);
        r->ReadRegion("b", Box::Full({kCols}), b.data(), true);
        const int v = OneVersion(w, b);
        return std::to_string(v) == r->metadata().Find("version")->value ? v : -1;
      }, dst.string());
    }
  });
  // ... and a resharded collective Load into 3 ranks split by columns.
  while (!done) {
    Judge(resharded, [&] {
      std::vector<int> versions(3, -1);
      RunThreads(3, [&](Comm& comm) {
        const int64_t per = kRows / 3, begin = per * comm.rank();
        std::vector<float> w(static_cast<std::size_t>(per * kCols)), b(kCols);
        StateDict target;
        target.Add("w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 0, begin, per, w.data()));
        target.Add("b", Tensor::Full(DType::kFloat32, {kCols}, b.data()));
        target.Add("version", Scalar{});
        Load(dst, target, comm);
        const int v = OneVersion(w, b, begin * kCols);
        versions[comm.rank()] = v == std::get<Scalar>(target.At("version")).AsInt() ? v : -1;
      });
      for (int v : versions)
        if (v != versions[0]) return -1;
      return versions[0];
    }, dst.string());
  }
  writer.join();
  reader.join();
  MESSAGE("reads during 40 overwrite saves: " << single.whole << " whole, " << single.errors << " clear errors, "
                                              << single.torn << " torn; resharded loads: " << resharded.whole
                                              << " whole, " << resharded.errors << " clear errors, "
                                              << resharded.torn << " torn");
  CHECK(single.torn == 0);
  CHECK(resharded.torn == 0);
  CHECK(single.unclear == 0);
  CHECK(resharded.unclear == 0);
  CHECK(single.whole + resharded.whole > 0);
}

TEST_CASE("two saves without overwrite to one new path: exactly one wins, the other fails clearly") {
  ckpt_test::TempDir tmp("race-write");
  int rounds = 0;
  for (int round = 0; round < 20; ++round) {
    const std::filesystem::path dst = tmp / ("ck" + std::to_string(round));
    std::latch start(2);
    std::atomic<int> won{0}, refused{0}, other{0};
    auto saver = [&](int version) {
      start.arrive_and_wait();
      try {
        SaveVersion(dst, version, false);
        ++won;
      } catch (const Error& e) {
        const bool clear = e.code() == ErrorCode::kAlreadyExists &&
                           std::string(e.what()).find(dst.string()) != std::string::npos;
        ++(clear ? refused : other);
      }
    };
    std::thread a(saver, 1), b(saver, 2);
    a.join();
    b.join();
    CHECK(won == 1);
    CHECK(refused == 1);
    CHECK(other == 0);
    const int v = ckpt_test::VersionOf(dst);
    CHECK((v == 1 || v == 2));
    ++rounds;
  }
  MESSAGE(rounds << " rounds of two racing saves: exactly one won each");
}

namespace {

// Creates directories as POSIX does; the first time it creates `parent`, it first lets a
// whole other save (`between`) commit, so that save lands after this writer checked its
// target (absent: only its parent is being made) and before its staging begins.
class CommitInBetween : public storage::FileSystem {
 public:
  CommitInBetween(std::filesystem::path parent, std::function<void()> between)
      : parent_(std::move(parent)), between_(std::move(between)) {}
  int Mkdir(const std::filesystem::path& path, mode_t mode) override {
    const int rc = FileSystem::Mkdir(path, mode);
    if (rc == 0 && path == parent_ && !fired_.exchange(true)) between_();
    return rc;
  }
  bool fired() const { return fired_; }

 private:
  const std::filesystem::path parent_;
  const std::function<void()> between_;
  std::atomic<bool> fired_{false};
};

}  // namespace

TEST_CASE("a save without overwrite refuses a checkpoint committed between its check and its staging") {
  ckpt_test::TempDir tmp("race-window");
  const std::filesystem::path parent = tmp / "new";  // absent: the first save's check makes it
  const std::filesystem::path dst = parent / "ck";
  CommitInBetween between(parent, [&] { SaveVersion(dst, 2, false); });
  ckpt_test::Installed on(between);
  ErrorCode code{};
  std::string what;
  try {
    SaveVersion(dst, 1, false);
  } catch (const Error& e) {
    code = e.code();
    what = e.what();
  }
  REQUIRE(between.fired());
  CHECK(code == ErrorCode::kAlreadyExists);
  CHECK(what.find(dst.string()) != std::string::npos);
  CHECK(ckpt_test::VersionOf(dst) == 2);  // the other save's checkpoint, not replaced
  CHECK(ckpt_test::Leftovers(parent).empty());
}

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
  MESSAGE("skipped under a sanitizer (it needs the address space a limit would take away)");
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
