// Commits refused where rename is not atomic (issue 30 section 4): on an s3fs mount a
// directory rename is one copy per object in name order, so a "committed" checkpoint showed
// metadata.json 0.8-1.6 s before its shards. storage::CheckAtomicRename, asked by every
// BeginStaging, tells FUSE by its statfs magic and the server by /proc/self/mountinfo.
// The cases below inject both through the file-system seam; the last one mounts a real
// FUSE file system (bindfs) where this machine allows it (CTest's fuse_mount_test; SKIPPED
// where it cannot).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "cli.h"
#include "ckpt/files.h"
#include "ckpt/ops/merge.h"
#include "fault/fault_fs.h"
#include "fault/fault_util.h"
#include "storage/commit.h"
#include "storage/fs.h"
#include "test_util.h"

namespace {

using namespace ckpt;
namespace fs = std::filesystem;
using ckpt_test::Installed;
using ckpt_test::SaveVersion;
using ckpt_test::VersionOf;

constexpr long kFuse = 0x65735546;

// Answers statfs with `magic` and the mount-table look-up with `mount` (ENOENT if none),
// for every path; counts the look-ups.
class FakeMount : public storage::FileSystem {
 public:
  FakeMount(long magic, std::optional<storage::MountEntry> mount) : magic_(magic), mount_(std::move(mount)) {}
  int Statfs(const fs::path& path, struct statfs* st) override {
    ++statfs_calls;
    if (FileSystem::Statfs(path, st) != 0) return -1;
    st->f_type = magic_;
    return 0;
  }
  int MountOf(const fs::path&, storage::MountEntry* entry) override {
    ++mount_calls;
    if (!mount_) {
      errno = ENOENT;
      return -1;
    }
    *entry = *mount_;
    return 0;
  }
  int statfs_calls = 0, mount_calls = 0;

 private:
  long magic_;
  std::optional<storage::MountEntry> mount_;
};

// Sets (or with nullptr unsets) CKPT_ALLOW_FUSE for the scope.
class AllowFuse {
 public:
  explicit AllowFuse(const char* value) {
    if (const char* old = std::getenv("CKPT_ALLOW_FUSE")) old_ = old;
    value ? ::setenv("CKPT_ALLOW_FUSE", value, 1) : ::unsetenv("CKPT_ALLOW_FUSE");
  }
  ~AllowFuse() { old_ ? ::setenv("CKPT_ALLOW_FUSE", old_->c_str(), 1) : ::unsetenv("CKPT_ALLOW_FUSE"); }
  AllowFuse(const AllowFuse&) = delete;
  AllowFuse& operator=(const AllowFuse&) = delete;

 private:
  std::optional<std::string> old_;
};

std::vector<std::string> Names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The message of the kInvalidArgument error `fn` throws ("" and a failed check otherwise).
template <typename Fn>
std::string Refusal(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    return e.what();
  }
  FAIL_CHECK("not refused");
  return "";
}

}  // namespace

TEST_CASE("a save to an s3fs mount is refused before anything is written, pointing to s3://") {
  ckpt_test::TempDir tmp("fuse-s3fs");
  FakeMount s3fs(kFuse, storage::MountEntry{"fuse.s3fs", "s3fs"});
  Installed on(s3fs);
  AllowFuse allow("1");  // the opt-out is for unknown FUSE file systems, not object stores
  const std::string msg = Refusal([&] { SaveVersion(tmp / "ck", 1, false); });
  CHECK(msg.find((tmp / "ck").string() + ": on s3fs (FUSE, type fuse.s3fs, source s3fs)") != std::string::npos);
  CHECK(msg.find("use an s3:// path") != std::string::npos);
  CHECK(Names(tmp.path()).empty());  // no staging directory, no target
  CHECK(s3fs.statfs_calls > 0);
}

