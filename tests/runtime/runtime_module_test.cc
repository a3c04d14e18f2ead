// Modules, gradients and strategies: the math is right before any checkpoint is taken.
#include <doctest/doctest.h>

#include <cmath>
#include <set>

#include "runtime_helpers.h"

using namespace ckpt::runtime;
using namespace ckpt::demo;
using rt_test::SmallConfig;

TEST_CASE("backward matches finite differences") {
  Generator gen(3);
  ClassifierConfig cfg;
  cfg.vocab = 10;
  cfg.context = 3;
  cfg.dim = 6;
  cfg.hidden = 8;
  cfg.layers = 2;
  cfg.classes = 4;
  Classifier model(cfg, gen);
  SyntheticDataset data(64, cfg.vocab, cfg.context, cfg.classes, 5);
  DataLoader loader(data, 8, 5);
  Batch b = loader.Next();
  auto loss_of = [&] { return static_cast<double>(CrossEntropy(model.Call(b.inputs), b.labels, nullptr)); };
  Mat d;
  CrossEntropy(model.Call(b.inputs), b.labels, &d);
  model.ZeroGrad();
  model.CallBackward(d);
  int checked = 0;
  for (auto& [name, p] : model.NamedParameters()) {
    for (std::size_t j = 0; j < p->data.size(); j += 7) {
      const float saved = p->data[j];
      const float h = 1e-2f;
      p->data[j] = saved + h;
      const double up = loss_of();
      p->data[j] = saved - h;
      const double down = loss_of();
      p->data[j] = saved;
      const double numeric = (up - down) / (2.0 * h);
      INFO(name << "[" << j << "] numeric " << numeric << " analytic " << p->grad[j]);
      CHECK(std::abs(numeric - p->grad[j]) <= 2e-3 + 2e-2 * std::abs(numeric));
      ++checked;
    }
  }
  CHECK(checked > 50);
}

TEST_CASE("data loader: the global batch does not depend on the data-parallel size") {
  SyntheticDataset data(100, 10, 3, 4, 9);
  DataLoader one(data, 12, 9);
  std::multiset<float> whole;
  for (int step = 0; step < 10; ++step) {  // crosses an epoch boundary (8 batches per epoch)
    Batch b1 = one.Next();
    std::multiset<float> split;
    for (int r = 0; r < 3; ++r) {
      DataLoader part(data, 12, 9);
      part.SetDataParallel(r, 3);
      for (int s = 0; s < step; ++s) part.Next();
      Batch b = part.Next();
      CHECK(b.inputs.rows == 4);
      split.insert(b.inputs.v.begin(), b.inputs.v.end());
    }
    CHECK(split == std::multiset<float>(b1.inputs.v.begin(), b1.inputs.v.end()));
  }
  CHECK(one.epoch() == 1);
  CHECK_THROWS_AS(one.SetDataParallel(0, 5), ckpt::Error);
}

TEST_CASE("every strategy trains the same model as one rank") {
  struct Case { Strategy s; int world; int tp; };
  std::vector<float> base_losses;
  rt_test::FullState base;
  ckpt::RunThreads(1, [&](ckpt::Comm& c) {
    Trainer t(c, SmallConfig(Strategy::kDdp));
    for (int i = 0; i < 4; ++i) base_losses.push_back(t.Step());
    base = rt_test::Gather(t.accelerator());
  });
  for (Case k : {Case{Strategy::kDdp, 2, 0}, Case{Strategy::kFsdp, 4, 0}, Case{Strategy::kTp, 3, 0},
                 Case{Strategy::kFsdpTp, 4, 2}, Case{Strategy::kFsdpTp, 6, 3}}) {
    CAPTURE(StrategyName(k.s));
    CAPTURE(k.world);
    std::vector<float> losses;
    rt_test::FullState state;
    ckpt::RunThreads(k.world, [&](ckpt::Comm& c) {
      Trainer t(c, SmallConfig(k.s, k.tp));
      std::vector<float> mine;
      for (int i = 0; i < 4; ++i) mine.push_back(t.Step());
      auto full = rt_test::Gather(t.accelerator());
      if (c.rank() == 0) {
        losses = mine;
        state = std::move(full);
      }
    });
    for (int i = 0; i < 4; ++i) CHECK(losses[i] == doctest::Approx(base_losses[i]).epsilon(1e-4));
    REQUIRE(state.size() == base.size());
    for (auto& [key, v] : base) {
      CAPTURE(key);
      REQUIRE(state.count(key) == 1);
      // Same global batch, same math: only the summation order of reductions differs.
      CHECK(rt_test::MaxAbsDiff(v, state[key]) < 1e-4);
    }
  }
}

