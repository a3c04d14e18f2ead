// ckpt/runtime/stateful.h: objects whose state the accelerator saves and loads.
//
// Anything with state that a checkpoint must carry (optimizer, scheduler, data loader,
// RNG, a user's own object) implements Stateful and is registered with
// Accelerator::Prepare under a checkpoint prefix.
#pragma once

#include <string>

#include "ckpt/tensor.h"

namespace ckpt::runtime {

class Stateful {
 public:
  virtual ~Stateful() = default;

  // "optimizer", "scheduler", "dataloader", "rng", "object": shown in the registry.
  virtual std::string Kind() const { return "object"; }

  // Adds this object's state to `sd`, every key starting with `prefix` + ".". Tensors
  // are views over the object's memory: Save reads them, Load writes into them. Scalars,
  // bytes and JSON carry the current values (Load overwrites them).
  virtual void CollectState(const std::string& prefix, StateDict& sd) = 0;
  // Called after Load filled `sd` (built by CollectState): takes back the non-tensor values.
  virtual void RestoreState(const std::string& prefix, const StateDict& sd) = 0;
};

}  // namespace ckpt::runtime