TEST_CASE("every output that commits is refused on an object store's FUSE mount, each named by type or source") {
  ckpt_test::TempDir tmp("fuse-outputs");
  SaveVersion(tmp / "src", 1, false);
  const std::pair<storage::MountEntry, std::string> mounts[] = {
      {{"fuse.goofys", "bucket"}, "goofys"},         {{"fuse.rclone", "remote:bucket"}, "rclone"},
      {{"fuse.gcsfuse", "bucket"}, "gcsfuse"},       {{"fuse", "mountpoint-s3"}, "mountpoint-s3"},
      {{"fuse.geesefs", "bucket"}, "geesefs"},       {{"fuse", "blobfuse2"}, "blobfuse2"},
  };
  for (const auto& [mount, name] : mounts) {
    CAPTURE(name);
    FakeMount fake(kFuse, mount);
    Installed on(fake);
    const auto refused = [&](const std::string& msg, const fs::path& target) {
      CHECK(msg.find(target.string() + ": on " + name + " (FUSE, type " + mount.type) != std::string::npos);
      CHECK(msg.find("use an s3:// path") != std::string::npos);
    };
    refused(Refusal([&] { CheckpointWriter::Create(tmp / "w", {}); }), tmp / "w");
    refused(Refusal([&] { ops::Merge(tmp / "src", tmp / "m", {}); }), tmp / "m");
    refused(Refusal([&] { files::CommitFile(tmp / "latest", "x\n"); }), tmp / "latest");
  }
  CHECK(Names(tmp.path()) == std::vector<std::string>{"src"});
}

TEST_CASE("the tools exit 2 (an error, not a bad source) when their output is on an object store's mount") {
  ckpt_test::TempDir tmp("fuse-tools");
  SaveVersion(tmp / "src", 1, false);
  FakeMount s3fs(kFuse, storage::MountEntry{"fuse.s3fs", "s3fs"});
  Installed on(s3fs);
  const auto run = [](int (*tool)(int, char**), std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return tool(static_cast<int>(argv.size()), argv.data());
  };
  CHECK(run(tools::MergeMain, {"ckpt-merge", (tmp / "src").string(), (tmp / "m.h5").string(), "-q"}) == 2);
  CHECK(run(tools::ConvertMain, {"ckpt-convert", (tmp / "src").string(), (tmp / "m.safetensors").string(), "-q"}) ==
        2);
  CHECK(Names(tmp.path()) == std::vector<std::string>{"src"});
}

TEST_CASE("local and network file systems are accepted without a mount-table look-up") {
  // ext4, tmpfs, XFS, NFS, btrfs, Lustre
  for (const long magic : {0xEF53L, 0x01021994L, 0x58465342L, 0x6969L, 0x9123683EL, 0x0BD00BD0L}) {
    CAPTURE(magic);
    ckpt_test::TempDir tmp("fuse-local");
    FakeMount fake(magic, storage::MountEntry{"fuse.s3fs", "s3fs"});  // never asked
    {
      Installed on(fake);
      SaveVersion(tmp / "ck", 1, false);
      SaveVersion(tmp / "ck", 2, true);
    }
    CHECK(VersionOf(tmp / "ck") == 2);
    CHECK(fake.statfs_calls >= 2);
    CHECK(fake.mount_calls == 0);
  }
}

TEST_CASE("FUSE file systems that rename through a POSIX one are accepted") {
  for (const char* type : {"fuse.fuse-overlayfs", "fuse.sshfs", "fuse.bindfs", "fuse.gocryptfs", "fuse.ceph-fuse",
                           "fuse.glusterfs", "fuse.juicefs"}) {
    CAPTURE(type);
    ckpt_test::TempDir tmp("fuse-atomic");
    FakeMount fake(kFuse, storage::MountEntry{type, "/some/source"});
    {
      AllowFuse allow(nullptr);
      Installed on(fake);
      SaveVersion(tmp / "ck", 1, false);
    }
    CHECK(VersionOf(tmp / "ck") == 1);
    CHECK(fake.mount_calls > 0);
  }
}

