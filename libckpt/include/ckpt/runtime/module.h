// ckpt/runtime/module.h: modules with named parameters and buffers, on the CPU.
//
// Not a deep-learning framework: explicit Forward/Backward per module, float32 only,
// matrix work through a BLAS. Just enough to train a small MLP or a stack of
// transformer-ish MLP blocks across ranks and to checkpoint it (examples/demo builds a
// classifier from these).
//
// Parallelism lives in the parameters' layout (set by Accelerator::Prepare): each
// Parameter knows the part of the global tensor its tensor-parallel position computes
// with (tp_box) and the part this rank stores (local_box; a dim-0 slice of tp_box under
// FSDP). Modules compute with the tp_box part; hooks installed by the accelerator
// all-gather and reduce-scatter around each module.
//
// Threading: a module is used by one thread (one rank) at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/comm.h"
#include "ckpt/tensor.h"

namespace ckpt::runtime {

class Generator;

// A row-major float32 matrix [rows, cols]: activations and their gradients.
struct Mat {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> v;

  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), v(static_cast<std::size_t>(r * c), 0.0f) {}
  float* data() { return v.data(); }
  const float* data() const { return v.data(); }
  float& at(int64_t r, int64_t c) { return v[static_cast<std::size_t>(r * cols + c)]; }
  float at(int64_t r, int64_t c) const { return v[static_cast<std::size_t>(r * cols + c)]; }
};

// How a parameter's initial values are computed. Values come from a counter-based
// generator, element by element: element g (row-major global index) of a uniform init is
// draw (offset + g), of a normal init draws (offset + 2g, offset + 2g + 1). Any part of
// the tensor can therefore be produced alone, and a rank materialises only its shard.
struct ParamInit {
  enum class Kind { kValues, kUniform, kNormal } kind = Kind::kValues;
  float a = 0.0f, b = 0.0f;  // uniform: [a, b); normal: mean a, standard deviation b
  uint64_t seed = 0, offset = 0;
};

// A trainable tensor (or a buffer: state without a gradient).
struct Parameter {
  Shape shape;            // global shape
  int tp_dim = -1;        // dimension split by tensor parallelism; -1: replicated
  bool is_buffer = false;
  Box tp_box;             // the part this rank computes with (global coordinates)
  Box local_box;          // the part this rank stores: tp_box, or a dim-0 slice of it (FSDP)
  std::vector<float> data;       // local_box, row-major
  std::vector<float> grad;       // local_box (empty for buffers)
  std::vector<float> work;       // tp_box, while gathered for compute (FSDP only)
  std::vector<float> work_grad;  // tp_box, during backward (FSDP only)
  bool fsdp_sharded = false;     // local_box is a strict slice of tp_box
  int wraps = 0;                 // times a strategy laid this parameter out (must stay <= 1)
  ParamInit init;                // kValues: `data` holds the values
  bool materialized = true;      // false: data and grad not allocated yet (deferred init)

  // An unsharded parameter of `shape`, zero-filled (allocated now, or at Materialize()
  // when not `allocate`).
  static Parameter Make(Shape shape, int tp_dim = -1, bool allocate = true);
  // Defers initialisation to `gen`'s next draws (advancing it past them): nothing is
  // allocated until Materialize(), which Prepare calls for the local part only.
  void DeferUniform(Generator& gen, float lo, float hi);
  void DeferNormal(Generator& gen, float mean, float stddev);
  // Allocates data (computing deferred values for local_box) and grad, once.
  void Materialize();
  int64_t tp_numel() const { return tp_box.NumElements(); }
  int64_t local_numel() const { return local_box.NumElements(); }
  // The tp_box values / gradient that modules compute with.
  float* value() {
    Materialize();
    return fsdp_sharded ? work.data() : data.data();
  }
  float* grad_value() {
    Materialize();
    return fsdp_sharded ? work_grad.data() : grad.data();
  }
};

class Module;

// Called around a module's Forward and Backward (installed by the accelerator).
class ModuleHook {
 public:
  virtual ~ModuleHook() = default;
  virtual void PreForward(Module&) {}
  virtual void PostForward(Module&) {}
  virtual void PreBackward(Module&) {}
  virtual void PostBackward(Module&) {}
};

// Tensor-parallel group of a module: set by the accelerator, null before prepare.
struct TpGroup {
  Comm* comm = nullptr;
  int rank = 0;
  int size = 1;
};

class Module {
 public:
  using NamedParam = std::pair<std::string, Parameter*>;
  using NamedModule = std::pair<std::string, Module*>;

  explicit Module(std::string type) : type_(std::move(type)) {}
  virtual ~Module() = default;

  const std::string& type() const { return type_; }

  // A deep copy: a new, unprepared object with the same values (hooks are not copied).
  virtual std::unique_ptr<Module> Clone() const = 0;

  // Runs Forward / Backward with the installed hooks around them.
  Mat Call(const Mat& x);
  Mat CallBackward(const Mat& dy);

  // This module's own parameters and buffers (not its children's), named locally.
  virtual std::vector<NamedParam> OwnParameters() { return {}; }
  virtual std::vector<NamedModule> Children() { return {}; }

  // Recursive, depth-first, fully qualified within this module: "blocks.0.fc1.weight".
  // Buffers are included (Parameter::is_buffer).
  std::vector<NamedParam> NamedParameters();
  std::vector<NamedModule> NamedModules();  // this module first, as ""

