// layout/box.h: pure geometry of boxes in a tensor's index space: intersection, the
// contiguous runs that copy one box's part of another, and tiling checks.
// No I/O; every function is deterministic and exhaustively testable.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/tensor.h"

namespace ckpt::layout {

// The intersection of two boxes of the same rank; nullopt if it is empty.
// A 0-D box intersects another 0-D box in the single element.
std::optional<Box> Intersect(const Box& a, const Box& b);

// True if `inner` lies inside `outer`.
bool Contains(const Box& outer, const Box& inner);

// True if the boxes share at least one element.
bool Overlaps(const Box& a, const Box& b);

// A run of `count` consecutive elements at element offset `src` of a row-major buffer laid
// out over `src_box` and at offset `dst` of one laid out over `dst_box`.
struct Run {
  int64_t src;
  int64_t dst;
  int64_t count;
};

// Calls fn for each maximal contiguous run of `region` (which must lie in both boxes), in
// row-major order of `region`. Trailing dimensions that are whole in both boxes are
// merged, so copying a row block of a matrix is one run.
void ForEachRun(const Box& src_box, const Box& dst_box, const Box& region,
                const std::function<void(const Run&)>& fn);

// The number of runs ForEachRun would produce, without producing them.
int64_t CountRuns(const Box& src_box, const Box& dst_box, const Box& region);

// Problems with how `boxes` tile `shape`: boxes out of bounds or of the wrong rank,
// overlapping pairs, uncovered elements. Empty if they tile it exactly.
std::vector<std::string> TilingProblems(const Shape& shape, const std::vector<Box>& boxes);

}  // namespace ckpt::layout