TEST_CASE("an unknown FUSE file system is refused unless CKPT_ALLOW_FUSE=1") {
  ckpt_test::TempDir tmp("fuse-unknown");
  // A server that names no subtype (as bindfs built on libfuse 2), or one not in the lists,
  // or a mount the table does not show.
  const std::optional<storage::MountEntry> mounts[] = {storage::MountEntry{"fuse", "/data/src"},
                                                       storage::MountEntry{"fuse.mergerfs", "a:b"}, std::nullopt};
  for (const auto& mount : mounts) {
    CAPTURE(mount ? mount->type : "none");
    FakeMount fake(kFuse, mount);
    Installed on(fake);
    for (const char* value : {static_cast<const char*>(nullptr), "0", "", "yes"}) {
      CAPTURE(value ? value : "unset");
      AllowFuse allow(value);
      const std::string msg = Refusal([&] { SaveVersion(tmp / "ck", 1, false); });
      const std::string what =
          mount ? "type " + mount->type + ", source " + mount->source : std::string("not in /proc/self/mountinfo");
      CHECK(msg.find((tmp / "ck").string() + ": on a FUSE file system (" + what + ")") != std::string::npos);
      CHECK(msg.find("use an s3:// path") != std::string::npos);
      CHECK(msg.find("set CKPT_ALLOW_FUSE=1") != std::string::npos);
      CHECK(Names(tmp.path()).empty());
    }
    AllowFuse allow("1");
    SaveVersion(tmp / "ck", 1, false);
    SaveVersion(tmp / "ck", 2, true);
    CHECK(VersionOf(tmp / "ck") == 2);
    fs::remove_all(tmp / "ck");
  }
}

TEST_CASE("a statfs that fails is an I/O error naming the directory; nothing is committed") {
  ckpt_test::TempDir tmp("fuse-statfs");
  struct OnlyStatfs : storage::FileSystem {
    int Statfs(const fs::path&, struct statfs*) override {
      errno = EIO;
      return -1;
    }
  } failing;
  Installed on(failing);
  try {
    files::CommitFile(tmp / "latest", "x\n");
    FAIL_CHECK("committed");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kIO);
    CHECK(std::string(e.what()) == tmp.path().string() + ": statfs: " + std::strerror(EIO));
  }
  CHECK(Names(tmp.path()).empty());
}

TEST_CASE("the fault sweep's file system counts the check's statfs, so a fault is injected there too") {
  ckpt_test::TempDir tmp("fuse-sweep");
  ckpt_test::FaultFs counting;
  {
    Installed on(counting);
    files::CommitFile(tmp / "latest", "x\n");
  }
  CHECK(counting.count("statfs") == 1);
  CHECK(counting.count("mountinfo") == 0);  // not FUSE: never asked
  ckpt_test::FaultFs failing(1, EIO, "");
  {
    Installed on(failing);
    CHECK_THROWS_AS(files::CommitFile(tmp / "latest", "y\n"), Error);
  }
  CHECK(failing.failed() == "statfs " + tmp.path().string());
  CHECK(storage::ReadFileLimited(tmp / "latest", 16) == "x\n");
}

TEST_CASE("the mount table is read by device: optional fields, escapes, the first match") {
  const std::string text =
      "22 1 252:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
      "40 22 0:45 / /mnt/my\\040bucket rw,nosuid,nodev shared:7 master:3 - fuse.s3fs s3\\040fs rw,user_id=0\n"
      "41 22 0:46 /sub /mnt/b rw - fuse /tmp/src rw\n"
      "42 22 0:46 / /mnt/c rw - fuse /tmp/src rw\n"
      "43 22 0:47 / /broken rw\n";
  storage::MountEntry m;
  REQUIRE(storage::FindMount(text, makedev(0, 45), &m));
  CHECK(m.type == "fuse.s3fs");
  CHECK(m.source == "s3 fs");
  REQUIRE(storage::FindMount(text, makedev(252, 1), &m));
  CHECK(m.type == "ext4");
  CHECK(m.source == "/dev/vda1");
  REQUIRE(storage::FindMount(text, makedev(0, 46), &m));
  CHECK(m.type == "fuse");
  CHECK(!storage::FindMount(text, makedev(0, 47), &m));  // no " - " separator
  CHECK(!storage::FindMount(text, makedev(0, 4), &m));
  CHECK(!storage::FindMount("", makedev(0, 45), &m));
}

// ---- A real FUSE mount -------------------------------------------------------------

