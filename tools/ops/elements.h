// ops/elements.h (internal): element-wise work on raw tensor bytes: dtype casts,
// streaming statistics, and element comparison for diff.
//
// Thread-safety: pure functions; an Accumulator belongs to one thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ckpt/dtype.h"
#include "ckpt/metadata.h"

namespace ckpt::ops::detail {

// Encodes `v` as `dtype` at `out` (round to nearest even; fp8 e4m3fn saturates to NaN
// as PyTorch does for out-of-range values). float8_e8m0fnu and float4_e2m1fn_x2 are not
// castable (IsCastable): kInvalidArgument.
void EncodeElement(DType dtype, double v, void* out);
// Casts `n` elements from `from` to `to`. Integers and bool are copied only when equal.
void CastElements(DType from, const void* in, DType to, void* out, std::size_t n);

// Min, max, mean, l2 over finite elements, and NaN / Inf counts, streamed block by block
// (float4_e2m1fn_x2: over its two values per element).
struct StatsAccumulator {
  double min = 0, max = 0, sum = 0, sumsq = 0;
  int64_t nan = 0, inf = 0, finite = 0;
  void Add(DType dtype, const void* data, std::size_t n);
  void Merge(const ChunkStats& s);  // a chunk's recorded statistics
  double mean() const { return finite ? sum / static_cast<double>(finite) : 0; }
  double stddev() const;
};

// Counts NaN and Inf elements of a floating buffer (0 for other dtypes).
void CountNonFinite(DType dtype, const void* data, std::size_t n, int64_t* nan, int64_t* inf);

}  // namespace ckpt::ops::detail
