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

// Intersect, Contains, Overlaps, ForEachRun, CountRuns: public (ckpt/tensor.h).
using ckpt::Contains;
using ckpt::CountRuns;
using ckpt::ForEachRun;
using ckpt::Intersect;
using ckpt::Overlaps;
using Run = ckpt::BoxRun;

// Problems with how `boxes` tile `shape`: boxes out of bounds or of the wrong rank,
// overlapping pairs, uncovered elements. Empty if they tile it exactly.
std::vector<std::string> TilingProblems(const Shape& shape, const std::vector<Box>& boxes);

}  // namespace ckpt::layout
