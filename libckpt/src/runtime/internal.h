// Internal to ckpt_runtime: helpers shared by its source files. Not installed.
#pragma once

#include <vector>

#include "ckpt/runtime/module.h"
#include "ckpt/tensor.h"

namespace ckpt::runtime::internal {

// Calls fn(global, local, run) for each contiguous run of `box` inside a row-major
// tensor of `shape`: `global` is the run's flat index in the tensor, `local` its flat
// index in the box (row-major over box.sizes), `run` its length.
template <class Fn>
void ForEachRun(const Shape& shape, const Box& box, Fn&& fn) {
  const std::size_t nd = shape.size();
  if (nd == 0) {
    fn(int64_t{0}, int64_t{0}, int64_t{1});
    return;
  }
  if (box.NumElements() == 0) return;
  std::vector<int64_t> stride(nd, 1);
  for (std::size_t d = nd - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  const int64_t run = box.sizes[nd - 1];
  std::vector<int64_t> idx(nd, 0);  // over box.sizes; the last dimension stays 0
  for (int64_t local = 0;; local += run) {
    int64_t global = 0;
    for (std::size_t d = 0; d < nd; ++d) global += (box.offsets[d] + idx[d]) * stride[d];
    fn(global, local, run);
    std::size_t d = nd - 1;
    while (true) {
      if (d == 0) return;
      --d;
      if (++idx[d] < box.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

// A checkpoint view of `data`, laid out like parameter `p`'s local part: the whole
// tensor, or one chunk of it (none when the local part is empty).
inline Tensor ViewLike(const Parameter& p, float* data) {
  if (p.local_box == Box::Full(p.shape)) return Tensor::Full(DType::kFloat32, p.shape, data);
  std::vector<Chunk> chunks;
  if (p.local_box.NumElements() > 0) chunks.push_back(Chunk{p.local_box, data});
  return Tensor::Sharded(DType::kFloat32, p.shape, std::move(chunks));
}

}  // namespace ckpt::runtime::internal
