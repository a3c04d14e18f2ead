// Shared by the runtime tests: small configurations and full-state comparisons.
#pragma once

#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ckpt/runtime/runtime.h"
#include "ckpt_demo/trainer.h"

namespace rt_test {

using ckpt::runtime::Strategy;
using ckpt::demo::TrainerConfig;
using FullState = std::map<std::string, std::vector<float>>;

// Small enough for 2 cores: uneven splits everywhere (12 / 4, 20 / 3, 30 / 4...).
inline TrainerConfig SmallConfig(Strategy s, int tp = 0) {
  TrainerConfig c;
  c.model.vocab = 30;
  c.model.context = 4;
  c.model.dim = 12;
  c.model.hidden = 20;
  c.model.layers = 2;
  c.model.classes = 5;
  c.strategy = s;
  c.tp_size = tp;
  c.dataset_size = 512;
  c.global_batch = 24;
  c.lr = 1e-2;
  c.warmup = 2;
  c.total_steps = 200;
  return c;
}

// Every tensor of the trainer's state, whole, gathered on rank 0 (empty elsewhere).
inline FullState Gather(ckpt::runtime::Accelerator& accel) {
  FullState out;
  for (auto& [k, v] : accel.GatherFullTensors()) out[k] = std::move(v);
  return out;
}

inline bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

}  // namespace rt_test
