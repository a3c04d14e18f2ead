// The demo's synthetic data set.
#include "ckpt_demo/synthetic_dataset.h"

#include "ckpt/error.h"

namespace ckpt::demo {

using runtime::Generator;
using runtime::Mix;

SyntheticDataset::SyntheticDataset(int64_t size, int64_t vocab, int64_t context, int64_t classes,
                                   uint64_t seed)
    : size_(size), vocab_(vocab), context_(context), classes_(classes), seed_(seed) {
  if (size <= 0 || vocab <= 0 || context <= 0 || classes <= 0)
    throw Error(ErrorCode::kInvalidArgument, "SyntheticDataset: sizes must be positive");
  Generator gen(Mix(seed, 0x7eac4e7));
  teacher_.resize(static_cast<std::size_t>(vocab * classes));
  for (float& t : teacher_) t = gen.Normal();
}

void SyntheticDataset::Get(int64_t index, float* tokens, int32_t* label) const {
  std::vector<double> score(static_cast<std::size_t>(classes_), 0.0);
  for (int64_t j = 0; j < context_; ++j) {
    const auto t = static_cast<int64_t>(Mix(seed_, static_cast<uint64_t>(index),
                                            static_cast<uint64_t>(j)) %
                                        static_cast<uint64_t>(vocab_));
    tokens[j] = static_cast<float>(t);
    for (int64_t c = 0; c < classes_; ++c)
      score[static_cast<std::size_t>(c)] += teacher_[static_cast<std::size_t>(t * classes_ + c)];
  }
  int64_t best = 0;
  for (int64_t c = 1; c < classes_; ++c)
    if (score[static_cast<std::size_t>(c)] > score[static_cast<std::size_t>(best)]) best = c;
  *label = static_cast<int32_t>(best);
}

}  // namespace ckpt::demo