TEST_CASE("the loss falls") {
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Trainer t(c, SmallConfig(Strategy::kFsdp));
    float first = 0, last = 0;
    for (int i = 0; i < 60; ++i) {
      const float l = t.Step();
      if (i < 5) first += l;
      if (i >= 55) last += l;
    }
    CHECK(last < 0.8f * first);
  });
}

TEST_CASE("FSDP gives gathered weights and gradients back after each module") {
  // Clearing a vector keeps its capacity: every rank would keep the whole model gathered
  // (weights and gradients) after one step instead of model / N plus one module.
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Trainer t(c, SmallConfig(Strategy::kFsdp));
    t.Step();
    t.Step();
    int sharded = 0;
    for (auto& [name, p] : t.module().NamedParameters()) {
      CAPTURE(name);
      sharded += p->fsdp_sharded;
      CHECK(p->work.capacity() == 0);
      CHECK(p->work_grad.capacity() == 0);
      CHECK(p->data.size() == static_cast<std::size_t>(p->local_numel()));
    }
    CHECK(sharded > 0);
  });
}

namespace {
// One optimizer step on the module alone (no accelerator): forward, backward, step.
void StepAlone(Classifier& model, Optimizer& opt, DataLoader& loader) {
  Batch b = loader.Next();
  Mat logits = model.Call(b.inputs);
  Mat dlogits;
  CrossEntropy(logits, b.labels, &dlogits);
  opt.ZeroGrad();
  model.CallBackward(dlogits);
  opt.Step();
}

// The optimizer's tensors (exp_avg, exp_avg_sq per parameter, in order), whole.
std::vector<std::vector<float>> OptimizerTensors(const rt_test::FullState& full) {
  std::vector<std::vector<float>> out;
  for (auto& [key, v] : full)
    if (key.rfind("optimizer.", 0) == 0) out.push_back(v);
  return out;
}
}  // namespace

TEST_CASE("preparing an AdamW that has already stepped keeps its state") {
  for (Strategy s : {Strategy::kDdp, Strategy::kFsdp}) {
    CAPTURE(StrategyName(s));
    // Reference: the same steps, everything prepared first, one rank.
    rt_test::FullState want;
    const ClassifierConfig cfg = SmallConfig(s).model;
    SyntheticDataset data(64, cfg.vocab, cfg.context, cfg.classes, 5);
    auto run = [&](ckpt::Comm& c, bool step_first, rt_test::FullState* out) {
      Generator gen(1);
      Classifier model(cfg, gen);
      AdamW opt(model);
      DataLoader loader(data, 8, 5);
      if (step_first) {
        StepAlone(model, opt, loader);  // every rank takes the whole batch
        StepAlone(model, opt, loader);
      }
      Accelerator accel(c, {s});
      accel.Prepare(model);
      accel.Prepare(opt);
      ckpt::StateDict sd = accel.CollectState();
      for (auto& [key, e] : sd)
        if (key.size() > 5 && key.compare(key.size() - 5, 5, ".step") == 0)
          CHECK(std::get<ckpt::Scalar>(e).AsInt() == (step_first ? 2 : 0));
      auto full = rt_test::Gather(accel);
      if (c.rank() == 0) *out = std::move(full);
    };
    rt_test::FullState got;
    ckpt::RunThreads(1, [&](ckpt::Comm& c) {
      // What two steps leave in the state, with the optimizer stepped after prepare.
      Generator gen(1);
      Classifier model(cfg, gen);
      AdamW opt(model);
      DataLoader loader(data, 8, 5);
      Accelerator accel(c, {Strategy::kDdp});
      accel.Prepare(model);
      accel.Prepare(opt);
      StepAlone(model, opt, loader);
      StepAlone(model, opt, loader);
      want = rt_test::Gather(accel);
    });
    ckpt::RunThreads(2, [&](ckpt::Comm& c) { run(c, true, &got); });
    const auto w = OptimizerTensors(want), g = OptimizerTensors(got);
    REQUIRE(w.size() == g.size());
    REQUIRE(!w.empty());
    bool any_nonzero = false;
    for (std::size_t i = 0; i < w.size(); ++i) {
      CAPTURE(i);
      CHECK(rt_test::BitEqual(w[i], g[i]));
      for (float x : g[i]) any_nonzero |= x != 0.0f;
    }
    CHECK(any_nonzero);
  }
}
