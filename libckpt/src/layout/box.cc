// layout/box.cc
#include "layout/box.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>
#include <numeric>
#include <string>

#include "ckpt/metadata.h"

// The public geometry (ckpt/tensor.h).
namespace ckpt {

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

bool Overlaps(const Box& a, const Box& b) {  // Intersect without building the box
  if (a.sizes.size() != b.sizes.size() || a.offsets.size() != a.sizes.size() || b.offsets.size() != b.sizes.size())
    return false;
  for (std::size_t d = 0; d < a.sizes.size(); ++d)
    if (std::max(a.offsets[d], b.offsets[d]) >= std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]))
      return false;
  return true;
}

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
                const std::function<void(const BoxRun&)>& fn) {
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
    fn(BoxRun{s, t, p.run_len});
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

std::vector<Box> SplitBox(const Box& box, std::size_t itemsize, uint64_t max_bytes) {
  const std::size_t rank = box.sizes.size();
  uint64_t total = itemsize;
  for (int64_t s : box.sizes) total *= static_cast<uint64_t>(s);
  if (rank == 0 || total <= max_bytes || total == 0) return {box};
  // Find the outermost dim d whose slab (one index along d, all of the dims after it)
  // fits in max_bytes; cut along d, iterating single indices over the dims before it.
  std::vector<uint64_t> slab(rank);
  uint64_t s = itemsize;
  for (std::size_t d = rank; d-- > 0;) {
    slab[d] = s;
    s *= static_cast<uint64_t>(box.sizes[d]);
  }
  std::size_t d = 0;
  while (d + 1 < rank && slab[d] > max_bytes) ++d;
  const int64_t per = static_cast<int64_t>(std::max<uint64_t>(1, max_bytes / slab[d]));
  std::vector<Box> out;
  std::vector<int64_t> idx(d, 0);
  for (;;) {
    for (int64_t b = 0; b < box.sizes[d]; b += per) {
      Box piece = box;
      for (std::size_t o = 0; o < d; ++o) {
        piece.offsets[o] = box.offsets[o] + idx[o];
        piece.sizes[o] = 1;
      }
      piece.offsets[d] = box.offsets[d] + b;
      piece.sizes[d] = std::min(per, box.sizes[d] - b);
      out.push_back(std::move(piece));
    }
    std::size_t o = d;
    bool done = true;
    while (o > 0) {
      --o;
      if (++idx[o] < box.sizes[o]) {
        done = false;
        break;
      }
      idx[o] = 0;
    }
    if (done) break;
  }
  return out;
}

}  // namespace ckpt

namespace ckpt::layout {

namespace {

constexpr std::size_t kMaxReports = 20;        // of each kind of tiling problem
constexpr uint64_t kCornerBudget = 1u << 24;   // corners the exact check may sort
constexpr uint64_t kPairBudget = 1u << 24;     // box pairs the overlap search may compare

bool Disjoint(const Box& a, const Box& b) {
  for (std::size_t d = 0; d < a.sizes.size(); ++d)
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) return true;
  return false;
}

// Whether the boxes (in bounds, non-empty, over dims `dims`) cover `shape` exactly once,
// decided in O(n 2^k log n) for k = dims.size(): a box's indicator is the signed sum of the
// orthants at its 2^k corners, and that expansion is unique, so the boxes' coverage counts
// equal the whole tensor's indicator if and only if their signed corner sums equal the
// tensor's own. The corners are sorted, not hashed: (k + 1) x 8 bytes each, about the size
// of the chunks' own JSON for the usual k <= 3. nullopt when there would be more than
// kCornerBudget corners.
std::optional<bool> ExactCover(const Shape& shape, const std::vector<const Box*>& boxes,
                               const std::vector<std::size_t>& dims) {
  const std::size_t k = dims.size();
  if (k >= 32 || (boxes.size() + 1) > (kCornerBudget >> k)) return std::nullopt;
  const std::size_t rec = k + 1;  // k coordinates, then the sign
  const std::size_t corners = (boxes.size() + 1) << k;
  std::vector<int64_t> flat;
  flat.reserve(corners * rec);
  auto add = [&](const int64_t* lo, const int64_t* hi, int64_t sign) {
    for (uint64_t mask = 0; mask < (uint64_t{1} << k); ++mask) {
      int64_t s = sign;
      for (std::size_t i = 0; i < k; ++i) {
        const bool upper = (mask >> i) & 1;
        flat.push_back(upper ? hi[i] : lo[i]);
        if (upper) s = -s;
      }
      flat.push_back(s);
    }
  };
  std::vector<int64_t> lo(k), hi(k);
  for (const Box* b : boxes) {
    for (std::size_t i = 0; i < k; ++i) {
      lo[i] = b->offsets[dims[i]];
      hi[i] = b->offsets[dims[i]] + b->sizes[dims[i]];
    }
    add(lo.data(), hi.data(), 1);
  }
  for (std::size_t i = 0; i < k; ++i) lo[i] = 0, hi[i] = shape[dims[i]];
  add(lo.data(), hi.data(), -1);
  std::vector<uint32_t> order(corners);
  for (std::size_t i = 0; i < corners; ++i) order[i] = static_cast<uint32_t>(i);
  const auto at = [&](uint32_t i) { return flat.data() + static_cast<std::size_t>(i) * rec; };
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return std::lexicographical_compare(at(a), at(a) + k, at(b), at(b) + k);
  });
  for (std::size_t i = 0; i < corners;) {
    int64_t sum = 0;
    std::size_t j = i;
    for (; j < corners && std::equal(at(order[i]), at(order[i]) + k, at(order[j])); ++j) sum += at(order[j])[k];
    if (sum != 0) return false;
    i = j;
  }
  return true;
}

