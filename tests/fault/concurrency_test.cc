// Concurrency of the commit protocol: every reader racing overwrite saves sees one
// checkpoint whole, or a clear "changed while reading", never a mix; two saves
// without overwrite to one new path: exactly one wins, the other fails clearly (also when
// the other commits between this save's check of the target and its staging).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <latch>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <nlohmann/json.hpp>

#include "ckpt/ops/merge.h"
#include "ckpt/ops/safetensors.h"
#include "fault/fault_fs.h"
#include "fault/fault_util.h"
#include "storage/pool.h"
#include "test_util.h"

extern char** environ;

namespace {

using namespace ckpt;
using ckpt_test::kCols;
using ckpt_test::kRows;
using ckpt_test::SaveVersion;
using ckpt_test::Value;

// What one reader saw over the sweep: reads of one whole version, reads refused with a
// clear "changed while reading" (kChanged / the tools' exit 3, naming the checkpoint),
// torn answers (a mix of versions, or damage reported on a checkpoint that was never
// damaged) and any other outcome (unclear).
struct Seen {
  std::atomic<long> whole{0}, changed{0}, torn{0}, unclear{0};
  std::mutex mu;
  std::string example;  // the first torn or unclear answer
  void Bad(std::atomic<long>& which, const std::string& what) {
    ++which;
    std::lock_guard lock(mu);
    if (example.empty()) example = what;
  }
  long reads() const { return whole + changed + torn + unclear; }
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

// An in-process read: a version (or -1 for a mix), or an Error.
void Judge(Seen& seen, const std::function<int()>& read, const std::string& dir) {
  try {
    const int v = read();
    if (v < 0) {
      seen.Bad(seen.torn, "a mix of versions");
    } else {
      ++seen.whole;
    }
  } catch (const Error& e) {
    const std::string what = e.what();
    if (e.code() == ErrorCode::kChanged && what.find(dir) != std::string::npos &&
        what.find("changed while reading") != std::string::npos) {
      ++seen.changed;
    } else {
      seen.Bad(e.code() == ErrorCode::kCorrupt || e.code() == ErrorCode::kMismatch ? seen.torn : seen.unclear,
               std::string(ErrorCodeName(e.code())) + ": " + what);
    }
  }
}

// The version the checkpoint at `dir` holds through one CheckpointReader, -1 for a mix.
int ReadVersion(const std::filesystem::path& dir) {
  auto r = CheckpointReader::Open(dir);
  std::vector<float> w(kRows * kCols), b(kCols);
  r->ReadRegion("w", Box::Full({kRows, kCols}), w.data(), true);
  r->ReadRegion("b", Box::Full({kCols}), b.data(), true);
  const int v = OneVersion(w, b);
  return std::to_string(v) == r->metadata().Find("version")->value ? v : -1;
}

// The version a checkpoint written by a tool holds, -1 if it is not one version whole.
int VersionOrMix(const std::filesystem::path& dir) {
  try {
    return ReadVersion(dir);
  } catch (const Error&) {
    return -1;
  }
}

// The same for a safetensors file ckpt-convert wrote ("w" and "b").
int SafetensorsVersionOrMix(const std::filesystem::path& file) {
  try {
    auto r = ops::SafetensorsReader::Open(file);
    std::vector<float> w(kRows * kCols), b(kCols);
    r->ReadRegion(*r->Find("w"), Box::Full({kRows, kCols}), w.data());
    r->ReadRegion(*r->Find("b"), Box::Full({kCols}), b.data());
    return OneVersion(w, b);
  } catch (const std::exception&) {
    return -1;
  }
}

struct Ran {
  int rc = -1;
  std::string out;  // stdout and stderr
};

// Runs a tool as its own process (as a user would), stdout and stderr to `log`. The tools
// built with this test, or those in $CKPT_SWEEP_TOOL_DIR (to run the sweep against other
// builds of them, e.g. to show it catches a bug).
Ran RunTool(const std::string& tool, std::vector<std::string> args, const std::filesystem::path& log) {
  const char* dir = std::getenv("CKPT_SWEEP_TOOL_DIR");
  const std::string bin = std::string(dir && *dir ? dir : CKPT_TOOL_DIR) + "/" + tool;
  args.insert(args.begin(), bin);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  Ran r;
  const int err = posix_spawn(&pid, bin.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) {
    r.out = bin + ": cannot start: " + std::strerror(err);
    return r;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log);
  r.out.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

// A tool's outcome: exit 3 naming the checkpoint and "changed while reading" is the clear
// refusal; exit 0 is judged by `whole` (its answer is of one version); exit 1 is a torn
// answer (damage reported that is not there, or differences that no one version has)
// unless `differ_ok` accepts it; anything else is unclear.
void JudgeTool(Seen& seen, const Ran& r, const std::string& dir, const std::function<bool()>& whole,
               const std::function<bool()>& differ_ok = {}) {
  if (r.rc == 3 && r.out.find("changed while reading") != std::string::npos && r.out.find(dir) != std::string::npos) {
    ++seen.changed;
  } else if (r.rc == 0 || (r.rc == 1 && differ_ok)) {
    if (r.rc == 0 ? whole() : differ_ok()) {
      ++seen.whole;
    } else {
      seen.Bad(seen.torn, "exit " + std::to_string(r.rc) + ", an answer of no one version: " + r.out);
    }
  } else {
    seen.Bad(r.rc == 1 ? seen.torn : seen.unclear, "exit " + std::to_string(r.rc) + ": " + r.out);
  }
}

}  // namespace

// Every reader against a writer that replaces one checkpoint again and again (FORMAT.md
// §2.7): Load (3 ranks, resharded), CheckpointReader, and the tools ckpt-verify,
// ckpt-inspect, ckpt-merge, ckpt-diff and ckpt-convert run as processes. Each answer must be
// of one version whole, or a clear "changed while reading"; a torn answer (a mix, or damage
// reported on a checkpoint never damaged: issue 32) fails the sweep. Bounded: the writer
// stops after kOverwrites overwrites once every reader has answered at least twice, or at
// the deadline.
TEST_CASE("every reader racing an overwrite loop reads one checkpoint whole or fails with changed-while-reading") {
  constexpr int kOverwrites = 40;
  constexpr auto kDeadline = std::chrono::seconds(45);
  ckpt_test::TempDir tmp("race-read");
  const std::filesystem::path dst = tmp / "ck", ref = tmp / "ref1";
  SaveVersion(dst, 1, false);
  SaveVersion(ref, 1, false);
  const std::string d = dst.string();
  const char* names[] = {"Load", "CheckpointReader", "ckpt-verify", "ckpt-inspect", "ckpt-merge", "ckpt-diff",
                         "ckpt-convert"};
  constexpr int kReaders = 7;
  Seen seen[kReaders];
  std::atomic<bool> done{false};
  std::atomic<int> overwrites{0};
  const auto t0 = std::chrono::steady_clock::now();
  std::thread writer([&] {
    for (int v = 2;; ++v) {
      SaveVersion(dst, v, true);
      ++overwrites;
      bool enough = v > kOverwrites;
      for (const Seen& s : seen) enough = enough && s.reads() >= 2;
      if (enough || std::chrono::steady_clock::now() - t0 > kDeadline) break;
    }
    done = true;
  });
  auto loop = [&](int i, const std::function<void(int)>& read) {
    return std::thread([&, i, read] {
      for (int n = 0; !done; ++n) read(n);
    });
  };
  std::vector<std::thread> readers;
  readers.push_back(loop(0, [&](int) {  // a resharded collective Load into 3 ranks split by rows
    Judge(seen[0], [&] {
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
    }, d);
  }));
  readers.push_back(loop(1, [&](int) {  // CheckpointReader, whole tensors
    Judge(seen[1], [&] { return ReadVersion(dst); }, d);
  }));
  // The answers each tool gives for a whole version `v` are checked; a tool answers of one
  // version or says "changed while reading".
  readers.push_back(loop(2, [&](int n) {
    const Ran r = RunTool("ckpt-verify", {d, "-q", "--threads", "2"}, tmp / ("verify" + std::to_string(n % 2) + ".log"));
    JudgeTool(seen[2], r, d, [] { return true; });
  }));
  readers.push_back(loop(3, [&](int n) {
    const Ran r = RunTool("ckpt-inspect", {d, "--stats", "--json"}, tmp / ("inspect" + std::to_string(n % 2) + ".log"));
    JudgeTool(seen[3], r, d, [&] {
      // The version scalar and w's recorded minimum and maximum: of one version.
      const auto j = nlohmann::json::parse(r.out, nullptr, false);
      if (j.is_discarded()) return false;
      long version = -1;
      double lo = -1, hi = -1;
      for (const auto& k : j["keys"]) {
        if (k["key"] == "version") version = k["value"].get<long>();
        if (k["key"] == "w" && k.contains("stats")) {
          lo = k["stats"]["min"].get<double>();
          hi = k["stats"]["max"].get<double>();
        }
      }
      return version > 0 && lo == Value(static_cast<int>(version), 0) &&
             hi == Value(static_cast<int>(version), kRows * kCols - 1);
    });
  }));
  readers.push_back(loop(4, [&](int n) {
    const std::filesystem::path out = tmp / ("merged" + std::to_string(n));
    const Ran r = RunTool("ckpt-merge", {d, out.string(), "-q", "--world", "2"}, tmp / "merge.log");
    JudgeTool(seen[4], r, d, [&] { return VersionOrMix(out) >= 0; });
    std::filesystem::remove_all(out);
  }));
  readers.push_back(loop(5, [&](int) {
    // Against version 1's copy: a whole version v > 1 differs in every key (w, b, version).
    const Ran r = RunTool("ckpt-diff", {d, ref.string(), "--json"}, tmp / "diff.log");
    auto differing = [&] {
      const auto j = nlohmann::json::parse(r.out.substr(std::min(r.out.find('{'), r.out.size())), nullptr, false);
      if (j.is_discarded() || !j.contains("differences")) return std::size_t{99};
      return j["differences"].size();
    };
    JudgeTool(seen[5], r, d, [&] { return differing() == 0; }, [&] { return differing() == 3; });
  }));
  readers.push_back(loop(6, [&](int n) {
    const std::filesystem::path out = tmp / ("converted" + std::to_string(n) + ".safetensors");
    const Ran r = RunTool("ckpt-convert", {d, out.string(), "-q"}, tmp / "convert.log");
    JudgeTool(seen[6], r, d, [&] { return SafetensorsVersionOrMix(out) >= 0; });
    std::filesystem::remove(out);
  }));
  writer.join();
  for (auto& t : readers) t.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  long reads = 0, torn = 0;
  for (int i = 0; i < kReaders; ++i) {
    MESSAGE(std::string(names[i]) << ": " << seen[i].reads() << " reads: " << seen[i].whole.load() << " whole, "
                                   << seen[i].changed.load() << " changed while reading, " << seen[i].torn.load()
                                   << " torn, " << seen[i].unclear.load() << " unclear"
                                   << (seen[i].example.empty() ? "" : "; first: " + seen[i].example));
    INFO(std::string(names[i]));
    CHECK(seen[i].torn.load() == 0);
    CHECK(seen[i].unclear.load() == 0);
    CHECK(seen[i].whole.load() > 0);
    reads += seen[i].reads();
    torn += seen[i].torn;
  }
  MESSAGE("overwrite sweep: " << kReaders << " readers x " << overwrites.load() << " overwrites in " << secs << " s: " << reads
                              << " reads, " << torn << " torn");
}

namespace {

// Opens files as POSIX does; the first time a reader opens `name` through a directory
// handle, it first lets `between` run (a whole overwrite of the checkpoint being read).
class ReplaceOnOpen : public storage::FileSystem {
 public:
  ReplaceOnOpen(std::string name, std::function<void()> between)
      : name_(std::move(name)), between_(std::move(between)) {}
  int Open(const std::filesystem::path& path, int flags, mode_t mode, int dirfd) override {
    if (dirfd != AT_FDCWD && path.filename() == name_ && !fired_.exchange(true)) between_();
    return FileSystem::Open(path, flags, mode, dirfd);
  }
  bool fired() const { return fired_; }

