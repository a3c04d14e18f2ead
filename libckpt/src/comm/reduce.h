// comm/reduce.h: elementwise reductions shared by the Comm backends.
#pragma once

#include <cstddef>

#include "ckpt/comm.h"

namespace ckpt::internal {

// acc[i] = op(acc[i], in[i]) for `count` elements of `dtype`.
// Throws kUnsupported for dtypes without arithmetic here (float8, bool).
void ReduceInto(void* acc, const void* in, std::size_t count, DType dtype, ReduceOp op);

}  // namespace ckpt::internal