namespace {

// bindfs mounting `src` at `mnt` in the foreground as a child process, told to exit
// (and so to unmount) when this thread ends, however it ends; unmounted by the destructor.
// `skipped` says why there is no mount where this machine cannot make one.
class BindfsMount {
 public:
  BindfsMount(const fs::path& src, const fs::path& mnt, const fs::path& log) : mnt_(mnt) {
    if (::access("/dev/fuse", R_OK | W_OK) != 0) {
      skipped = "/dev/fuse cannot be opened (" + std::string(std::strerror(errno)) + ")";
      return;
    }
    const char* bindfs = nullptr;
    for (const char* p : {"/usr/bin/bindfs", "/usr/local/bin/bindfs"})
      if (::access(p, X_OK) == 0) bindfs = p;
    if (!bindfs) {
      skipped = "bindfs is not installed (scripts/install-deps.sh installs it)";
      return;
    }
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);  // libfuse unmounts on SIGTERM
      if (::getppid() != parent) ::_exit(1);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execl(bindfs, bindfs, "-f", "--no-allow-other", src.c_str(), mnt.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 1000; ++i) {  // 10 s
      if (Mounted()) return;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        skipped = "bindfs could not mount (exit status " + std::to_string(status) + "): " + ReadLog(log);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    skipped = "bindfs did not mount within 10 s: " + ReadLog(log);
  }
  ~BindfsMount() { Unmount(); }
  BindfsMount(const BindfsMount&) = delete;
  BindfsMount& operator=(const BindfsMount&) = delete;

  bool Mounted() const {
    struct statfs st {};
    return ::statfs(mnt_.c_str(), &st) == 0 && st.f_type == kFuse;
  }
  // Asks bindfs to exit (it unmounts), waits for it; detaches the mount if it is still there.
  void Unmount() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
      pid_ = -1;
    }
    if (Mounted()) ::umount2(mnt_.c_str(), MNT_DETACH);
  }
  std::string skipped;

 private:
  static std::string ReadLog(const fs::path& log) {
    std::error_code ec;
    return fs::exists(log, ec) ? storage::ReadFileLimited(log, 4096) : "";
  }
  fs::path mnt_;
  pid_t pid_ = -1;
};

}  // namespace

// Run by CTest as fuse_mount_test (--no-skip): SKIPPED (exit 77) where no mount can be made.
TEST_CASE("real FUSE mount (bindfs): told by statfs and mountinfo, refused, accepted with the opt-out" *
          doctest::skip()) {
  ckpt_test::TempDir tmp("fuse-mount");
  fs::create_directories(tmp / "src");
  fs::create_directories(tmp / "mnt");
  {
    BindfsMount mount(tmp / "src", tmp / "mnt", tmp / "bindfs.log");
    if (!mount.skipped.empty()) {
      mount.Unmount();
      fs::remove_all(tmp.path());
      std::fprintf(stderr, "SKIPPED: %s\n", mount.skipped.c_str());
      std::fflush(stderr);
      std::_Exit(77);  // CTest's SKIP_RETURN_CODE
    }
    const fs::path mnt = tmp / "mnt", ck = mnt / "ck";
    struct statfs st {};
    REQUIRE(storage::Fs().Statfs(mnt, &st) == 0);
    CHECK(st.f_type == kFuse);
    storage::MountEntry m;
    REQUIRE(storage::Fs().MountOf(mnt, &m) == 0);
    CHECK(m.type.rfind("fuse", 0) == 0);
    CHECK(m.source == (tmp / "src").string());
    {
      AllowFuse allow(nullptr);
      const std::string msg = Refusal([&] { SaveVersion(ck, 1, false); });
      CHECK(msg.find(ck.string() + ": on a FUSE file system (type " + m.type + ", source " + m.source + ")") !=
            std::string::npos);
      CHECK(Names(tmp / "src").empty());
    }
    {
      AllowFuse allow("1");
      SaveVersion(ck, 1, false);
      CHECK(VersionOf(ck) == 1);
      SaveVersion(ck, 2, true);  // replaced through the FUSE server's rename
      CHECK(VersionOf(ck) == 2);
    }
    CHECK(VersionOf(tmp / "src" / "ck") == 2);  // what bindfs wrote through
    mount.Unmount();
    CHECK(!mount.Mounted());
  }
}
