// checkpoint/commit.cc
#include "checkpoint/commit.h"

#include <chrono>
#include <cstdio>
#include <ctime>

#include "ckpt/config.h"
#include "format/names.h"
#include "storage/commit.h"
#include "storage/fs.h"

namespace ckpt::internal {

std::string ShardFileName(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-of-%05d.h5", index, count);
  return buf;
}

void CheckTarget(const fs::path& dir, bool overwrite) {
  std::error_code ec;
  const auto status = fs::symlink_status(dir, ec);
  if (!fs::exists(status)) {
    storage::MakeDirs(dir.parent_path());
    return;
  }
  if (!fs::is_directory(status)) {
    throw Error(ErrorCode::kAlreadyExists, dir.string() + ": exists and is not a directory");
  }
  if (fs::is_empty(dir, ec)) return;
  const bool committed = fs::exists(dir / names::kMetadataFile, ec);
  if (!committed) {
    throw Error(ErrorCode::kAlreadyExists,
                dir.string() + ": exists and is neither empty nor a checkpoint; refusing to replace it");
  }
  if (!overwrite) {
    throw Error(ErrorCode::kAlreadyExists,
                dir.string() + ": a checkpoint is already there (pass overwrite to replace it)");
  }
}

fs::path MakeStagingDir(const fs::path& dir, bool overwrite) {
  CheckTarget(dir, overwrite);  // before anything is made beside it
  const fs::path staging = storage::BeginStaging(dir, /*directory=*/true);
  try {
    CheckTarget(dir, overwrite);
  } catch (...) {
    storage::DiscardStaged(staging);
    throw;
  }
  return staging;
}

void StampMetadata(Metadata& m) {
  m.library_version = CKPT_VERSION_STRING;
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  m.created = buf;
}

void CommitStaging(const fs::path& staging, const fs::path& dir, const Metadata& m) {
  storage::WriteFileSynced(staging / names::kMetadataFile, SerializeMetadata(m));
  storage::FsyncPath(staging);
  // Replaces only what CheckTarget accepted when the staging began: nothing, an empty
  // directory, or (with overwrite) the checkpoint that was there.
  storage::CommitStaged(staging, dir, storage::Replace::kExpected);
}

std::string DescribeCurrentException() {
  try {
    throw;
  } catch (const Error& e) {
    return std::to_string(static_cast<int>(e.code())) + "\t" + e.what();
  } catch (const std::bad_alloc&) {
    return std::to_string(static_cast<int>(ErrorCode::kInternal)) + "\tout of memory";
  } catch (const std::exception& e) {
    return std::to_string(static_cast<int>(ErrorCode::kIO)) + "\t" + e.what();
  } catch (...) {
    return std::to_string(static_cast<int>(ErrorCode::kInternal)) + "\tunknown exception";
  }
}

void AgreeOrThrow(Comm& comm, const std::string& my_failure, bool name_ranks) {
  std::vector<ByteBuffer> all;
  if (comm.size() == 1) {
    all.emplace_back(my_failure.begin(), my_failure.end());
  } else {
    all = comm.AllGather({reinterpret_cast<const uint8_t*>(my_failure.data()), my_failure.size()});
  }
  std::optional<ErrorCode> code;
  std::string message;
  for (std::size_t r = 0; r < all.size(); ++r) {
    if (all[r].empty()) continue;
    const std::string s(all[r].begin(), all[r].end());
    const auto tab = s.find('\t');
    const ErrorCode c = static_cast<ErrorCode>(std::stoi(s.substr(0, tab)));
    const std::string text = s.substr(tab + 1);
    // Ranks that only saw another rank fail add nothing.
    if (c == ErrorCode::kComm && all.size() > 1 && code) continue;
    if (!code || *code == ErrorCode::kComm) code = c;
    if (!message.empty()) message += "\n";
    message += all.size() > 1 && name_ranks ? "rank " + std::to_string(r) + ": " + text : text;
  }
  if (code) throw Error(*code, message);
}

}  // namespace ckpt::internal
