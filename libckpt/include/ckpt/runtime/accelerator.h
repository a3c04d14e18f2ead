// ckpt/runtime/accelerator.h: prepare-once registration, parallel strategies, and
// symmetric save_state / load_state through libckpt.
//
// Prepare is idempotent and keyed by object identity: preparing an object again (the
// original or the handle Prepare returned, from any call site, any number of times)
// returns the same handle and changes nothing: no second wrap, no second registration,
// no second hook. A deep copy is another object. Two different objects under the same
// (or a nested) checkpoint prefix are an error at prepare time.
//
// REQUIRES: prepared objects outlive the Accelerator (the registry holds their addresses).
// Threading: one Accelerator per rank; every method marked COLLECTIVE is called by all
// ranks of the world communicator in the same order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/comm.h"
#include "ckpt/runtime/data.h"
#include "ckpt/runtime/module.h"
#include "ckpt/runtime/optim.h"
#include "ckpt/runtime/stateful.h"

namespace ckpt::runtime {

enum class Strategy {
  kDdp,     // parameters replicated, gradients all-reduced
  kFsdp,    // parameters and optimizer state sharded along dim 0, gathered for compute
  kTp,      // Linear layers column- / row-parallel across the world (or tp_size ranks)
  kFsdpTp,  // 2-D mesh [dp, tp]: TP inside a row, FSDP across rows
};
std::string_view StrategyName(Strategy s);  // "ddp", "fsdp", "tp", "fsdp_tp"
// Throws kInvalidArgument for an unknown name.
Strategy StrategyFromName(std::string_view name);

struct AcceleratorOptions {
  Strategy strategy = Strategy::kDdp;
  // Tensor-parallel size: kTp defaults to the world size, kFsdpTp to the largest
  // divisor of the world <= sqrt(world) ... unless given. Must divide the world size.
  int tp_size = 0;
};

// Counters of the collectives a prepared model issued (for tests and the benchmark).
struct CommStats {
  int64_t all_gathers = 0;
  int64_t reduce_scatters = 0;
  int64_t all_reduces = 0;
};

class Accelerator;

// What Prepare(Module&) returns: the module with its strategy applied. Wrapper depth is
// always one: preparing the handle returns the handle.
class DistributedModel final : public Stateful {
 public:
  ~DistributedModel() override;
  Module& module() { return *module_; }
  Mat Forward(const Mat& x);
  // Backpropagates d(loss)/d(output) and synchronises the gradients (all-reduce under
  // DDP, reduce-scatter under FSDP) so the optimizer can step.
  // REQUIRES (DDP): one Backward per optimizer step (gradients zeroed in between); the
  // all-reduce averages the whole accumulated gradient.
  void Backward(const Mat& dy);
  const CommStats& comm_stats() const { return stats_; }
  std::size_t num_hooks() const;
  // Global key of each parameter and buffer, "<prefix>.<name>", in module order.
  const std::vector<std::pair<std::string, Parameter*>>& keyed_parameters() const {
    return params_;
  }

  std::string Kind() const override { return "model"; }
  void CollectState(const std::string& prefix, StateDict& sd) override;
  void RestoreState(const std::string&, const StateDict&) override {}

 private:
  friend class Accelerator;
  class FsdpHook;
  DistributedModel(Accelerator& accel, Module& module, const std::string& prefix);
  Accelerator* accel_;
  Module* module_;
  std::vector<std::pair<std::string, Parameter*>> params_;
  std::vector<std::unique_ptr<ModuleHook>> hooks_;
  CommStats stats_;
};

struct RegistryEntry {
  const void* object = nullptr;  // the object passed to Prepare first
  Stateful* handle = nullptr;    // what Prepare returned
  std::string kind;              // "model", "optimizer", "scheduler", "dataloader", "rng", ...
  std::string prefix;            // checkpoint prefix: every key of the object starts with it
  int order = 0;                 // registration order (save order)
};

struct SaveStateOptions {
  StateDictType state_dict_type = StateDictType::kSharded;
  bool overwrite = false;
  Compression compression;
  ObjectStoreOptions s3;  // for an s3:// target (ckpt/checkpoint.h)
};

struct LoadStateOptions {
  // How the running job holds its state; LOCAL checkpoints load only into LOCAL with
  // the same strategy, mesh and world size.
  StateDictType state_dict_type = StateDictType::kSharded;
  bool strict = true;
  ObjectStoreOptions s3;  // for an s3:// checkpoint (ckpt/checkpoint.h)
};

struct SaveFullOptions {
  bool overwrite = false;
  // Refuse (before writing) a tensor whose staging on rank 0 (the whole tensor plus the
  // largest round of pieces it receives) would exceed this; 0: no limit.
  uint64_t max_buffer_bytes = 0;
};

struct SaveFullReport {
  // Most staging memory rank 0 held at once: the whole tensor and the pieces of one round.
  uint64_t peak_buffer_bytes = 0;
  uint64_t largest_tensor_bytes = 0;
  uint64_t total_tensor_bytes = 0;
};

class Accelerator {
 public:
  // COLLECTIVE (splits `world` into the mesh's data- and tensor-parallel groups).
  Accelerator(Comm& world, const AcceleratorOptions& options = {});
  ~Accelerator();
  Accelerator(const Accelerator&) = delete;
  Accelerator& operator=(const Accelerator&) = delete;

