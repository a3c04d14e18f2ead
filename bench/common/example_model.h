// bench/common/example_model.h: the example model (examples/demo) at the size the runtime
// benchmarks train: a checkpoint of a few hundred MB. Header-only.
#pragma once

#include "ckpt_demo/trainer.h"

namespace ckpt_bench {

inline ckpt::demo::TrainerConfig ExampleModelConfig() {
  ckpt::demo::TrainerConfig cfg;
  cfg.model.vocab = 8192;
  cfg.model.dim = 1024;
  cfg.model.hidden = 4096;
  cfg.model.layers = 2;
  cfg.model.context = 8;
  cfg.global_batch = 32;
  return cfg;
}

}  // namespace ckpt_bench
