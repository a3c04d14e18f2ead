// ckpt/runtime/optim.h: SGD and AdamW with per-parameter state, and an LR scheduler.
//
// Optimizer state has the layout of its parameter's local part (sharded with it under
// FSDP). Checkpoint keys: `<prefix>.state.<param key>.<name>` with <param key> the
// parameter's global key ("model.blocks.0.fc1.weight"), and `<prefix>.lr`.
//
// Threading: one object per rank (thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/runtime/module.h"
#include "ckpt/runtime/stateful.h"

namespace ckpt::runtime {

class Optimizer : public Stateful {
 public:
  // Optimizes the trainable parameters of `module` (buffers are skipped).
  Optimizer(Module& module, double lr);
  std::string Kind() const override { return "optimizer"; }

  virtual void Step() = 0;
  void ZeroGrad();
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  std::size_t num_params() const { return params_.size(); }
  Parameter& param(std::size_t i) { return *params_[i]; }
  const std::vector<Parameter*>& params() const { return params_; }

  // Called by Accelerator::Prepare once the parameters are laid out: names each
  // parameter by its global key and sizes the state to the local parts. State from
  // steps taken before prepare is kept (cut to the local part when it covers the whole
  // tensor); state that fits neither throws kInvalidArgument.
  void Bind(std::vector<std::string> param_keys);
  bool bound() const { return !keys_.empty() || params_.empty(); }

  void CollectState(const std::string& prefix, StateDict& sd) override;
  void RestoreState(const std::string& prefix, const StateDict& sd) override;

 protected:
  struct Slot {
    std::vector<std::vector<float>> buffers;  // one per StateNames() entry
    int64_t step = 0;
  };
  virtual std::vector<std::string> StateNames() const = 0;
  std::vector<Parameter*> params_;
  std::vector<std::string> keys_;
  std::vector<Slot> slots_;
  double lr_;
};

class Sgd final : public Optimizer {
 public:
  Sgd(Module& module, double lr, double momentum = 0.9, double weight_decay = 0.0);
  void Step() override;

 protected:
  std::vector<std::string> StateNames() const override { return {"momentum_buffer"}; }

 private:
  double momentum_, weight_decay_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

class AdamW final : public Optimizer {
 public:
  AdamW(Module& module, const AdamWOptions& options = {});
  void Step() override;

 protected:
  std::vector<std::string> StateNames() const override { return {"exp_avg", "exp_avg_sq"}; }

 private:
  AdamWOptions options_;
};

// Linear warm-up to the base LR, then cosine decay to min_ratio x base over total steps.
class LrScheduler final : public Stateful {
 public:
  LrScheduler(Optimizer& optimizer, int64_t warmup, int64_t total, double min_ratio = 0.1);
  void Step();  // after each optimizer step
  int64_t last_step() const { return step_; }
  double LrAt(int64_t step) const;

  std::string Kind() const override { return "scheduler"; }
  void CollectState(const std::string& prefix, StateDict& sd) override;
  void RestoreState(const std::string& prefix, const StateDict& sd) override;

 private:
  Optimizer* optimizer_;
  double base_lr_;
  int64_t warmup_, total_;
  double min_ratio_;
  int64_t step_ = 0;
};

}  // namespace ckpt::runtime
