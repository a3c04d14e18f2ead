// ckpt_demo/classifier.h: the demo model of examples/train, the tests and the benchmark,
// built from the runtime's public modules. Not installed: example code.
//
// Threading: a module is used by one thread (one rank) at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "ckpt/runtime/data.h"
#include "ckpt/runtime/module.h"

namespace ckpt::demo {

using runtime::EmbeddingBag;
using runtime::Generator;
using runtime::LayerNorm;
using runtime::Linear;
using runtime::Mat;
using runtime::Module;
using runtime::Sequential;

struct ClassifierConfig {
  int64_t vocab = 256;
  int64_t context = 8;
  int64_t dim = 64;
  int64_t hidden = 256;
  int64_t layers = 2;
  int64_t classes = 16;
};

// embed (EmbeddingBag) -> blocks (Sequential of MlpBlock) -> norm -> head: logits.
class Classifier final : public Module {
 public:
  Classifier(const ClassifierConfig& config, Generator& gen);
  std::unique_ptr<Module> Clone() const override;
  std::vector<NamedModule> Children() override;
  const ClassifierConfig& config() const { return config_; }

 protected:
  Mat Forward(const Mat& x) override;
  Mat Backward(const Mat& dy) override;

 private:
  Classifier(const Classifier& other);
  ClassifierConfig config_;
  std::unique_ptr<EmbeddingBag> embed_;
  std::unique_ptr<Sequential> blocks_;
  std::unique_ptr<LayerNorm> norm_;
  std::unique_ptr<Linear> head_;
};

}  // namespace ckpt::demo