  // Lays the module's parameters out for the strategy (sharding them in place), installs
  // the gradient hooks, and registers the handle under `prefix`.
  DistributedModel& Prepare(Module& module, const std::string& prefix = "model");
  DistributedModel& Prepare(DistributedModel& handle);
  // REQUIRES: the optimizer's parameters belong to a model prepared before it.
  Optimizer& Prepare(Optimizer& optimizer, const std::string& prefix = "optimizer");
  DataLoader& Prepare(DataLoader& loader, const std::string& prefix = "dataloader");
  // Any other stateful object: scheduler, RNG, a user object.
  Stateful& Prepare(Stateful& object, const std::string& prefix);
  LrScheduler& Prepare(LrScheduler& s, const std::string& prefix = "scheduler");
  Generator& Prepare(Generator& g, const std::string& prefix = "rng");

  const std::vector<RegistryEntry>& registry() const { return registry_; }
  // The entry of `object` (an original or a handle), or null.
  const RegistryEntry* Find(const void* object) const;

  // COLLECTIVE. Writes every prepared object exactly once through ckpt::Save: SHARDED
  // (each rank its chunks, replicas once) or LOCAL (flat per-rank layout). FULL is
  // SaveFull: whole tensors, gathered one at a time on rank 0.
  void SaveState(const std::filesystem::path& dir, const SaveStateOptions& options = {});
  // COLLECTIVE. SaveState through ckpt::SaveAsync: returns once the state is copied into
  // staging memory (training may go on and change it); the write and commit run in the
  // background. `on_commit` runs after the commit on the background group (AsyncSaveOptions).
  // SHARDED or LOCAL only (a FULL export is SaveFull, synchronous).
  SaveHandle SaveStateAsync(const std::filesystem::path& dir, const SaveStateOptions& options = {},
                            std::function<void(Comm&)> on_commit = {});
  // COLLECTIVE. Loads into the prepared objects, resharding from whatever saved it.
  LoadReport LoadState(const std::filesystem::path& dir, const LoadStateOptions& options = {});
  // COLLECTIVE. Writes a FULL checkpoint (one file, one chunk per tensor) from rank 0,
  // gathering one tensor at a time: rank 0 holds the whole tensor (its own pieces copied
  // in) and the other ranks' pieces as they arrive, in rounds of at most one tensor's
  // bytes, so its staging stays within 2 x the largest tensor.
  SaveFullReport SaveFull(const std::filesystem::path& dir, const SaveFullOptions& options = {});
  // COLLECTIVE. The full value of every tensor of the state, on rank 0 (empty elsewhere).
  // Holds the whole state on rank 0: for tests and small models only.
  std::vector<std::pair<std::string, std::vector<float>>> GatherFullTensors();

  // The StateDict SaveState writes (views over the prepared objects' memory).
  StateDict CollectState(StateDictType type = StateDictType::kSharded);

  Comm& world() { return *world_; }
  Comm& dp() { return *dp_; }
  Comm& tp() { return *tp_; }
  int dp_rank() const { return dp_->rank(); }
  int dp_size() const { return dp_->size(); }
  int tp_rank() const { return tp_->rank(); }
  int tp_size() const { return tp_->size(); }
  Strategy strategy() const { return options_.strategy; }
  bool shards_parameters() const;
  // JSON: {"strategy":..,"world":..,"mesh":{"dp":..,"tp":..}}
  std::string MeshJson() const;
  // "fsdp, world 4 (dp 4 x tp 1)"
  std::string LayoutName() const;

 private:
  friend class DistributedModel;
  RegistryEntry& Register(const void* object, Stateful* handle, const std::string& kind,
                          const std::string& prefix);
  void LayOut(Module& module);
  std::string LayoutFingerprint();
  // The core options SaveState writes with (user metadata, mesh).
  SaveOptions CoreSaveOptions(const SaveStateOptions& options);

  Comm* world_;
  AcceleratorOptions options_;
  std::unique_ptr<Comm> dp_, tp_;
  std::vector<RegistryEntry> registry_;
  std::unordered_map<const void*, std::size_t> by_address_;
  std::vector<std::unique_ptr<DistributedModel>> models_;
};

}  // namespace ckpt::runtime
