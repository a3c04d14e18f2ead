// The fault sweep: EIO and ENOSPC injected through the file-system seam (storage/fs.h)
// at every file operation of a 4-rank save (fresh and overwrite), a merge, a convert to
// safetensors (one file, and the Hub's shards + index, fresh and --force over an earlier
// one), a --force replace and a checkpoint-manager rotation; every operation counts: the
// commit's and the leftovers cleaning's lstat, directory listings and flock calls included. After each point: the call returns
// (a hang is a failure: Watchdog),
// the target holds the old checkpoint or the new one, whole (nothing half-written is
// committed), a failed call never commits, the error names the file, the tools exit 0,
// 1 or 2, and the next call without faults leaves no staging leftovers behind.
#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "cli.h"
#include "ckpt/ckpt.h"
#include "ckpt/ops/safetensors.h"
#include "ckpt/ops/verify.h"
#include "ckpt/runtime/runtime.h"
#include "fault/fault_fs.h"
#include "fault/fault_util.h"
#include "runtime/runtime_helpers.h"
#include "test_util.h"

namespace {

using namespace ckpt;
namespace fs = std::filesystem;
using ckpt_test::FaultFs;
using ckpt_test::Installed;
using ckpt_test::kCols;
using ckpt_test::kRows;
using ckpt_test::Leftovers;
using ckpt_test::SaveVersion;
using ckpt_test::Value;
using ckpt_test::VersionOf;

// The version of a safetensors output (whole "w").
int VersionOfSafetensors(const fs::path& file) {
  auto r = ops::SafetensorsReader::Open(file);
  std::vector<float> w(kRows * kCols);
  const auto* t = r->Find("w");
  REQUIRE(t != nullptr);
  r->ReadRegion(*t, Box::Full({kRows, kCols}), w.data());
  const int v = static_cast<int>(w[0] / 1000);
  for (std::size_t i = 0; i < w.size(); ++i) REQUIRE(w[i] == Value(v, static_cast<int64_t>(i)));
  return v;
}

// The version of the Hub sharded output in `dir` (model.safetensors.index.json and the 2
// shards it names, every tensor of one version), or 0 when there is none: no index and
// no shard at all (a shard without its index is the torn state this must never show).
int VersionOfHub(const fs::path& dir) {
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index)) {
    for (const auto& e : fs::directory_iterator(dir))
      CHECK_MESSAGE(e.path().filename().string().find("safetensors") == std::string::npos,
                    "without an index: " << e.path());
    return 0;
  }
  const auto idx = ops::ReadSafetensorsIndex(index);
  REQUIRE(idx.files.size() == 2);
  REQUIRE(idx.weight_map.size() == 2);
  int version = -1;
  for (const auto& [tensor, file] : idx.weight_map) {
    auto r = ops::SafetensorsReader::Open(dir / file);
    const auto* t = r->Find(tensor);
    REQUIRE(t != nullptr);
    const bool w = tensor == "w";
    std::vector<float> v(w ? kRows * kCols : kCols);
    r->ReadRegion(*t, Box::Full(w ? Shape{kRows, kCols} : Shape{kCols}), v.data());
    const int got = static_cast<int>(std::lround(v[0] / 1000));
    for (std::size_t i = 0; i < v.size(); ++i)
      REQUIRE(v[i] == Value(got, w ? static_cast<int64_t>(i) : -static_cast<int64_t>(i)));
    if (version < 0) version = got;
    CHECK_MESSAGE(got == version, "shards of two saves under one index: " << tensor << " is version " << got);
  }
  return version;
}

struct Outcome {
  bool ok = false;
  std::string error;
  int rc = 0;  // tools only
};

// Runs a tool's main in this process (so the seam applies), capturing its stderr.
Outcome RunTool(int (*tool)(int, char**), std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::fflush(stdout);
  std::fflush(stderr);
  const int saved_out = ::dup(1), saved_err = ::dup(2);
  std::FILE* err = std::tmpfile();
  std::FILE* null = std::fopen("/dev/null", "w");
  ::dup2(::fileno(null), 1);
  ::dup2(::fileno(err), 2);
  Outcome o;
  o.rc = tool(static_cast<int>(argv.size()), argv.data());
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(saved_out, 1);
  ::dup2(saved_err, 2);
  ::close(saved_out);
  ::close(saved_err);
  std::fclose(null);
  std::rewind(err);
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, err)) > 0;) o.error.append(buf, n);
  std::fclose(err);
  o.ok = o.rc == 0;
  return o;
}