 private:
  const std::string name_;
  const std::function<void()> between_;
  std::atomic<bool> fired_{false};
};

}  // namespace

// Issue 32: ckpt-verify of a checkpoint replaced while it read it reported damage (index
// digest or checksum mismatches: metadata.json of one version, shards of the next). Now it
// judges the checkpoint it opened, or fails with kChanged; never a verdict of damage.
TEST_CASE("verify of a checkpoint replaced while it reads: one checkpoint judged, or changed while reading") {
  ckpt_test::TempDir tmp("race-verify");
  const std::filesystem::path dst = tmp / "ck";
  SaveVersion(dst, 1, false);
  for (const char* shard : {"shard-00000-of-00004.h5", "shard-00002-of-00004.h5"}) {
    if (ckpt_test::VersionOf(dst) != 1) SaveVersion(dst, 1, true);
    ReplaceOnOpen hook(shard, [&] { SaveVersion(dst, 2, true); });
    std::optional<ops::VerifyReport> report;
    ErrorCode code{};
    std::string what;
    {
      ckpt_test::Installed on(hook);
      try {
        report = ops::Verify(dst, {});
      } catch (const Error& e) {
        code = e.code();
        what = e.what();
      }
    }
    INFO("replaced on opening " << shard << ": " << (report ? ops::RenderVerifyText(*report) : what));
    REQUIRE(hook.fired());
    if (report) {
      CHECK(report->ok());  // the checkpoint it opened, whole
    } else {
      CHECK(code == ErrorCode::kChanged);
      CHECK(what.find(dst.string()) != std::string::npos);
      CHECK(what.find("changed while reading") != std::string::npos);
    }
    CHECK(ckpt_test::VersionOf(dst) == 2);
  }
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
