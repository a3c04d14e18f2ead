// The packaged training job.
#include "ckpt_demo/trainer.h"

namespace ckpt::demo {

using namespace ckpt::runtime;
namespace {
AdamWOptions AdamWFor(const TrainerConfig& c) {
  AdamWOptions o;
  o.lr = c.lr;
  return o;
}
AcceleratorOptions AccelFor(const TrainerConfig& c) {
  AcceleratorOptions o;
  o.strategy = c.strategy;
  o.tp_size = c.tp_size;
  return o;
}
}  // namespace

Trainer::Trainer(Comm& world, const TrainerConfig& config)
    : config_(config),
      rng_(config.init_seed),
      module_(config.model, rng_),
      optimizer_(module_, AdamWFor(config)),
      scheduler_(optimizer_, config.warmup, config.total_steps),
      data_(config.dataset_size, config.model.vocab, config.model.context, config.model.classes,
            config.data_seed),
      loader_(data_, config.global_batch, config.data_seed),
      accel_(world, AccelFor(config)) {
  model_ = &accel_.Prepare(module_);
  accel_.Prepare(optimizer_);
  accel_.Prepare(scheduler_);
  accel_.Prepare(loader_);
  accel_.Prepare(rng_);
}

float Trainer::Step() {
  Batch batch = loader_.Next();
  Mat logits = model_->Forward(batch.inputs);
  Mat dlogits;
  float loss = CrossEntropy(logits, batch.labels, &dlogits);
  optimizer_.ZeroGrad();
  model_->Backward(dlogits);
  optimizer_.Step();
  scheduler_.Step();
  // Every data-parallel rank saw its share of the global batch: average their losses.
  AllReduceSum(accel_.dp(), &loss, 1);
  return loss / static_cast<float>(accel_.dp_size());
}

}  // namespace ckpt::demo
