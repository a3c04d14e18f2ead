// The commit routine (storage/commit.h), one regression test per finding of issue 8's
// "The commit can lie": a failure after the exchange is undone; --force replaces by
// exchange, never by moving aside; pruning un-commits before it deletes; leftovers of
// killed writers are removed by the next save to the same target, never a live one's; and
// a group commit (issue 12: Hub shards + index) is undone whole.
#include <doctest/doctest.h>
#include <sys/file.h>
#include <fcntl.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include "ckpt/ops/merge.h"
#include "fault/fault_fs.h"
#include "fault/fault_util.h"
#include "storage/commit.h"
#include "storage/fs.h"
#include "test_util.h"

namespace {

using namespace ckpt;
namespace fs = std::filesystem;
using ckpt_test::SaveVersion;
using ckpt_test::VersionOf;

// Fails every fsync of exactly `path` (the commit's parent-directory fsync).
class FailFsyncOf : public storage::FileSystem {
 public:
  explicit FailFsyncOf(fs::path path) : path_(std::move(path)) {}
  int Fsync(int fd, const fs::path& path) override {
    if (path == path_ && !fired_) {
      fired_ = true;
      errno = EIO;
      return -1;
    }
    return FileSystem::Fsync(fd, path);
  }
  bool fired_ = false;

 private:
  fs::path path_;
};

std::vector<std::string> Names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("a save whose parent fsync fails after the exchange puts the old checkpoint back and fails") {
  ckpt_test::TempDir tmp("commit-undo");
  const fs::path dst = tmp / "ck";
  SaveVersion(dst, 1, false);
  FailFsyncOf failing(tmp.path());
  {
    ckpt_test::Installed on(failing);
    CHECK_THROWS_WITH_AS(SaveVersion(dst, 2, true), doctest::Contains("the previous content was put back"), Error);
  }
  CHECK(failing.fired_);
  CHECK(VersionOf(dst) == 1);
  CHECK(Names(tmp.path()) == std::vector<std::string>{"ck"});
}

TEST_CASE("a save to a new path whose parent fsync fails commits nothing") {
  ckpt_test::TempDir tmp("commit-undo-new");
  FailFsyncOf failing(tmp.path());
  {
    ckpt_test::Installed on(failing);
    CHECK_THROWS_WITH_AS(SaveVersion(tmp / "ck", 2, false), doctest::Contains("nothing was committed"), Error);
  }
  CHECK(failing.fired_);
  CHECK(Names(tmp.path()).empty());
}

TEST_CASE("--force replaces by exchange: a failure at the rename leaves the old checkpoint at dst") {
  ckpt_test::TempDir tmp("commit-force");
  SaveVersion(tmp / "src", 2, false);
  SaveVersion(tmp / "dst", 1, false);
  ops::MergeOptions o;
  o.force = true;
  // The rename onto dst (the commit) fails; no moment without a checkpoint at dst.
  struct RenameFails : storage::FileSystem {
    fs::path dst;
    int renames = 0;
    int Rename(const fs::path& from, const fs::path& to, storage::RenameMode mode) override {
      if (to == dst) {
        ++renames;
        CHECK(mode == storage::RenameMode::kExchange);  // never a move aside
        errno = EIO;
        return -1;
      }
      return FileSystem::Rename(from, to, mode);
    }
  } fails;
  fails.dst = tmp / "dst";
  {
    ckpt_test::Installed on(fails);
    CHECK_THROWS_WITH_AS(ops::Merge(tmp / "src", tmp / "dst", o), doctest::Contains((tmp / "dst").c_str()), Error);
  }
  CHECK(fails.renames == 1);
  CHECK(VersionOf(tmp / "dst") == 1);
  CHECK(Names(tmp.path()) == std::vector<std::string>{"dst", "src"});
  ops::Merge(tmp / "src", tmp / "dst", o);
  CHECK(VersionOf(tmp / "dst") == 2);
  CHECK(Names(tmp.path()) == std::vector<std::string>{"dst", "src"});
}

TEST_CASE("removing a checkpoint un-commits it first: a failure leaves it whole or gone, never half") {
  ckpt_test::TempDir tmp("commit-remove");
  const fs::path dir = tmp / "step-00000001";
  SaveVersion(dir, 1, false);
  // Deleting its first shard fails: what remains is not at a committed name.
  ckpt_test::FaultFs failing(1, EIO, "shard-");
  {
    ckpt_test::Installed on(failing);
    storage::RemoveCommitted(dir);
  }
  CHECK(failing.fired());
  CHECK_FALSE(fs::exists(dir));
  // An fsync failure of the parent puts it back whole.
  SaveVersion(dir, 1, false);
  FailFsyncOf fsync_fails(tmp.path());
  {
    ckpt_test::Installed on(fsync_fails);
    CHECK_THROWS_AS(storage::RemoveCommitted(dir), Error);
  }
  CHECK(VersionOf(dir) == 1);
}

TEST_CASE("leftovers of killed writers are removed by the next save to that target, never a live writer's") {
  ckpt_test::TempDir tmp("commit-leftovers");
  const fs::path dst = tmp / "ck";
  SaveVersion(dst, 1, false);
  // What killed saves leave: a staging directory, the old content after an exchange, a
  // staging file, a nested staging of a merge; and another target's staging.
  for (const char* n : {".ck.ckpt-tmp-0123456789abcdef", ".ck.ckpt-tmp-00000000000000aa",
                        "..ck.ckpt-tmp-0123456789abcdef.ckpt-tmp-fedcba9876543210", ".ck.ckpt-aside-1111111111111111"}) {
    fs::create_directory(tmp / n);
    std::ofstream(tmp / n / "shard-00000-of-00001.h5") << "partial";
  }
  std::ofstream(tmp / ".ck.ckpt-tmp-2222222222222222") << "partial file";
  fs::create_directory(tmp / ".other.ckpt-tmp-0123456789abcdef");
  fs::create_directory(tmp / ".ck.ckpt-tmp-not-hex-at-all!");
  CHECK(storage::IsSiblingName("..ck.ckpt-tmp-0123456789abcdef.ckpt-tmp-fedcba9876543210", "ck"));
  CHECK_FALSE(storage::IsSiblingName(".other.ckpt-tmp-0123456789abcdef", "ck"));
  CHECK_FALSE(storage::IsSiblingName(".ck.ckpt-tmp-0123", "ck"));

  // Another process writing in the same directory holds the shared lock: nothing goes.
  {
    const int fd = ::open(tmp.path().c_str(), O_RDONLY | O_DIRECTORY);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_SH) == 0);
    SaveVersion(dst, 2, true);
    ::close(fd);
  }
  CHECK(Names(tmp.path()).size() == 8);
  // The next save with no other writer removes ckpt's own leftovers for "ck" only.
  SaveVersion(dst, 3, true);
  CHECK(VersionOf(dst) == 3);
  CHECK(Names(tmp.path()) ==
        std::vector<std::string>{".ck.ckpt-tmp-not-hex-at-all!", ".other.ckpt-tmp-0123456789abcdef", "ck"});
}

