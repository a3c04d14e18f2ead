// storage/commit.h: the one commit routine (FORMAT.md §2) behind every output ckpt writes:
// checkpoint directories (Save, CheckpointWriter), merge, --virtual and safetensors
// outputs, the checkpoint manager's `latest` file.
//
// An output is written in full into a staging sibling of its target
// (".<name>.ckpt-tmp-<random>"), fsynced, and then committed by one atomic rename:
// RENAME_NOREPLACE onto a free target, RENAME_EXCHANGE over an existing one. The parent
// directory is then fsynced; only after that is the old content (now at the staging
// name) removed. If anything fails after the rename, the rename is undone (exchanged
// back), so a call that fails never commits and leaves the target as it was.
//
// Leftovers of writers that were killed (staging and aside siblings, old content not yet
// removed) are removed by the next BeginStaging for the same target. Writers hold a
// shared flock on the parent directory from BeginStaging to the end of the commit, and
// leftovers are removed only under the exclusive lock, so no live writer's staging is
// ever removed by another process.
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/files.h"

namespace ckpt::storage {

namespace fs = std::filesystem;

// What a commit may replace at the target: public (ckpt/files.h).
using Replace = files::Replace;

// Throws kInvalidArgument, naming `target` and the file system, where `target`'s directory is
// on a FUSE file system (statfs magic 0x65735546) whose rename may not be atomic, so that
// a commit there could show a checkpoint before all its files (issue 30: s3fs renames a
// directory as one copy per object, in name order, metadata.json first):
// - a FUSE mount of an object store (s3fs, goofys, geesefs, rclone, gcsfuse, mountpoint-s3,
//   blobfuse, ossfs, told by mountinfo's type "fuse.<name>" or source "<name>") is refused,
//   pointing to an s3:// path;
// - a FUSE file system whose rename is the rename of a POSIX file system under it
//   (fuse-overlayfs, bindfs, sshfs, gocryptfs, ceph-fuse, glusterfs, juicefs) is accepted;
// - any other FUSE file system is refused unless the environment has CKPT_ALLOW_FUSE=1
//   (the user's word that its rename is atomic).
// Every other file system is accepted. kIO naming the directory if statfs fails.
void CheckAtomicRename(const fs::path& target);

// Reserves a fresh staging path beside `target` and registers it until it is committed
// or discarded; with `directory`, creates it as a directory. First removes the leftovers
// of killed writers for `target` (when no other writer works in the same directory).
// Creates the parent directory if needed, then checks it (CheckAtomicRename) before
// anything is staged.
fs::path BeginStaging(const fs::path& target, bool directory);

// Commits `staging` (a file or directory fully written and fsynced) at `target` as the
// header says. Errors (kAlreadyExists, kIO) name the target; the staging is left for
// the caller to discard.
void CommitStaged(const fs::path& staging, const fs::path& target, Replace replace);

// Commits several staged outputs, all or nothing: each (staging, target) pair is renamed
// into place in order as CommitStaged does (put last the one readers look for, such as an
// index naming the others), every target's parent directory is fsynced, and only then is
// any previous content removed. If a rename or an fsync fails, the renames done are undone,
// last first (previous content exchanged back, new files back at their staging names for
// the caller to discard): a call that fails leaves every target as it was.
void CommitStagedGroup(const std::vector<std::pair<fs::path, fs::path>>& staged, Replace replace);

// Removes a staging path that was not committed and ends its registration (never
// throws). If a failed commit could not put the old content back, the staging path
// holds it and is kept. RemoveAllQuietly on a registered staging path does the same.
void DiscardStaged(const fs::path& staging);
// Ends the registration of `path`; false if its content must be kept (see above).
bool ReleaseStaging(const fs::path& path);

// Writes a small file atomically: staged, fsynced, committed (Replace::kExisting).
void CommitFile(const fs::path& target, std::string_view data);

// Un-commits the checkpoint directory `dir` (renames it to a staging name and fsyncs
// the parent) and only then removes its files, so no moment shows a `dir` that looks
// committed but has lost files. kIO naming `dir` if the rename or the fsync fails (the
// checkpoint is then still at `dir`, whole).
void RemoveCommitted(const fs::path& dir);

// Whether `name` is one of ckpt's sibling names for the target named `target`
// (".<target>.ckpt-tmp-<16 hex>", ".<target>.ckpt-aside-<16 hex>", or such a name of
// such a name).
bool IsSiblingName(std::string_view name, std::string_view target);

// Removes the leftovers in directory `parent` of every target whose name satisfies
// `is_target`, if no other writer works in `parent` now. Returns how many were removed.
std::size_t CleanLeftovers(const fs::path& parent, const std::function<bool(std::string_view)>& is_target);

}  // namespace ckpt::storage
