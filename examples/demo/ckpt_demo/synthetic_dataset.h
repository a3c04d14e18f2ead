// ckpt_demo/synthetic_dataset.h: the demo's deterministic classification task. Not
// installed: example code.
//
// Threading: immutable after construction.
#pragma once

#include <cstdint>
#include <vector>

#include "ckpt/runtime/data.h"

namespace ckpt::demo {

// A classification task: sample i is `context` token ids; its label is the argmax of a
// fixed random teacher over the bag of tokens. Same seed, same data, on every rank.
class SyntheticDataset final : public runtime::Dataset {
 public:
  SyntheticDataset(int64_t size, int64_t vocab, int64_t context, int64_t classes, uint64_t seed);
  int64_t size() const override { return size_; }
  int64_t context() const { return context_; }
  int64_t sample_size() const override { return context_; }
  void Get(int64_t index, float* tokens, int32_t* label) const override;

 private:
  int64_t size_, vocab_, context_, classes_;
  uint64_t seed_;
  std::vector<float> teacher_;  // [vocab, classes]
};

}  // namespace ckpt::demo
