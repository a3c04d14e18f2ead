// tests/fault/fault_util.h: the checkpoints the fault and concurrency tests write: a
// 4-rank save whose every value tells which version it belongs to.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/ckpt.h"
#include "ckpt/ops/verify.h"

namespace ckpt_test {

using namespace ckpt;
namespace fs = std::filesystem;

constexpr int64_t kRows = 24, kCols = 8;

inline float Value(int version, int64_t i) { return static_cast<float>(version * 1000 + i); }

// A 4-rank save of row shards plus a replicated bias, all values from `version`; with
// `async`, through SaveAsync (the caller's buffers freed before the write) and Wait.
inline void SaveVersion(const fs::path& dir, int version, bool overwrite, bool async = false) {
  RunThreads(4, [&](Comm& comm) {
    const int64_t per = kRows / 4, begin = per * comm.rank();
    std::vector<float> w(static_cast<std::size_t>(per * kCols)), b(kCols);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = Value(version, begin * kCols + static_cast<int64_t>(i));
    for (int64_t i = 0; i < kCols; ++i) b[i] = Value(version, -i);
    StateDict sd;
    sd.Add("w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 0, begin, per, w.data()));
    sd.Add("b", Tensor::Full(DType::kFloat32, {kCols}, b.data()));
    sd.Add("version", Scalar::Int(version));
    AsyncSaveOptions o;
    o.overwrite = overwrite;
    if (!async) return Save(dir, sd, comm, o);
    const SaveHandle h = SaveAsync(dir, sd, comm, o);
    std::vector<float>().swap(w);
    h.Wait();
  });
}

// The version a checkpoint holds, after checking every value is that version's (a
// torn or half-written checkpoint fails here).
inline int VersionOf(const fs::path& dir) {
  auto r = CheckpointReader::Open(dir);
  std::vector<float> w(kRows * kCols), b(kCols);
  r->ReadRegion("w", Box::Full({kRows, kCols}), w.data(), true);
  r->ReadRegion("b", Box::Full({kCols}), b.data(), true);
  const int v = static_cast<int>(w[0] / 1000);
  for (std::size_t i = 0; i < w.size(); ++i) REQUIRE(w[i] == Value(v, static_cast<int64_t>(i)));
  for (int64_t i = 0; i < kCols; ++i) REQUIRE(b[i] == Value(v, -i));
  REQUIRE(ckpt::ops::Verify(dir, {}).ok());
  return v;
}

// Names in `dir` that are ckpt staging or aside siblings (what a failed or killed call could
// leave behind).
inline std::vector<std::string> Leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.find(".ckpt-") != std::string::npos) out.push_back(n);
  }
  return out;
}

}  // namespace ckpt_test
