// layout/box.cc
#include "layout/box.h"

#include <algorithm>
#include <numeric>

#include "ckpt/metadata.h"
#include "format/checked.h"

namespace ckpt::layout {

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.sizes.size() != b.sizes.size() || a.offsets.size() != a.sizes.size() || b.offsets.size() != b.sizes.size()) {
    return std::nullopt;
  }
  Box r;
  r.offsets.resize(a.sizes.size());
  r.sizes.resize(a.sizes.size());
  for (std::size_t d = 0; d < a.sizes.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return std::nullopt;
    r.offsets[d] = lo;
    r.sizes[d] = hi - lo;
  }
  return r;
}

bool Contains(const Box& outer, const Box& inner) {
  if (outer.sizes.size() != inner.sizes.size() || outer.offsets.size() != outer.sizes.size() ||
      inner.offsets.size() != inner.sizes.size()) {
    return false;
  }
  for (std::size_t d = 0; d < outer.sizes.size(); ++d) {
    if (inner.offsets[d] < outer.offsets[d] ||
        inner.offsets[d] + inner.sizes[d] > outer.offsets[d] + outer.sizes[d]) {
      return false;
    }
  }
  return true;
}

bool Overlaps(const Box& a, const Box& b) { return Intersect(a, b).has_value(); }

namespace {

// The plan shared by ForEachRun and CountRuns: dims [0, outer) are iterated, dims
// [outer, rank) form one run of run_len elements.
struct RunPlan {
  std::size_t outer = 0;
  int64_t run_len = 1;
  std::vector<int64_t> src_stride, dst_stride;
};

RunPlan PlanRuns(const Box& src_box, const Box& dst_box, const Box& region) {
  const std::size_t rank = region.sizes.size();
  RunPlan p;
  p.src_stride.assign(rank, 1);
  p.dst_stride.assign(rank, 1);
  for (std::size_t d = rank; d-- > 1;) {
    p.src_stride[d - 1] = p.src_stride[d] * src_box.sizes[d];
    p.dst_stride[d - 1] = p.dst_stride[d] * dst_box.sizes[d];
  }
  // Merge trailing dims: dim d joins the run if every dim after it is whole in region,
  // src and dst (so the elements are consecutive in both).
  p.outer = rank;
  p.run_len = 1;
  while (p.outer > 0) {
    const std::size_t d = p.outer - 1;
    p.run_len *= region.sizes[d];
    p.outer = d;
    const bool whole = region.sizes[d] == src_box.sizes[d] && region.sizes[d] == dst_box.sizes[d];
    if (!whole) break;
  }
  return p;
}

}  // namespace

void ForEachRun(const Box& src_box, const Box& dst_box, const Box& region,
                const std::function<void(const Run&)>& fn) {
  const std::size_t rank = region.sizes.size();
  for (int64_t s : region.sizes) {
    if (s == 0) return;
  }
  const RunPlan p = PlanRuns(src_box, dst_box, region);
  int64_t src0 = 0, dst0 = 0;
  for (std::size_t d = 0; d < rank; ++d) {
    src0 += (region.offsets[d] - src_box.offsets[d]) * p.src_stride[d];
    dst0 += (region.offsets[d] - dst_box.offsets[d]) * p.dst_stride[d];
  }
  std::vector<int64_t> idx(p.outer, 0);
  while (true) {
    int64_t s = src0, t = dst0;
    for (std::size_t d = 0; d < p.outer; ++d) {
      s += idx[d] * p.src_stride[d];
      t += idx[d] * p.dst_stride[d];
    }
    fn(Run{s, t, p.run_len});
    std::size_t d = p.outer;
    while (d > 0) {
      --d;
      if (++idx[d] < region.sizes[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (p.outer == 0) return;
  }
}

int64_t CountRuns(const Box& src_box, const Box& dst_box, const Box& region) {
  for (int64_t s : region.sizes) {
    if (s == 0) return 0;
  }
  const RunPlan p = PlanRuns(src_box, dst_box, region);
  int64_t n = 1;
  for (std::size_t d = 0; d < p.outer; ++d) n *= region.sizes[d];
  return n;
}

std::vector<std::string> TilingProblems(const Shape& shape, const std::vector<Box>& boxes) {
  std::vector<std::string> problems;
  const Box whole = Box::Full(shape);
  std::vector<std::size_t> valid;
  for (std::size_t i = 0; i < boxes.size(); ++i) {
    const Box& b = boxes[i];
    if (b.offsets.size() != shape.size() || b.sizes.size() != shape.size()) {
      problems.push_back("chunk " + b.ToString() + " has rank " + std::to_string(b.sizes.size()) +
                         ", the tensor has rank " + std::to_string(shape.size()));
      continue;
    }
    bool in_bounds = true;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (b.offsets[d] < 0 || b.sizes[d] < 0 || b.offsets[d] > shape[d] || b.sizes[d] > shape[d] - b.offsets[d]) {
        in_bounds = false;
      }
    }
    if (!in_bounds) {
      problems.push_back("chunk " + b.ToString() + " lies outside the tensor " + whole.ToString());
      continue;
    }
    valid.push_back(i);
  }
  // Overlaps: sort by the first dimension's start and compare only boxes whose first
  // dimension ranges meet.
  std::sort(valid.begin(), valid.end(), [&](std::size_t a, std::size_t b) {
    if (shape.empty()) return a < b;
    return boxes[a].offsets[0] < boxes[b].offsets[0];
  });
  bool overlap = false;
  for (std::size_t i = 0; i < valid.size(); ++i) {
    const Box& a = boxes[valid[i]];
    if (a.NumElements() == 0) continue;
    for (std::size_t j = i + 1; j < valid.size(); ++j) {
      const Box& b = boxes[valid[j]];
      if (!shape.empty() && b.offsets[0] >= a.offsets[0] + a.sizes[0]) break;
      if (Overlaps(a, b)) {
        problems.push_back("chunks " + a.ToString() + " and " + b.ToString() + " overlap");
        overlap = true;
      }
    }
  }
  if (!overlap) {
    int64_t covered = 0;
    for (std::size_t i : valid) covered = internal::CheckedAdd(covered, boxes[i].NumElements(), "tiling");
    const int64_t total = NumElements(shape);
    if (covered != total) {
      problems.push_back("chunks cover " + std::to_string(covered) + " of " + std::to_string(total) +
                         " elements of " + whole.ToString() + " (a gap)");
    }
  }
  return problems;
}

}  // namespace ckpt::layout

namespace ckpt {

std::vector<std::string> CheckTiling(std::string_view key, const EntryMeta& entry) {
  std::vector<Box> boxes;
  boxes.reserve(entry.chunks.size());
  for (const ChunkMeta& c : entry.chunks) boxes.push_back(c.box);
  std::vector<std::string> problems = layout::TilingProblems(entry.shape, boxes);
  for (std::string& p : problems) p = "tensor '" + std::string(key) + "': " + p;
  return problems;
}

}  // namespace ckpt
