// Internal to ckpt_runtime: helpers shared by its source files. Not installed.
#pragma once

#include "ckpt/runtime/module.h"
#include "ckpt/tensor.h"

namespace ckpt::runtime::internal {

// A checkpoint view of `data`, laid out like parameter `p`'s local part: the whole
// tensor, or one chunk of it (none when the local part is empty).
inline Tensor ViewLike(const Parameter& p, float* data) {
  if (p.local_box == Box::Full(p.shape)) return Tensor::Full(DType::kFloat32, p.shape, data);
  std::vector<Chunk> chunks;
  if (p.local_box.NumElements() > 0) chunks.push_back(Chunk{p.local_box, data});
  return Tensor::Sharded(DType::kFloat32, p.shape, std::move(chunks));
}

}  // namespace ckpt::runtime::internal
