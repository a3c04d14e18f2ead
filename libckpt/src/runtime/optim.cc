// SGD, AdamW and the LR scheduler.
#include "ckpt/runtime/optim.h"

#include <algorithm>
#include <cmath>

#include "ckpt/error.h"
#include "runtime/internal.h"

namespace ckpt::runtime {

Optimizer::Optimizer(Module& module, double lr) : lr_(lr) {
  for (auto& [name, p] : module.NamedParameters())
    if (!p->is_buffer) params_.push_back(p);
}

void Optimizer::Bind(std::vector<std::string> param_keys) {
  if (param_keys.size() != params_.size())
    throw Error(ErrorCode::kInternal, "Optimizer::Bind: key count does not match parameters");
  const std::size_t n_state = StateNames().size();
  if (slots_.size() == params_.size()) {
    // Stepped before prepare: keep the state. It has the layout the parameter had then,
    // its local part now or the whole tensor (stepped before the model was prepared);
    // a whole-tensor buffer is cut to the local part.
    std::vector<Slot> kept(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      Parameter& p = *params_[i];
      p.Materialize();
      kept[i].step = slots_[i].step;
      for (std::vector<float>& buf : slots_[i].buffers) {
        if (buf.size() == p.data.size()) {
          kept[i].buffers.push_back(std::move(buf));
        } else if (buf.size() == static_cast<std::size_t>(NumElements(p.shape))) {
          std::vector<float> part(p.data.size());
          internal::ForEachRun(p.shape, p.local_box, [&](int64_t g, int64_t l, int64_t run) {
            std::copy_n(buf.data() + g, run, part.data() + l);
          });
          kept[i].buffers.push_back(std::move(part));
        } else {
          throw Error(ErrorCode::kInvalidArgument,
                      "optimizer: parameter '" + param_keys[i] + "' has state of " +
                          std::to_string(buf.size()) + " elements from steps taken before prepare, "
                          "which fits neither its local part (" + std::to_string(p.data.size()) +
                          ") nor the whole tensor (" + std::to_string(NumElements(p.shape)) +
                          "); prepare the optimizer before stepping it");
        }
      }
    }
    slots_ = std::move(kept);
  } else {
    slots_.assign(params_.size(), Slot{});
    for (std::size_t i = 0; i < params_.size(); ++i) {
      params_[i]->Materialize();
      slots_[i].buffers.assign(n_state, std::vector<float>(params_[i]->data.size(), 0.0f));
    }
  }
  keys_ = std::move(param_keys);
}

void Optimizer::ZeroGrad() {
  for (Parameter* p : params_) std::fill(p->grad.begin(), p->grad.end(), 0.0f);
}

void Optimizer::CollectState(const std::string& prefix, StateDict& sd) {
  if (!bound())
    throw Error(ErrorCode::kInvalidArgument,
                "optimizer '" + prefix + "' has no state layout: prepare it with the accelerator");
  const auto names = StateNames();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::string base = prefix + ".state." + keys_[i] + ".";
    for (std::size_t s = 0; s < names.size(); ++s)
      sd.Add(base + names[s], internal::ViewLike(*params_[i], slots_[i].buffers[s].data()));
    sd.Add(base + "step", Scalar::Int(slots_[i].step));
  }
  sd.Add(prefix + ".lr", Scalar::Float(lr_));
}

void Optimizer::RestoreState(const std::string& prefix, const StateDict& sd) {
  for (std::size_t i = 0; i < params_.size(); ++i)
    slots_[i].step = std::get<Scalar>(sd.At(prefix + ".state." + keys_[i] + ".step")).AsInt();
  lr_ = std::get<Scalar>(sd.At(prefix + ".lr")).AsDouble();
}

Sgd::Sgd(Module& module, double lr, double momentum, double weight_decay)
    : Optimizer(module, lr), momentum_(momentum), weight_decay_(weight_decay) {}

void Sgd::Step() {
  if (slots_.size() != params_.size()) Bind(std::vector<std::string>(params_.size()));
  const auto lr = static_cast<float>(lr_), mu = static_cast<float>(momentum_),
             wd = static_cast<float>(weight_decay_);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    auto& buf = slots_[i].buffers[0];
    for (std::size_t j = 0; j < p.data.size(); ++j) {
      const float g = p.grad[j] + wd * p.data[j];
      buf[j] = mu * buf[j] + g;
      p.data[j] -= lr * buf[j];
    }
    ++slots_[i].step;
  }
}

AdamW::AdamW(Module& module, const AdamWOptions& options)
    : Optimizer(module, options.lr), options_(options) {}

void AdamW::Step() {
  if (slots_.size() != params_.size()) Bind(std::vector<std::string>(params_.size()));
  const auto b1 = static_cast<float>(options_.beta1), b2 = static_cast<float>(options_.beta2);
  const auto eps = static_cast<float>(options_.eps);
  for (std::size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = *params_[i];
    Slot& s = slots_[i];
    ++s.step;
    const auto c1 = static_cast<float>(1.0 - std::pow(options_.beta1, static_cast<double>(s.step)));
    const auto c2 = static_cast<float>(1.0 - std::pow(options_.beta2, static_cast<double>(s.step)));
    const auto lr = static_cast<float>(lr_);
    const auto decay = static_cast<float>(1.0 - lr_ * options_.weight_decay);
    auto& m = s.buffers[0];
    auto& v = s.buffers[1];
    for (std::size_t j = 0; j < p.data.size(); ++j) {
      const float g = p.grad[j];
      m[j] = b1 * m[j] + (1.0f - b1) * g;
      v[j] = b2 * v[j] + (1.0f - b2) * g * g;
      const float mhat = m[j] / c1, vhat = v[j] / c2;
      p.data[j] = p.data[j] * decay - lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
}

LrScheduler::LrScheduler(Optimizer& optimizer, int64_t warmup, int64_t total, double min_ratio)
    : optimizer_(&optimizer),
      base_lr_(optimizer.lr()),
      warmup_(warmup),
      total_(total),
      min_ratio_(min_ratio) {
  optimizer_->set_lr(LrAt(0));
}

double LrScheduler::LrAt(int64_t step) const {
  if (step < warmup_) return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  const double span = static_cast<double>(std::max<int64_t>(total_ - warmup_, 1));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_) / span);
  return base_lr_ * (min_ratio_ + (1.0 - min_ratio_) * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

void LrScheduler::Step() {
  ++step_;
  optimizer_->set_lr(LrAt(step_));
}

void LrScheduler::CollectState(const std::string& prefix, StateDict& sd) {
  sd.Add(prefix + ".last_step", Scalar::Int(step_));
  sd.Add(prefix + ".base_lr", Scalar::Float(base_lr_));
  sd.Add(prefix + ".warmup", Scalar::Int(warmup_));
  sd.Add(prefix + ".total", Scalar::Int(total_));
}

void LrScheduler::RestoreState(const std::string& prefix, const StateDict& sd) {
  step_ = std::get<Scalar>(sd.At(prefix + ".last_step")).AsInt();
  base_lr_ = std::get<Scalar>(sd.At(prefix + ".base_lr")).AsDouble();
  warmup_ = std::get<Scalar>(sd.At(prefix + ".warmup")).AsInt();
  total_ = std::get<Scalar>(sd.At(prefix + ".total")).AsInt();
  optimizer_->set_lr(LrAt(step_));
}

}  // namespace ckpt::runtime
