// ckpt/ops/diff.h: ckpt-diff as a library call. Compares the logical contents of two
// sources whatever their sharding or format (a 4-rank checkpoint and its merged
// safetensors file are the same): keys only in one side (with likely renames: a key
// only in A and one only in B with equal dtype, shape and values), kind / dtype / shape
// changes, and per-tensor value differences. Streams both sides block by block.
//
// Thread-safety: Diff is reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "ckpt/tensor.h"

namespace ckpt::ops {

struct DiffOptions {
  // |a - b| <= atol + rtol * |b| counts as equal. Without a tolerance, elements with
  // identical stored bits are equal (a NaN included) and others compare as numbers.
  double atol = 0, rtol = 0;
  // NaN equals any NaN: of other bits, and under a tolerance (where a NaN otherwise
  // differs even from the same bits, as in IEEE comparison).
  bool nan_equal = false;
  bool keys_only = false;     // layout only: keys, kinds, dtypes, shapes
  std::vector<std::string> exclude;
  uint64_t max_memory = uint64_t{1} << 30;
  // Threads comparing tensor values, each reading its own pair of sources (within
  // max_memory together). 0: up to 4 (and the cores there are) once there is more than
  // 64 MiB to compare.
  int threads = 0;
  bool progress = false;
};

struct KeyDiff {
  // "only_in_a", "only_in_b", "renamed", "kind", "dtype", "shape", "values"
  std::string what;
  std::string key;
  std::string other_key;    // renamed: the key in B
  std::string a, b;         // kind / dtype / shape / scalar value on each side, as text
  double max_abs = 0, max_rel = 0;  // values
  uint64_t num_different = 0, num_elements = 0;
  uint64_t num_nan = 0;  // of num_different: elements where a NaN is involved
};

struct DiffReport {
  std::string a, b;
  std::vector<KeyDiff> diffs;
  std::size_t compared = 0;  // keys present on both sides
  uint64_t bytes_compared = 0;
  double seconds = 0;
  std::vector<std::string> notes;
  bool same() const { return diffs.empty(); }
};

// Throws only when a side cannot be opened or read (errors name file and key).
CKPT_API DiffReport Diff(const std::filesystem::path& a, const std::filesystem::path& b, const DiffOptions& options);

CKPT_API std::string RenderDiffText(const DiffReport& report);
CKPT_API std::string RenderDiffJson(const DiffReport& report);

}  // namespace ckpt::ops