// The boxes of the tensor's rank that lie inside it and hold an element; each box of the
// wrong rank or outside is a problem (the first kMaxReports of each kind, then a count).
std::vector<const Box*> BoxesInside(const Shape& shape, const std::vector<Box>& boxes,
                                    std::vector<std::string>& problems) {
  const Box whole = Box::Full(shape);
  std::size_t bad_rank = 0, outside = 0;
  std::vector<const Box*> valid;
  for (const Box& b : boxes) {
    if (b.offsets.size() != shape.size() || b.sizes.size() != shape.size()) {
      if (bad_rank++ < kMaxReports)
        problems.push_back("chunk " + b.ToString() + " has rank " + std::to_string(b.sizes.size()) +
                           ", the tensor has rank " + std::to_string(shape.size()));
      continue;
    }
    bool in_bounds = true;
    bool empty = false;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (b.offsets[d] < 0 || b.sizes[d] < 0 || b.offsets[d] > shape[d] || b.sizes[d] > shape[d] - b.offsets[d]) {
        in_bounds = false;
      }
      empty = empty || b.sizes[d] == 0;
    }
    if (!in_bounds) {
      if (outside++ < kMaxReports)
        problems.push_back("chunk " + b.ToString() + " lies outside the tensor " + whole.ToString());
      continue;
    }
    if (!empty) valid.push_back(&b);
  }
  if (bad_rank > kMaxReports)
    problems.push_back("... and " + std::to_string(bad_rank - kMaxReports) + " more chunks of the wrong rank");
  if (outside > kMaxReports)
    problems.push_back("... and " + std::to_string(outside - kMaxReports) + " more chunks outside the tensor");
  return valid;
}

// `valid` sorted, each box once; a box listed more than once is a problem, reported once
// with its count. `duplicated` receives how many boxes were.
std::vector<const Box*> WithoutDuplicates(std::vector<const Box*> valid, std::vector<std::string>& problems,
                                          std::size_t& duplicated) {
  const auto less = [](const Box* a, const Box* b) {
    return a->offsets != b->offsets ? a->offsets < b->offsets : a->sizes < b->sizes;
  };
  std::sort(valid.begin(), valid.end(), less);
  std::vector<const Box*> unique;
  duplicated = 0;
  for (std::size_t i = 0; i < valid.size();) {
    std::size_t j = i + 1;
    while (j < valid.size() && *valid[j] == *valid[i]) ++j;
    if (j - i > 1 && duplicated++ < kMaxReports)
      problems.push_back("chunk " + valid[i]->ToString() + " is listed " + std::to_string(j - i) +
                         " times (its copies overlap)");
    unique.push_back(valid[i]);
    i = j;
  }
  if (duplicated > kMaxReports)
    problems.push_back("... and " + std::to_string(duplicated - kMaxReports) + " more chunks listed more than once");
  return unique;
}

// The elements the boxes hold together, saturating: more than the tensor is an overlap anyway.
uint64_t CoveredElements(const std::vector<const Box*>& boxes) {
  uint64_t covered = 0;
  for (const Box* b : boxes) {
    const auto n = static_cast<uint64_t>(b->NumElements());
    covered = n > UINT64_MAX - covered ? UINT64_MAX : covered + n;
  }
  return covered;
}

// The dims some box does not span whole: the others do not change the coverage.
std::vector<std::size_t> PartlySpannedDims(const Shape& shape, const std::vector<const Box*>& boxes) {
  std::vector<std::size_t> dims;
  for (std::size_t d = 0; d < shape.size(); ++d)
    for (const Box* b : boxes)
      if (b->offsets[d] != 0 || b->sizes[d] != shape[d]) {
        dims.push_back(d);
        break;
      }
  return dims;
}

