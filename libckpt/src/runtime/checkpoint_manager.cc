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

bool IsCommitted(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / kMetadataFileName, ec);
}
}  // namespace

CheckpointManager::CheckpointManager(Accelerator& accel, fs::path root, int keep_last)
    : accel_(&accel), root_(std::move(root)), keep_last_(std::max(keep_last, 1)) {}

fs::path CheckpointManager::DirFor(const fs::path& root, int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return root / buf;
}

std::vector<std::pair<int64_t, fs::path>> CheckpointManager::Committed() const {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return out;
  for (const auto& e : fs::directory_iterator(root_, ec)) {
    const auto step = StepOf(e.path());
    if (step && e.is_directory() && IsCommitted(e.path())) out.emplace_back(*step, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::pair<int64_t, fs::path>> CheckpointManager::Latest() const {
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

fs::path CheckpointManager::Save(int64_t step, const SaveStateOptions& options) {
  Comm& comm = accel_->world();
  const fs::path dir = DirFor(root_, step);
  std::string error;
  if (comm.rank() == 0) {
    try {
      files::MakeDirs(root_);
      // Leftovers of saves and prunings that were killed, whatever their step.
      files::CleanLeftovers(root_, [](std::string_view t) { return StepOfName(t) || t == kLatest; });
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (!comm.AllOk(error.empty())) throw Error(ErrorCode::kIO, "checkpoint manager: cannot create " + root_.string() + (error.empty() ? "" : ": " + error));
  SaveStateOptions so = options;
  so.overwrite = true;  // a re-run of the same step replaces it atomically
  accel_->SaveState(dir, so);
  if (comm.rank() == 0) {
    try {
      files::CommitFile(root_ / kLatest, dir.filename().string() + "\n");
      // Each pruned step is un-committed (renamed away, parent fsynced) before its files go.
      auto all = Committed();
      for (std::size_t i = 0; i + static_cast<std::size_t>(keep_last_) < all.size(); ++i)
        files::RemoveCheckpoint(all[i].second);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::string agreed = comm.AgreeOnErrors(error);
  if (!agreed.empty()) throw Error(ErrorCode::kIO, agreed);
  return dir;
}

std::optional<int64_t> CheckpointManager::Resume(const LoadStateOptions& options) {
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
  accel_->LoadState(s.substr(nl + 1), options);
  return step;
}

}  // namespace ckpt::runtime
