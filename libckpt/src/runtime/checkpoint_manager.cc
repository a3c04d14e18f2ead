// Checkpoint manager: step directories, the "latest" marker, pruning and resume.
#include "ckpt/runtime/checkpoint_manager.h"

#include <algorithm>
#include <cstdio>

#include "ckpt/error.h"
#include "ckpt/files.h"

namespace ckpt::runtime {
namespace fs = std::filesystem;

namespace {
constexpr const char* kLatest = "latest";

std::optional<int64_t> StepOfName(std::string_view name) {
  if (name.size() != 13 || name.compare(0, 5, "step-") != 0) return std::nullopt;
  int64_t step = 0;
  for (std::size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

std::optional<int64_t> StepOf(const fs::path& dir) { return StepOfName(dir.filename().string()); }

bool IsObjectRoot(const fs::path& root) { return root.native().rfind("s3://", 0) == 0; }

bool IsCommitted(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kMetadataFileName, ec);
}

// Committed checkpoints under `root`, oldest first (by step).
std::vector<std::pair<int64_t, fs::path>> CommittedIn(const fs::path& root, const ObjectStoreOptions& s3) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (IsObjectRoot(root)) {
    for (const std::string& name : files::ListObjectCheckpoints(root.string(), s3)) {
      if (const auto step = StepOfName(name)) out.emplace_back(*step, root / name);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto step = StepOf(e.path());
    if (step && e.is_directory() && IsCommitted(e.path())) out.emplace_back(*step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

CheckpointManager::CheckpointManager(Accelerator& accel, fs::path root, int keep_last, ObjectStoreOptions s3)
    : accel_(&accel), root_(std::move(root)), keep_last_(std::max(keep_last, 1)), s3_(std::move(s3)) {}

fs::path CheckpointManager::DirFor(const fs::path& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return root / buf;
}

std::vector<std::pair<int64_t, fs::path>> CheckpointManager::Committed() const { return CommittedIn(root_, s3_); }

std::optional<std::pair<int64_t, fs::path>> CheckpointManager::Latest() const {
  if (IsObjectRoot(root_)) {  // the newest committed step: no marker to keep in step
    auto all = Committed();
    if (all.empty()) return std::nullopt;
    return all.back();
  }
  std::string name;
  try {
    name = files::ReadSmallFile(root_ / kLatest, 4096);
  } catch (const Error&) {
    name.clear();  // missing or unreadable: fall back to the directories
  }
  name = name.substr(0, name.find('\n'));
  if (!name.empty()) {
    const fs::path dir = root_ / name;
    const auto step = StepOf(dir);
    if (step && IsCommitted(dir)) return std::make_pair(*step, dir);
  }
  auto all = Committed();  // the marker is missing or names an incomplete directory
  if (all.empty()) return std::nullopt;
  return all.back();
}

namespace {

// After `dir` committed, on every rank of `comm`: rank 0 points `latest` at it and prunes
// beyond `keep` (each pruned step un-committed before its files go); agreed.
void MarkLatestAndPrune(Comm& comm, const fs::path& root, const fs::path& dir, int keep, const ObjectStoreOptions& s3) {
  std::string error;
  if (comm.rank() == 0) {
    try {
      const bool object = IsObjectRoot(root);
      if (!object) files::CommitFile(root / kLatest, dir.filename().string() + "\n");
      auto all = CommittedIn(root, s3);
      for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < all.size(); ++i) {
        if (object) {
          files::RemoveObjectCheckpoint(all[i].second.string(), s3);
        } else {
          files::RemoveCheckpoint(all[i].second);
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::string agreed = comm.AgreeOnErrors(error);
  if (!agreed.empty()) throw Error(ErrorCode::kIO, agreed);
}

}  // namespace

CheckpointManager::~CheckpointManager() {
  // A failure stays pending for the world Comm's next SaveAsync (ckpt/checkpoint.h).
  if (in_flight_.valid()) in_flight_.WaitQuietly();
}

void CheckpointManager::Wait() {
  if (!in_flight_.valid()) return;
  const SaveHandle h = in_flight_;
  in_flight_ = SaveHandle();
  h.Wait();
}

void CheckpointManager::PrepareRoot() {
  Comm& comm = accel_->world();
  std::string error;
  if (comm.rank() == 0) {
    try {
      if (IsObjectRoot(root_)) {
        // Leftovers of saves that lost, failed or were killed, past their grace period.
        files::CleanObjectLeftovers(root_.string(), s3_);
      } else {
        files::MakeDirs(root_);
        // Leftovers of saves and prunings that were killed, whatever their step.
        files::CleanLeftovers(root_, [](std::string_view t) { return StepOfName(t) || t == kLatest; });
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!comm.AllOk(error.empty())) throw Error(ErrorCode::kIO, "checkpoint manager: cannot create " + root_.string() + (error.empty() ? "" : ": " + error));
}

fs::path CheckpointManager::Save(int64_t step, const SaveStateOptions& options) {
  Wait();
  PrepareRoot();
  const fs::path dir = DirFor(root_, step);
  SaveStateOptions so = options;
  so.overwrite = true;  // a re-run of the same step replaces it atomically
  if (IsObjectRoot(root_)) so.s3 = s3_;
  accel_->SaveState(dir, so);
  MarkLatestAndPrune(accel_->world(), root_, dir, keep_last_, s3_);
  return dir;
}

SaveHandle CheckpointManager::SaveAsync(int64_t step, const SaveStateOptions& options) {
  Wait();  // rotation and the leftover cleanup wait for the save in flight
  PrepareRoot();
  const fs::path dir = DirFor(root_, step);
  SaveStateOptions so = options;
  so.overwrite = true;
  if (IsObjectRoot(root_)) so.s3 = s3_;
  in_flight_ = accel_->SaveStateAsync(dir, so, [root = root_, dir, keep = keep_last_, s3 = s3_](Comm& background) {
    MarkLatestAndPrune(background, root, dir, keep, s3);
  });
  return in_flight_;
}

std::optional<int64_t> CheckpointManager::Resume(const LoadStateOptions& options) {
  Wait();
  Comm& comm = accel_->world();
  ByteBuffer choice;
  if (comm.rank() == 0) {
    if (auto latest = Latest()) {
      const std::string s = std::to_string(latest->first) + "\n" + latest->second.string();
      choice.assign(s.begin(), s.end());
    }
  }
  comm.Broadcast(choice, 0);
  if (choice.empty()) return std::nullopt;
  const std::string s(choice.begin(), choice.end());
  const auto nl = s.find('\n');
  const int64_t step = std::stoll(s.substr(0, nl));
  LoadStateOptions lo = options;
  if (IsObjectRoot(root_)) lo.s3 = s3_;
  accel_->LoadState(s.substr(nl + 1), lo);
  return step;
}

}  // namespace ckpt::runtime