// Of `dims`, the one along which the boxes have the most distinct offsets (0 if none).
std::size_t SweepDim(const std::vector<const Box*>& boxes, const std::vector<std::size_t>& dims) {
  std::size_t sweep = 0, most = 0;
  for (const std::size_t d : dims) {
    std::vector<int64_t> offs;
    offs.reserve(boxes.size());
    for (const Box* b : boxes) offs.push_back(b->offsets[d]);
    std::sort(offs.begin(), offs.end());
    const auto distinct = static_cast<std::size_t>(std::unique(offs.begin(), offs.end()) - offs.begin());
    if (distinct > most) most = distinct, sweep = d;
  }
  return sweep;
}

// Overlapping pairs of the (distinct) boxes, found by a sweep along SweepDim within
// kPairBudget comparisons, reported up to kMaxReports. Returns how many were reported;
// `complete` is false where the budget ran out first.
std::size_t ReportOverlaps(const Shape& shape, const std::vector<const Box*>& unique,
                           const std::vector<std::size_t>& dims, std::vector<std::string>& problems, bool& complete) {
  const std::size_t sweep = SweepDim(unique, dims);
  std::vector<const Box*> order = unique;
  if (!shape.empty())
    std::stable_sort(order.begin(), order.end(),
                     [&](const Box* a, const Box* b) { return a->offsets[sweep] < b->offsets[sweep]; });
  std::size_t overlaps = 0;
  uint64_t budget = kPairBudget;
  complete = true;
  for (std::size_t i = 0; i < order.size() && complete && overlaps < kMaxReports; ++i) {
    const Box& a = *order[i];
    for (std::size_t j = i + 1; j < order.size(); ++j) {
      const Box& b = *order[j];
      if (!shape.empty() && b.offsets[sweep] >= a.offsets[sweep] + a.sizes[sweep]) break;
      if (budget-- == 0) {
        complete = false;
        break;
      }
      if (!Disjoint(a, b)) {
        problems.push_back("chunks " + a.ToString() + " and " + b.ToString() + " overlap");
        if (++overlaps == kMaxReports) {
          problems.push_back("... (more overlapping chunks not listed)");
          break;
        }
      }
    }
  }
  return overlaps;
}

// Where no overlap was found: the volume tells a gap; pairwise disjoint and of the full
// volume is an exact tiling (unless the overlap search did not complete).
void ReportCoverage(const Shape& shape, std::size_t boxes, uint64_t covered, bool complete,
                    std::vector<std::string>& problems) {
  const Box whole = Box::Full(shape);
  const auto total = static_cast<uint64_t>(NumElements(shape));
  if (covered < total) {
    problems.push_back("chunks cover " + std::to_string(covered) + " of " + std::to_string(total) +
                       " elements of " + whole.ToString() + " (a gap)");
  } else if (covered > total) {
    problems.push_back("chunks cover " + std::to_string(covered) + " elements of " + whole.ToString() +
                       ", which has " + std::to_string(total) + ": some overlap (too many chunks to name them)");
  } else if (!complete) {
    problems.push_back(std::to_string(boxes) + " chunks may not tile " + whole.ToString() +
                       " exactly: too many chunks, in too many dimensions, to check");
  }
}

}  // namespace

// Linear or n log n in the number of boxes on every input (no pairwise comparison of all
// boxes, no report per pair): rank and bounds box by box; exact duplicates by sorting,
// each reported once with its count; then the exact-cover check above. Only when that
// fails (or cannot run) are overlapping pairs searched for, by a sweep along the dimension
// with the most distinct offsets, within kPairBudget comparisons and kMaxReports reports.
std::vector<std::string> TilingProblems(const Shape& shape, const std::vector<Box>& boxes) {
  std::vector<std::string> problems;
  const std::vector<const Box*> valid = BoxesInside(shape, boxes, problems);
  // FORMAT.md §3.3, §9.1: a tensor of zero volume is exactly one chunk, the whole tensor.
  const Box whole = Box::Full(shape);
  if (NumElements(shape) == 0 && problems.empty() && (boxes.size() != 1 || boxes[0] != whole)) {
    problems.push_back("a tensor of zero volume " + whole.ToString() + " has exactly one chunk, the whole tensor; " +
                       std::to_string(boxes.size()) + " chunks" +
                       (boxes.empty() ? std::string() : " from " + boxes[0].ToString()) + " given");
    return problems;
  }
  std::size_t duplicated = 0;
  const std::vector<const Box*> unique = WithoutDuplicates(valid, problems, duplicated);
  const uint64_t covered = CoveredElements(unique);
  const auto total = static_cast<uint64_t>(NumElements(shape));
  const std::vector<std::size_t> dims = PartlySpannedDims(shape, unique);
  if (duplicated == 0 && covered == total &&
      (total == 0 || ExactCover(shape, unique, dims) == std::optional<bool>(true)))
    return problems;
  bool complete = true;
  const std::size_t overlaps = ReportOverlaps(shape, unique, dims, problems, complete);
  if (overlaps > 0 || duplicated > 0) return problems;
  ReportCoverage(shape, unique.size(), covered, complete, problems);
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
