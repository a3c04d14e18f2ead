// storage/commit.cc
#include "storage/commit.h"

#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <span>

#include "ckpt/error.h"
#include "format/names.h"
#include "storage/fs.h"

namespace ckpt::storage {
namespace {

[[noreturn]] void Fail(const fs::path& path, const std::string& what, int err) {
  throw Error(ErrorCode::kIO, path.string() + ": " + what + ": " + std::strerror(err));
}

// What a staging path was begun against, until it is committed or discarded.
struct Staged {
  Fd parent_lock;  // shared flock on the parent directory (none where flock is unsupported)
  bool had_target = false;
  bool target_was_empty_dir = false;
  dev_t dev = 0;
  ino_t ino = 0;
  bool keep = false;  // holds the previous content after a failed undo: never remove it
};

std::mutex g_mu;
std::map<std::string, Staged>& Registry() {
  static auto* r = new std::map<std::string, Staged>();  // outlives static destructors
  return *r;
}

bool IsEmptyDir(const fs::path& p) {
  struct stat st;
  std::vector<std::string> names;
  return Fs().Lstat(p, &st) == 0 && S_ISDIR(st.st_mode) && Fs().ListDir(p, names) == 0 && names.empty();
}

// Whether `p` exists (lstat); false only where it is not there, kIO naming it if the
// system cannot tell.
bool Exists(const fs::path& p) {
  struct stat st;
  if (Fs().Lstat(p, &st) == 0) return true;
  if (errno != ENOENT && errno != ENOTDIR) Fail(p, "stat", errno);
  return false;
}

bool IsHex16(std::string_view s) {
  if (s.size() != 16) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// The target a sibling name belongs to, stripping every sibling level
// (".<t>.ckpt-tmp-<hex>", ".<t>.ckpt-aside-<hex>"); empty if `name` is none. `aside`:
// the outermost level is an aside copy.
std::string_view OuterTarget(std::string_view name, bool& aside) {
  std::string_view t = name;
  bool sibling = false;
  aside = false;
  while (t.size() > 17 && t[0] == '.' && IsHex16(t.substr(t.size() - 16))) {
    const std::string_view head = t.substr(0, t.size() - 16);
    std::size_t infix = 0;
    if (head.ends_with(names::kTempInfix)) {
      infix = std::strlen(names::kTempInfix);
    } else if (head.ends_with(names::kAsideInfix)) {
      infix = std::strlen(names::kAsideInfix);
      if (!sibling) aside = true;
    } else {
      break;
    }
    if (head.size() <= infix + 1) break;
    sibling = true;
    t = head.substr(1, head.size() - 1 - infix);
  }
  return sibling ? t : std::string_view();
}

// Removes ckpt's leftovers in `parent` (whose lock the caller holds exclusively).
std::size_t CleanLocked(const fs::path& parent, const std::function<bool(std::string_view)>& is_target) {
  std::size_t removed = 0;
  std::vector<std::string> names;
  if (Fs().ListDir(parent, names) != 0) return 0;  // cleaning is only ever best effort
  std::vector<fs::path> found;
  for (const std::string& name : names) {
    const fs::path path = parent / name;
    bool aside = false;
    const std::string_view t = OuterTarget(name, aside);
    if (t.empty() || !is_target(t)) continue;
    // An aside copy is the only copy while its target is missing (a writer killed
    // between the two renames of the fallback without RENAME_EXCHANGE): keep it.
    struct stat st;
    if (aside && Fs().Lstat(parent / std::string(t), &st) != 0) continue;  // (or it cannot be told)
    // A staging name registered in this process is a live writer's.
    {
      std::lock_guard lock(g_mu);
      if (Registry().count(path.string())) continue;
    }
    found.push_back(path);
  }
  for (const fs::path& p : found) {
    RemoveAllQuietly(p);
    ++removed;
  }
  return removed;
}

// Opens `parent` and takes the exclusive lock if no one holds it; returns the fd (with
// `exclusive` telling which) or an empty Fd where directories cannot be locked.
Fd LockParent(const fs::path& parent, bool& exclusive) {
  exclusive = false;
  const int fd = Fs().Open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  if (fd < 0) Fail(parent, "open directory", errno);
  Fd lock(fd);
  if (Fs().Flock(fd, LOCK_EX | LOCK_NB, parent) == 0) {
    exclusive = true;
    return lock;
  }
  if (errno != EWOULDBLOCK) return Fd();  // no locks here (some network file systems)
  while (Fs().Flock(fd, LOCK_SH, parent) != 0) {
    if (errno != EINTR) return Fd();
  }
  return lock;
}

// Swaps `a` and `b`, both existing. Atomic with RENAME_EXCHANGE; on file systems without
// it, three renames through a free name (a moment with nothing at `b`, never a partial one).
void Swap(const fs::path& a, const fs::path& b) {
  if (Fs().Rename(a, b, RenameMode::kExchange) == 0) return;
  const int err = errno;
  if (err != EINVAL && err != ENOSYS) Fail(b, "atomic exchange with " + a.string(), err);
  const fs::path aside = SiblingPath(b, names::kAsideInfix);
  if (Fs().Rename(b, aside, RenameMode::kReplace) != 0) Fail(b, "rename aside to " + aside.string(), errno);
  if (Fs().Rename(a, b, RenameMode::kReplace) != 0) {
    const int e2 = errno;
    Fs().Rename(aside, b, RenameMode::kReplace);
    Fail(b, "rename into place from " + a.string(), e2);
  }
  if (Fs().Rename(aside, a, RenameMode::kReplace) != 0) Fail(a, "rename from " + aside.string(), errno);
}

// Renames `from` onto a `to` that must not exist.
void RenameNew(const fs::path& from, const fs::path& to) {
  if (Fs().Rename(from, to, RenameMode::kNoReplace) == 0) return;
  int err = errno;
  if (err == EINVAL || err == ENOSYS) {  // no RENAME_NOREPLACE: check, then rename
    if (Exists(to)) {
      err = EEXIST;
    } else if (Fs().Rename(from, to, RenameMode::kReplace) == 0) {
      return;
    } else {
      err = errno;
    }
  }
  if (err == EEXIST || err == ENOTEMPTY) {
    throw Error(ErrorCode::kAlreadyExists,
                to.string() + ": created by another writer while this one was writing; not replaced");
  }
  Fail(to, "rename from " + from.string(), err);
}

// FUSE's statfs magic (linux/magic.h FUSE_SUPER_MAGIC), for "fuse" and "fuseblk" mounts.
constexpr uint64_t kFuseMagic = 0x65735546;

// FUSE servers that keep each file as an object of an object store: a directory rename is
// a copy (and a delete) of each object in turn.
constexpr std::string_view kObjectStoreFuse[] = {"s3fs",          "goofys",   "geesefs",   "rclone", "gcsfuse",
                                                 "mountpoint-s3", "blobfuse", "blobfuse2", "ossfs"};
// FUSE servers whose rename is one rename(2) of a POSIX file system (a pass-through to a
// local one, or a cluster file system's own atomic rename).
constexpr std::string_view kAtomicFuse[] = {"fuse-overlayfs", "bindfs",    "sshfs",  "gocryptfs",
                                            "ceph-fuse",      "glusterfs", "juicefs"};

bool OneOf(std::string_view name, std::span<const std::string_view> names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

void CheckAtomicRename(const fs::path& target) {
  const fs::path dir = ParentOf(target);
  struct statfs st {};
  if (Fs().Statfs(dir, &st) != 0) Fail(dir, "statfs", errno);
  if (static_cast<uint64_t>(st.f_type) != kFuseMagic) return;
  MountEntry m;
  const bool listed = Fs().MountOf(dir, &m) == 0;
  // "fuse.s3fs" -> "s3fs"; a server that sets no subtype may still name itself as source.
  const std::size_t dot = m.type.find('.');
  const std::string subtype = dot == std::string::npos ? "" : m.type.substr(dot + 1);
  const std::string what = listed ? "type " + m.type + ", source " + m.source : "not in /proc/self/mountinfo";
  for (const std::string_view name : {std::string_view(subtype), std::string_view(m.source)}) {
    if (!name.empty() && OneOf(name, kObjectStoreFuse)) {
      throw Error(ErrorCode::kInvalidArgument,
                  target.string() + ": on " + std::string(name) + " (FUSE, " + what +
                      "), an object store mounted as files, whose rename is not atomic (a directory is copied file "
                      "by file, if at all): a checkpoint committed there could show before all its files do, and "
                      "stay so after a crash; ckpt does not commit there: use an s3:// path");
    }
  }
  if (OneOf(subtype, kAtomicFuse)) return;
  const char* allow = std::getenv("CKPT_ALLOW_FUSE");
  if (allow && std::string_view(allow) == "1") return;
  throw Error(ErrorCode::kInvalidArgument,
              target.string() + ": on a FUSE file system (" + what +
                  ") that ckpt does not know to rename atomically: if it is an object store, use an s3:// path; if "
                  "its rename is atomic (such as a pass-through to a local disk), set CKPT_ALLOW_FUSE=1");
}

bool IsSiblingName(std::string_view name, std::string_view target) {
  bool aside = false;
  const std::string_view t = OuterTarget(name, aside);
  return !t.empty() && t == target;
}

std::size_t CleanLeftovers(const fs::path& parent, const std::function<bool(std::string_view)>& is_target) {
  bool exclusive = false;
  Fd lock = LockParent(parent, exclusive);
  return exclusive ? CleanLocked(parent, is_target) : 0;
}

fs::path BeginStaging(const fs::path& target, bool directory) {
  const fs::path parent = ParentOf(target);
  const std::string name = fs::path(target).filename().empty() ? target.parent_path().filename().string()
                                                               : target.filename().string();
  MakeDirs(parent);
  CheckAtomicRename(target);
  Staged s;
  bool exclusive = false;
  s.parent_lock = LockParent(parent, exclusive);
  if (exclusive) {
    CleanLocked(parent, [&](std::string_view t) { return t == name; });
    // A conversion: stays locked. If it fails, the exclusive lock may still be held (a
    // failed conversion need not drop it), and held it would block every other writer in
    // `parent` until this one ends: this process's own next BeginStaging there (a commit
    // of several outputs, a merge's staging after its cleaning) would wait on it forever.
    // Closing the descriptor drops whatever it holds; this writer goes on unlocked, as
    // where the file system has no locks.
    if (Fs().Flock(s.parent_lock.get(), LOCK_SH, parent) != 0) s.parent_lock = Fd();
  }
  struct stat st;
  if (Fs().Lstat(target, &st) != 0) {
    if (errno != ENOENT) Fail(target, "stat", errno);
  } else {
    s.had_target = true;
    s.dev = st.st_dev;
    s.ino = st.st_ino;
    s.target_was_empty_dir = S_ISDIR(st.st_mode) && IsEmptyDir(target);
  }
  for (int attempt = 0; attempt < 16; ++attempt) {
    fs::path staging = SiblingPath(target, names::kTempInfix);
    if (directory) {
      if (Fs().Mkdir(staging, 0755) != 0) {
        if (errno == EEXIST) continue;
        Fail(staging, "cannot create staging directory", errno);
      }
    } else if (Exists(staging)) {
      continue;
    }
    std::lock_guard lock(g_mu);
    Registry()[staging.string()] = std::move(s);
    return staging;
  }
  throw Error(ErrorCode::kIO, target.string() + ": cannot create a unique staging name");
}

bool ReleaseStaging(const fs::path& path) {
  std::lock_guard lock(g_mu);
  auto it = Registry().find(path.string());
  if (it == Registry().end()) return true;
  const bool keep = it->second.keep;
  Registry().erase(it);
  return !keep;
}

void DiscardStaged(const fs::path& staging) { RemoveAllQuietly(staging); }

namespace {

// Renames `staging` onto `target` as CommitStaged's header says (checks first, nothing
// renamed if one fails); true if it exchanged with an existing target, whose previous
// content is then at `staging`.
bool RenameIntoPlace(const fs::path& staging, const fs::path& target, Replace replace) {
  Staged begun;
  bool registered = false;
  {
    std::lock_guard lock(g_mu);
    auto it = Registry().find(staging.string());
    if (it != Registry().end()) {
      begun.had_target = it->second.had_target;
      begun.target_was_empty_dir = it->second.target_was_empty_dir;
      begun.dev = it->second.dev;
      begun.ino = it->second.ino;
      registered = true;
    }
  }
  struct stat staged_st;
  if (Fs().Lstat(staging, &staged_st) != 0) Fail(staging, "staged output", errno);
  const bool staged_dir = S_ISDIR(staged_st.st_mode);

  struct stat st;
  if (Fs().Lstat(target, &st) != 0) {
    if (errno != ENOENT) Fail(target, "stat", errno);
    RenameNew(staging, target);  // replacing nothing is always allowed
    return false;
  }
  if (replace == Replace::kNever) {
    throw Error(ErrorCode::kAlreadyExists, target.string() + ": already exists");
  }
  if (replace == Replace::kExpected && registered &&
      (!begun.had_target || st.st_dev != begun.dev || st.st_ino != begun.ino ||
       (begun.target_was_empty_dir && !IsEmptyDir(target)))) {
    throw Error(ErrorCode::kAlreadyExists,
                target.string() + ": created or replaced by another writer while this one was writing; not replaced");
  }
  if (S_ISDIR(st.st_mode) != staged_dir) {
    throw Error(ErrorCode::kAlreadyExists, target.string() + ": exists and is not a " +
                                               (staged_dir ? "directory" : "regular file") + "; refusing to replace it");
  }
  if (staged_dir && !IsEmptyDir(target) && !Exists(target / names::kMetadataFile)) {
    throw Error(ErrorCode::kAlreadyExists,
                target.string() + ": exists and is neither empty nor a checkpoint; refusing to replace it");
  }
  Swap(staging, target);
  return true;
}

// Undoes RenameIntoPlace; "" when done, else what failed (with `exchanged`, the previous
// content is then kept at `staging`).
std::string UndoRename(const fs::path& staging, const fs::path& target, bool exchanged) {
  try {
    if (exchanged) {
      Swap(staging, target);
    } else if (Fs().Rename(target, staging, RenameMode::kNoReplace) != 0) {
      Fail(target, "rename back to " + staging.string(), errno);
    }
    return "";
  } catch (const Error& u) {
    if (!exchanged) return "undoing the rename failed too (" + std::string(u.what()) + ")";
    std::lock_guard lock(g_mu);
    auto it = Registry().find(staging.string());
    if (it != Registry().end()) it->second.keep = true;
    return "putting the previous content back failed too (" + std::string(u.what()) + "): it is at " +
           staging.string();
  }
}

}  // namespace

void CommitStaged(const fs::path& staging, const fs::path& target, Replace replace) {
  CommitStagedGroup({{staging, target}}, replace);
}

void CommitStagedGroup(const std::vector<std::pair<fs::path, fs::path>>& staged, Replace replace) {
  std::vector<bool> exchanged;
  std::vector<fs::path> parents;
  for (const auto& [staging, target] : staged)
    if (std::find(parents.begin(), parents.end(), ParentOf(target)) == parents.end())
      parents.push_back(ParentOf(target));
  // Committed in the namespace once every rename is done; durable once the parents are
  // fsynced. If a rename or an fsync fails, undo the renames done, last first.
  try {
    for (const auto& [staging, target] : staged) exchanged.push_back(RenameIntoPlace(staging, target, replace));
    for (const fs::path& parent : parents) FsyncPath(parent);
  } catch (const Error& e) {
    if (exchanged.empty() && staged.size() == 1) throw;  // nothing was renamed: the check's own error
    std::string undo;
    for (std::size_t i = exchanged.size(); i-- > 0;) {
      const std::string u = UndoRename(staged[i].first, staged[i].second, exchanged[i]);
      if (!u.empty()) undo += "; " + u;
    }
    for (const fs::path& parent : parents) {
      try {
        FsyncPath(parent);
      } catch (const Error&) {
      }
    }
    if (undo.empty()) {
      const bool replaced = std::find(exchanged.begin(), exchanged.end(), true) != exchanged.end();
      undo = replaced ? "; the previous content was put back" : "; nothing was committed";
    }
    std::string what = staged.back().second.string();
    if (staged.size() > 1) what = std::to_string(staged.size()) + " files, the last " + what;
    throw Error(e.code(), std::string(e.what()) + " (committing " + what + ")" + undo);
  }
  // Only now is the old content (at the staging names) garbage.
  for (std::size_t i = 0; i < staged.size(); ++i) {
    ReleaseStaging(staged[i].first);
    if (exchanged[i]) RemoveAllQuietly(staged[i].first);
  }
}

void CommitFile(const fs::path& target, std::string_view data) {
  const fs::path staging = BeginStaging(target, false);
  try {
    WriteFileSynced(staging, data);
    CommitStaged(staging, target, Replace::kExisting);
  } catch (...) {
    DiscardStaged(staging);
    throw;
  }
}

void RemoveCommitted(const fs::path& dir) {
  const fs::path aside = SiblingPath(dir, names::kTempInfix);
  if (Fs().Rename(dir, aside, RenameMode::kNoReplace) != 0) Fail(dir, "rename to " + aside.string(), errno);
  try {
    FsyncPath(ParentOf(dir));
  } catch (...) {
    // Not durably un-committed: keep every file, put it back.
    Fs().Rename(aside, dir, RenameMode::kNoReplace);
    throw;
  }
  RemoveAllQuietly(aside);
}

}  // namespace ckpt::storage