  void AddHook(ModuleHook* hook) { hooks_.v.push_back(hook); }
  void RemoveHook(ModuleHook* hook) { std::erase(hooks_.v, hook); }
  std::size_t num_hooks() const { return hooks_.v.size(); }
  void SetTpGroup(const TpGroup& group) { tp_ = group; }
  // Zeroes the gradients of this module's parameters (recursively).
  void ZeroGrad();

 protected:
  Module(const Module& other) : type_(other.type_) {}
  Module& operator=(const Module&) = delete;

  virtual Mat Forward(const Mat& x) = 0;
  virtual Mat Backward(const Mat& dy) = 0;

  TpGroup tp_;

 private:
  struct Hooks {  // copies of a module start without hooks
    std::vector<ModuleHook*> v;
    Hooks() = default;
    Hooks(const Hooks&) {}
    Hooks& operator=(const Hooks&) { return *this; }
  };
  std::string type_;
  Hooks hooks_;
};

// y = x W^T + b. W is [out, in]. kColumn splits the outputs (W rows, b) across the
// tensor-parallel group, kRow splits the inputs (W columns) and sums partial outputs.
class Linear final : public Module {
 public:
  enum class Parallel { kNone, kColumn, kRow };
  Linear(int64_t in, int64_t out, Generator& gen, Parallel parallel = Parallel::kNone,
         bool bias = true);
  std::unique_ptr<Module> Clone() const override { return std::make_unique<Linear>(*this); }
  std::vector<NamedParam> OwnParameters() override;
  Parallel parallel() const { return parallel_; }
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

  Linear(const Linear&) = default;

 protected:
  Mat Forward(const Mat& x) override;
  Mat Backward(const Mat& dy) override;

 private:
  int64_t in_, out_;
  Parallel parallel_;
  bool has_bias_;
  Parameter weight_, bias_;
  Mat x_;
};

class Gelu final : public Module {
 public:
  Gelu() : Module("Gelu") {}
  std::unique_ptr<Module> Clone() const override { return std::make_unique<Gelu>(*this); }
  Gelu(const Gelu&) = default;

 protected:
  Mat Forward(const Mat& x) override;
  Mat Backward(const Mat& dy) override;

 private:
  Mat x_;
};

// Normalises each row over its features, then scales and shifts.
class LayerNorm final : public Module {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  std::unique_ptr<Module> Clone() const override { return std::make_unique<LayerNorm>(*this); }
  std::vector<NamedParam> OwnParameters() override;
  LayerNorm(const LayerNorm&) = default;

 protected:
  Mat Forward(const Mat& x) override;
  Mat Backward(const Mat& dy) override;

 private:
  int64_t dim_;
  float eps_;
  Parameter weight_, bias_;
  Mat xhat_;
  std::vector<float> rstd_;
};

// Token embedding, mean-pooled over the context: x is [batch, context] token ids
// (stored as floats, exact below 2^24), y is [batch, dim].
class EmbeddingBag final : public Module {
 public:
  EmbeddingBag(int64_t vocab, int64_t dim, Generator& gen);
  std::unique_ptr<Module> Clone() const override { return std::make_unique<EmbeddingBag>(*this); }
  std::vector<NamedParam> OwnParameters() override;
  EmbeddingBag(const EmbeddingBag&) = default;

 protected:
  Mat Forward(const Mat& x) override;
  Mat Backward(const Mat& dy) override;

 private:
  int64_t vocab_, dim_;
  Parameter weight_;
  Mat x_;
};

// Children "0", "1", ... run in order.
class Sequential final : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential& Add(std::unique_ptr<Module> m);
  std::unique_ptr<Module> Clone() const override;
  std::vector<NamedModule> Children() override;
  std::size_t size() const { return children_.size(); }
  Module& operator[](std::size_t i) { return *children_[i]; }

 protected:
  Mat Forward(const Mat& x) override;
  Mat Backward(const Mat& dy) override;

 private:
  std::vector<std::unique_ptr<Module>> children_;
};

// A pre-norm residual MLP block, transformer style: y = x + fc2(gelu(fc1(norm(x)))),
// with fc1 column-parallel and fc2 row-parallel (one all-reduce per direction under TP).
class MlpBlock final : public Module {
 public:
  MlpBlock(int64_t dim, int64_t hidden, Generator& gen);
  std::unique_ptr<Module> Clone() const override;
  std::vector<NamedModule> Children() override;

 protected:
  Mat Forward(const Mat& x) override;
  Mat Backward(const Mat& dy) override;

 private:
  MlpBlock(const MlpBlock& other);
  std::unique_ptr<LayerNorm> norm_;
  std::unique_ptr<Linear> fc1_;
  std::unique_ptr<Gelu> act_;
  std::unique_ptr<Linear> fc2_;
};

// Mean softmax cross-entropy over the rows of `logits`; writes d(loss)/d(logits)
// into `dlogits` when not null.
float CrossEntropy(const Mat& logits, const std::vector<int32_t>& labels, Mat* dlogits);

// Deterministic sum over the group, bit-identical on every rank (ranks are summed in
// rank order). COLLECTIVE over `comm`.
void AllReduceSum(Comm& comm, float* data, std::size_t count);

}  // namespace ckpt::runtime
