// checkpoint/commit.h: the commit protocol shared by Save and CheckpointWriter
// (FORMAT.md §2): check the target, stage into a sibling temp dir, write metadata.json
// last, rename into place.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "ckpt/comm.h"
#include "ckpt/error.h"
#include "ckpt/metadata.h"

namespace ckpt::internal {

namespace fs = std::filesystem;

// "shard-00003-of-00008.h5"
std::string ShardFileName(int index, int count);

// Throws kAlreadyExists unless `dir` is absent, an empty directory, or (with overwrite)
// a committed checkpoint. Creates the parent directory if needed.
void CheckTarget(const fs::path& dir, bool overwrite);
// Checks the target (CheckTarget), creates and returns a fresh staging directory beside
// `dir` (storage::BeginStaging: leftovers of killed saves to `dir` are removed first), then
// checks the target again (on failure the staging is discarded): the commit replaces only
// what was at `dir` when the staging began, so a checkpoint another writer committed between
// the first check and the staging would otherwise count as the one this writer checked, and
// two saves without overwrite to one new path could both win.
fs::path MakeStagingDir(const fs::path& dir, bool overwrite);
// Fills library_version and created.
void StampMetadata(Metadata& m);
// Writes metadata.json into `staging`, fsyncs, and commits `staging` at `dir`
// (storage::CommitStaged with Replace::kExpected: RENAME_NOREPLACE onto a free path, so
// of two saves to one new path only one commits; an atomic exchange with what was there
// when the staging began, which is removed once the parent is fsynced). Any failure
// leaves `dir` as it was.
void CommitStaging(const fs::path& staging, const fs::path& dir, const Metadata& m);

// Turns the exception in flight into a description "code\tmessage" (empty if none).
std::string DescribeCurrentException();
// COLLECTIVE. Every rank passes its own failure description (or ""); if any rank failed,
// every rank throws one Error carrying the first failure's code and all messages, each
// prefixed with its rank unless `name_ranks` is false (for checks rank 0 makes for all).
void AgreeOrThrow(Comm& comm, const std::string& my_failure, bool name_ranks = true);

// Runs fn, catching any exception into a description; then agrees across ranks.
template <typename Fn>
void Phase(Comm& comm, Fn&& fn, bool name_ranks = true) {
  std::string failure;
  try {
    fn();
  } catch (...) {
    failure = DescribeCurrentException();
  }
  AgreeOrThrow(comm, failure, name_ranks);
}

}  // namespace ckpt::internal
