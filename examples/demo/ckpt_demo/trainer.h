// ckpt_demo/trainer.h: the example training job, packaged: a Classifier on the
// synthetic task with AdamW, a warm-up + cosine schedule, a resumable data loader and
// an RNG, all prepared once on an Accelerator. Used by examples/train, the tests and
// the benchmark. Not installed: example code.
//
// Threading: one Trainer per rank; the constructor and Step are COLLECTIVE.
#pragma once

#include <cstdint>

#include "ckpt/runtime/accelerator.h"
#include "ckpt_demo/classifier.h"
#include "ckpt_demo/synthetic_dataset.h"

namespace ckpt::demo {

using runtime::Accelerator;
using runtime::AdamW;
using runtime::DataLoader;
using runtime::DistributedModel;
using runtime::LrScheduler;
using runtime::Strategy;

struct TrainerConfig {
  ClassifierConfig model;
  Strategy strategy = Strategy::kDdp;
  int tp_size = 0;             // see AcceleratorOptions
  int64_t dataset_size = 4096;
  int64_t global_batch = 32;   // samples per step over all data-parallel ranks
  double lr = 3e-3;
  int64_t warmup = 10;
  int64_t total_steps = 1000;  // of the cosine schedule
  uint64_t init_seed = 1;      // parameter initialisation
  uint64_t data_seed = 7;      // data set and shuffling
};

class Trainer {
 public:
  Trainer(Comm& world, const TrainerConfig& config);

  // One optimizer step on the next global batch. Returns the global mean loss, the
  // same on every rank.
  float Step();
  int64_t step() const { return scheduler_.last_step(); }

  Accelerator& accelerator() { return accel_; }
  DistributedModel& model() { return *model_; }
  Classifier& module() { return module_; }
  AdamW& optimizer() { return optimizer_; }
  LrScheduler& scheduler() { return scheduler_; }
  DataLoader& loader() { return loader_; }
  Generator& rng() { return rng_; }

 private:
  TrainerConfig config_;
  Generator rng_;
  Classifier module_;
  AdamW optimizer_;
  LrScheduler scheduler_;
  SyntheticDataset data_;
  DataLoader loader_;
  Accelerator accel_;
  DistributedModel* model_ = nullptr;
};

}  // namespace ckpt::demo
