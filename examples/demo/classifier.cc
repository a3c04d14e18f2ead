// The demo classifier.
#include "ckpt_demo/classifier.h"

#include "ckpt/runtime/module.h"

namespace ckpt::demo {

using runtime::MlpBlock;

Classifier::Classifier(const ClassifierConfig& config, Generator& gen)
    : Module("Classifier"),
      config_(config),
      embed_(std::make_unique<EmbeddingBag>(config.vocab, config.dim, gen)),
      blocks_(std::make_unique<Sequential>()),
      norm_(std::make_unique<LayerNorm>(config.dim)),
      head_(nullptr) {
  for (int64_t l = 0; l < config.layers; ++l)
    blocks_->Add(std::make_unique<MlpBlock>(config.dim, config.hidden, gen));
  head_ = std::make_unique<Linear>(config.dim, config.classes, gen);
}

Classifier::Classifier(const Classifier& other)
    : Module(other),
      config_(other.config_),
      embed_(std::make_unique<EmbeddingBag>(*other.embed_)),
      blocks_(std::unique_ptr<Sequential>(static_cast<Sequential*>(other.blocks_->Clone().release()))),
      norm_(std::make_unique<LayerNorm>(*other.norm_)),
      head_(std::make_unique<Linear>(*other.head_)) {}

std::unique_ptr<Module> Classifier::Clone() const {
  return std::unique_ptr<Module>(new Classifier(*this));
}

std::vector<Module::NamedModule> Classifier::Children() {
  return {{"embed", embed_.get()}, {"blocks", blocks_.get()}, {"norm", norm_.get()},
          {"head", head_.get()}};
}

Mat Classifier::Forward(const Mat& x) {
  return head_->Call(norm_->Call(blocks_->Call(embed_->Call(x))));
}

Mat Classifier::Backward(const Mat& dy) {
  return embed_->CallBackward(blocks_->CallBackward(norm_->CallBackward(head_->CallBackward(dy))));
}

}  // namespace ckpt::demo