Outcome Catch(const std::function<void()>& fn) {
  Outcome o;
  try {
    fn();
    o.ok = true;
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  return o;
}

struct Totals {
  long points = 0, failed_calls = 0, problems = 0, lock_points = 0;
};
Totals g_totals;

// A hang is a failure: a call that has not returned after kHangSeconds (a tool blocked
// forever on a lock, issue 32) ends the whole test binary, naming the fault point, since
// the thread that hangs cannot be taken back.
constexpr int kHangSeconds = 120;  // the slowest case takes about a second under ASan on a busy machine

class Watchdog {
 public:
  // `err_` is stderr as it is now: RunTool points fd 2 at a file while a tool runs.
  explicit Watchdog(std::string what) : what_(std::move(what)), err_(::dup(2)), thread_([this] { Watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
    ::close(err_);
  }

 private:
  void Watch() {
    std::unique_lock lock(mu_);
    if (cv_.wait_for(lock, std::chrono::seconds(kHangSeconds), [&] { return done_; })) return;
    ::dprintf(err_, "HANG: %s did not return in %d s\n", what_.c_str(), kHangSeconds);
    std::_Exit(1);
  }
  std::string what_;
  int err_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// The sweep: `setup` restores the scene, `run` is the call under test, `check` judges
// the outcome (old or new, never anything else) and `next` is the next call without
// faults, after which no leftovers may remain in `parent`.
void Sweep(const char* name, const fs::path& parent, const std::function<void()>& setup,
           const std::function<Outcome()>& run, const std::function<void(const Outcome&)>& check,
           const std::function<void()>& next) {
  setup();
  long ops = 0;
  {
    FaultFs counting;
    Installed on(counting);
    const Outcome clean = run();
    REQUIRE_MESSAGE(clean.ok, std::string(name) << ": the call fails without faults: " << clean.error);
    ops = counting.count();
  }
  REQUIRE(ops > 5);
  long points = 0, failed = 0, locks = 0;
  for (const int err : {EIO, ENOSPC}) {
    for (long n = 1; n <= ops; ++n) {
      setup();
      FaultFs faulty(n, err);
      Outcome o;
      {
        Installed on(faulty);
        Watchdog watch(std::string(name) + " with " + (err == EIO ? "EIO" : "ENOSPC") + " at operation " +
                       std::to_string(n) + " of " + std::to_string(ops));
        o = run();
      }
      ++points;
      if (faulty.failed().rfind("flock", 0) == 0) ++locks;
      INFO(std::string(name) << ": " << (err == EIO ? "EIO" : "ENOSPC") << " at operation " << n << " of " << ops << " ("
                << faulty.failed() << "): " << (o.ok ? "succeeded" : o.error));
      CHECK(o.rc >= 0);
      CHECK(o.rc <= 2);
      if (!o.ok) {
        ++failed;
        CHECK(faulty.fired());
        // The error names the file the failed operation was on (or, for the commit's
        // parent-directory fsync, the target).
        const bool named = !faulty.failed_path().empty() &&
                           (o.error.find(faulty.failed_path().filename().string()) != std::string::npos ||
                            o.error.find(faulty.failed_path().string()) != std::string::npos);
        CHECK_MESSAGE(named, "the error does not name " << faulty.failed_path());
        if (!named) ++g_totals.problems;
      }
      check(o);
      next();
      const auto left = Leftovers(parent);
      CHECK_MESSAGE(left.empty(), "left behind: " << (left.empty() ? "" : left[0]));
      if (!left.empty()) ++g_totals.problems;
    }
  }
  g_totals.points += points;
  g_totals.failed_calls += failed;
  g_totals.lock_points += locks;
  MESSAGE(std::string(name) << ": " << ops << " file operations, " << points << " fault points (" << locks
               << " on flock), " << failed << " calls failed cleanly, " << points - failed << " succeeded");
}

}  // namespace

TEST_CASE("fault sweep: 4-rank save to a new path") {
  ckpt_test::TempDir tmp("sweep-fresh");
  const fs::path dst = tmp / "ck";
  Sweep(
      "save (fresh)", tmp.path(), [&] { fs::remove_all(dst); },
      [&] { return Catch([&] { SaveVersion(dst, 2, false); }); },
      [&](const Outcome& o) {
        if (o.ok) {
          CHECK(VersionOf(dst) == 2);
        } else {
          CHECK_FALSE(fs::exists(dst));  // a failed call never commits
        }
      },
      [&] { SaveVersion(dst, 3, true); });
}

TEST_CASE("fault sweep: 4-rank save over a checkpoint") {
  ckpt_test::TempDir tmp("sweep-over");
  const fs::path dst = tmp / "ck";
  SaveVersion(dst, 1, false);
  Sweep(
      "save (overwrite)", tmp.path(),
      [&] {
        if (VersionOf(dst) != 1) SaveVersion(dst, 1, true);
      },
      [&] { return Catch([&] { SaveVersion(dst, 2, true); }); },
      [&](const Outcome& o) { CHECK(VersionOf(dst) == (o.ok ? 2 : 1)); }, [&] { SaveVersion(dst, 3, true); });
}

// SaveAsync runs Save's protocol in the background: a fault anywhere in it (seen on Wait)
// leaves the last committed checkpoint whole, as for Save.
TEST_CASE("fault sweep: 4-rank async save over a checkpoint") {
  ckpt_test::TempDir tmp("sweep-async");
  const fs::path dst = tmp / "ck";
  SaveVersion(dst, 1, false);
  Sweep(
      "async save (overwrite)", tmp.path(),
      [&] {
        if (VersionOf(dst) != 1) SaveVersion(dst, 1, true);
      },
      [&] { return Catch([&] { ckpt_test::SaveVersion(dst, 2, true, /*async=*/true); }); },
      [&](const Outcome& o) { CHECK(VersionOf(dst) == (o.ok ? 2 : 1)); }, [&] { SaveVersion(dst, 3, true); });
}

TEST_CASE("fault sweep: ckpt-merge, ckpt-convert and a --force replace") {
  ckpt_test::TempDir tmp("sweep-tools");
  const fs::path src = tmp / "src", old_src = tmp / "old";
  fs::create_directories(tmp / "out");
  SaveVersion(src, 2, false);
  SaveVersion(old_src, 1, false);
  const fs::path merged = tmp / "out" / "merged";
  Sweep(
      "ckpt-merge", tmp / "out", [&] { fs::remove_all(merged); },
      [&] { return RunTool(tools::MergeMain, {"ckpt-merge", src, merged, "-q"}); },
      [&](const Outcome& o) {
        if (o.ok) {
          CHECK(VersionOf(merged) == 2);
        } else {
          CHECK_FALSE(fs::exists(merged));
        }
      },
      [&] { fs::remove_all(merged); });

  const fs::path st = tmp / "out" / "model.safetensors";
  Sweep(
      "ckpt-convert", tmp / "out", [&] { fs::remove(st); },
      [&] { return RunTool(tools::ConvertMain, {"ckpt-convert", src, st, "-q"}); },
      [&](const Outcome& o) {
        if (o.ok) {
          CHECK(VersionOfSafetensors(st) == 2);
        } else {
          CHECK_FALSE(fs::exists(st));
        }
      },
      [&] { fs::remove(st); });

  const fs::path replaced = tmp / "out" / "replaced";
  Sweep(
      "ckpt-merge --force", tmp / "out",
      [&] {
        fs::remove_all(replaced);
        REQUIRE(RunTool(tools::MergeMain, {"ckpt-merge", old_src, replaced, "-q"}).ok);
      },
      [&] { return RunTool(tools::MergeMain, {"ckpt-merge", src, replaced, "--force", "-q", "--world", "2"}); },
      [&](const Outcome& o) { CHECK(VersionOf(replaced) == (o.ok ? 2 : 1)); },
      [&] { REQUIRE(RunTool(tools::MergeMain, {"ckpt-merge", old_src, replaced, "--force", "-q"}).ok); });
}

TEST_CASE("fault sweep: ckpt-convert to the Hub's sharded safetensors, fresh and --force") {
  // "w" (768 bytes) and "b" (32) under --max-shard-size 500: two shards and an index.
  ckpt_test::TempDir tmp("sweep-hub");
  const fs::path src = tmp / "src", old_src = tmp / "old", hub = tmp / "hub";
  SaveVersion(src, 2, false);
  SaveVersion(old_src, 1, false);
  const std::string index = (hub / "model.safetensors.index.json").string();
  auto clear = [&] {
    fs::remove_all(hub);
    fs::create_directories(hub);
  };
  auto convert = [&](const fs::path& from, bool force) {
    std::vector<std::string> args{"ckpt-convert", from.string(), index, "--max-shard-size", "500", "-q"};
    if (force) args.emplace_back("--force");
    return RunTool(tools::ConvertMain, args);
  };
  Sweep(
      "ckpt-convert to shards", hub, clear, [&] { return convert(src, false); },
      [&](const Outcome& o) { CHECK(VersionOfHub(hub) == (o.ok ? 2 : 0)); }, clear);
  Sweep(
      "ckpt-convert to shards --force", hub,
      [&] {
        clear();
        REQUIRE(convert(old_src, false).ok);
        REQUIRE(VersionOfHub(hub) == 1);
      },
      [&] { return convert(src, true); },
      [&](const Outcome& o) { CHECK(VersionOfHub(hub) == (o.ok ? 2 : 1)); },
      [&] { REQUIRE(convert(old_src, true).ok); });
}

TEST_CASE("fault sweep: a checkpoint-manager rotation") {
  using namespace ckpt::runtime;
  using namespace ckpt::demo;
  ckpt_test::TempDir tmp("sweep-rotation");
  const fs::path root = tmp / "run", pristine = tmp / "pristine";
  const TrainerConfig c = rt_test::SmallConfig(Strategy::kFsdp);
  // Steps 1 and 2 committed, keep_last 2: saving step 3 commits it, moves `latest`, prunes step 1.
  RunThreads(2, [&](Comm& comm) {
    Trainer t(comm, c);
    CheckpointManager mgr(t.accelerator(), pristine, 2);
    for (int s = 1; s <= 2; ++s) {
      t.Step();
      mgr.Save(s);
    }
  });
  auto check_root = [&](const Outcome& o) {
    std::optional<int64_t> latest;
    RunThreads(2, [&](Comm& comm) {
      Trainer t(comm, c);
      CheckpointManager mgr(t.accelerator(), root, 2);
      // Every step directory that exists is committed and whole; resume finds one.
      for (const auto& e : fs::directory_iterator(root)) {
        const std::string n = e.path().filename().string();
        if (n.rfind("step-", 0) == 0 && comm.rank() == 0) {
          CHECK_MESSAGE(fs::exists(e.path() / "metadata.json"), n << " is not committed");
          CHECK_MESSAGE(ops::Verify(e.path(), {}).ok(), n << " fails verify");
        }
      }
      const auto step = mgr.Resume();
      if (comm.rank() == 0) latest = step;
    });
    REQUIRE(latest.has_value());
    CHECK((*latest == 2 || *latest == 3));
    if (o.ok) CHECK(*latest == 3);
  };
  Sweep(
      "checkpoint-manager rotation", root,
      [&] {
        fs::remove_all(root);
        fs::copy(pristine, root, fs::copy_options::recursive);
      },
      [&] {
        Outcome out;
        std::string error;
        RunThreads(2, [&](Comm& comm) {
          Trainer t(comm, c);
          CheckpointManager mgr(t.accelerator(), root, 2);
          try {
            mgr.Resume();
            t.Step();
            mgr.Save(3);
          } catch (const std::exception& e) {
            if (comm.rank() == 0) error = e.what();
          }
        });
        out.ok = error.empty();
        out.error = error;
        return out;
      },
      check_root,
      [&] {
        RunThreads(2, [&](Comm& comm) {
          Trainer t(comm, c);
          CheckpointManager mgr(t.accelerator(), root, 2);
          t.Step();
          mgr.Save(4);
        });
      });
}

TEST_CASE("fault sweep: totals") {
  MESSAGE("fault sweep: " << g_totals.points << " points tried (" << g_totals.lock_points << " on flock), "
                          << g_totals.failed_calls << " calls failed cleanly, " << g_totals.problems << " problems");
  CHECK(g_totals.lock_points > 0);
  CHECK(g_totals.problems == 0);
}