TEST_CASE("an aside copy whose target is missing is the only copy: kept") {
  ckpt_test::TempDir tmp("commit-aside");
  SaveVersion(tmp / ".ck.ckpt-aside-1111111111111111", 1, false);
  SaveVersion(tmp / "ck", 2, false);  // a new path: the aside (of "ck" when it was missing) stays...
  CHECK(fs::exists(tmp / ".ck.ckpt-aside-1111111111111111"));
}

// The group commit (Hub shards + index): a failure at any item undoes the items before it,
// last first, whether they replaced a file or took a free name.
TEST_CASE("a group commit that fails at its third item leaves every target as it was") {
  ckpt_test::TempDir tmp("commit-group");
  auto text = [](const fs::path& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  std::ofstream(tmp / "a") << "old a";  // replaced (exchange), then put back
  std::vector<std::pair<fs::path, fs::path>> staged;
  for (const char* name : {"a", "b", "c"}) {
    const fs::path s = storage::BeginStaging(tmp / name, false);
    storage::WriteFileSynced(s, std::string("new ") + name);
    staged.emplace_back(s, tmp / name);
  }
  std::ofstream(tmp / "c") << "someone else's c";  // appears while staging: kNever refuses it
  CHECK_THROWS_WITH_AS(storage::CommitStagedGroup(staged, storage::Replace::kNever),
                       doctest::Contains("already exists"), Error);
  CHECK(text(tmp / "c") == "someone else's c");
  CHECK_FALSE(fs::exists(tmp / "b"));
  CHECK(text(tmp / "a") == "old a");
  for (const auto& [s, t] : staged) {
    CHECK(text(s) == "new " + t.filename().string());  // back at its staging name, for the caller
    storage::DiscardStaged(s);
  }
  CHECK(Names(tmp.path()) == std::vector<std::string>{"a", "c"});
}

TEST_CASE("a group commit whose parent fsync fails puts every previous file back") {
  ckpt_test::TempDir tmp("commit-group-fsync");
  std::ofstream(tmp / "a") << "old a";
  std::vector<std::pair<fs::path, fs::path>> staged;
  for (const char* name : {"a", "b"}) {
    const fs::path s = storage::BeginStaging(tmp / name, false);
    storage::WriteFileSynced(s, std::string("new ") + name);
    staged.emplace_back(s, tmp / name);
  }
  FailFsyncOf failing(tmp.path());
  {
    ckpt_test::Installed on(failing);
    CHECK_THROWS_WITH_AS(storage::CommitStagedGroup(staged, storage::Replace::kExisting),
                         doctest::Contains("the previous content was put back"), Error);
  }
  CHECK(failing.fired_);
  for (const auto& [s, t] : staged) storage::DiscardStaged(s);
  CHECK(Names(tmp.path()) == std::vector<std::string>{"a"});
  std::ifstream f(tmp / "a");
  CHECK(std::string(std::istreambuf_iterator<char>(f), {}) == "old a");
}
