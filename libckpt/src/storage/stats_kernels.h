// storage/stats_kernels.h: the statistics kernels of digest.cc for float32, bfloat16 and
// float16 built for AVX2 + FMA + F16C (stats_avx2.cc, present when CKPT_STATS_AVX2 is
// defined); digest.cc chooses them at run time on CPUs that have all three.
//
// Threading: pure functions.
#pragma once

#include <cstddef>

#include "ckpt/dtype.h"

namespace ckpt::storage::internal {

// Sums of one block of `n` elements (n >= 1): sum and sum of squares in double, min and max.
// A block holding a NaN or an Inf shows it in `sum` or `sumsq` (not finite); the caller then
// recounts it element by element, so the kernels need no per-element branch.
struct BlockSums {
  double sum = 0, sumsq = 0, lo = 0, hi = 0;
};

// `dtype` is kFloat32, kBFloat16 or kFloat16; `p` needs no alignment.
BlockSums StatsAvx2(DType dtype, const unsigned char* p, std::size_t n);

}  // namespace ckpt::storage::internal
