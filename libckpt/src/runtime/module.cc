// Modules: forward and backward on the CPU, matrix products through cblas.
#include "ckpt/runtime/module.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "ckpt/error.h"
#include "ckpt/runtime/data.h"
#include "runtime/internal.h"

namespace ckpt::runtime {
namespace {

int Dim(int64_t n) { return static_cast<int>(n); }

// C[m, n] = alpha * op(A) op(B) + beta * C, row-major; a no-op product when a size is 0.
void Gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f) std::fill(c, c + m * ldc, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              Dim(m), Dim(n), Dim(k), 1.0f, a, Dim(std::max<int64_t>(lda, 1)), b,
              Dim(std::max<int64_t>(ldb, 1)), beta, c, Dim(std::max<int64_t>(ldc, 1)));
}

void CheckCols(const Mat& x, int64_t cols, const char* what) {
  if (x.cols != cols)
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + ": input has " +
                                                 std::to_string(x.cols) + " features, expected " +
                                                 std::to_string(cols));
}

}  // namespace

void AllReduceSum(Comm& comm, float* data, std::size_t count) {
  if (comm.size() == 1 || count == 0) return;
  // The Comm contract reduces in rank order on every rank (ThreadComm, the generic
  // fallback): the result is bit-identical everywhere, which keeps replicas equal.
  comm.AllReduce(data, count, DType::kFloat32, ReduceOp::kSum);
}

Parameter Parameter::Make(Shape shape, int tp_dim, bool allocate) {
  Parameter p;
  p.shape = shape;
  p.tp_dim = tp_dim;
  p.tp_box = Box::Full(shape);
  p.local_box = p.tp_box;
  p.materialized = false;
  if (allocate) p.Materialize();
  return p;
}

void Parameter::DeferUniform(Generator& gen, float lo, float hi) {
  init = ParamInit{ParamInit::Kind::kUniform, lo, hi, gen.seed(), gen.offset()};
  gen.Skip(static_cast<uint64_t>(NumElements(shape)));
  data = {};
  grad = {};
  materialized = false;
}

void Parameter::DeferNormal(Generator& gen, float mean, float stddev) {
  init = ParamInit{ParamInit::Kind::kNormal, mean, stddev, gen.seed(), gen.offset()};
  gen.Skip(2 * static_cast<uint64_t>(NumElements(shape)));
  data = {};
  grad = {};
  materialized = false;
}

void Parameter::Materialize() {
  if (materialized) return;
  data.assign(static_cast<std::size_t>(local_box.NumElements()), 0.0f);
  internal::ForEachRun(shape, local_box, [&](int64_t g, int64_t l, int64_t run) {
    if (init.kind == ParamInit::Kind::kValues) return;  // zeros
    for (int64_t i = 0; i < run; ++i) {
      const auto gi = static_cast<uint64_t>(g + i);
      data[static_cast<std::size_t>(l + i)] =
          init.kind == ParamInit::Kind::kUniform
              ? Generator::UniformAt(init.seed, init.offset + gi, init.a, init.b)
              : init.a + init.b * Generator::NormalAt(init.seed, init.offset + 2 * gi);
    }
  });
  grad.assign(is_buffer ? 0 : data.size(), 0.0f);
  materialized = true;
}

Mat Module::Call(const Mat& x) {
  for (ModuleHook* h : hooks_.v) h->PreForward(*this);
  Mat y = Forward(x);
  for (ModuleHook* h : hooks_.v) h->PostForward(*this);
  return y;
}

Mat Module::CallBackward(const Mat& dy) {
  for (ModuleHook* h : hooks_.v) h->PreBackward(*this);
  Mat dx = Backward(dy);
  for (ModuleHook* h : hooks_.v) h->PostBackward(*this);
  return dx;
}

std::vector<Module::NamedParam> Module::NamedParameters() {
  std::vector<NamedParam> out;
  for (auto& [name, m] : NamedModules())
    for (auto& [pname, p] : m->OwnParameters())
      out.emplace_back(name.empty() ? pname : name + "." + pname, p);
  return out;
}

std::vector<Module::NamedModule> Module::NamedModules() {
  std::vector<NamedModule> out{{"", this}};
  for (auto& [name, child] : Children())
    for (auto& [sub, m] : child->NamedModules())
      out.emplace_back(sub.empty() ? name : name + "." + sub, m);
  return out;
}

void Module::ZeroGrad() {
  for (auto& [name, p] : NamedParameters()) std::fill(p->grad.begin(), p->grad.end(), 0.0f);
}

// ---- Linear ----------------------------------------------------------------------

Linear::Linear(int64_t in, int64_t out, Generator& gen, Parallel parallel, bool bias)
    : Module("Linear"), in_(in), out_(out), parallel_(parallel), has_bias_(bias) {
  weight_ = Parameter::Make({out, in},
                            parallel == Parallel::kColumn ? 0 : parallel == Parallel::kRow ? 1 : -1,
                            false);
  bias_ = Parameter::Make({bias ? out : 0}, parallel == Parallel::kColumn ? 0 : -1, false);
  const float bound = 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(in, 1)));
  weight_.DeferUniform(gen, -bound, bound);
  if (bias) bias_.DeferUniform(gen, -bound, bound);
}

std::vector<Module::NamedParam> Linear::OwnParameters() {
  std::vector<NamedParam> out{{"weight", &weight_}};
  if (has_bias_) out.emplace_back("bias", &bias_);
  return out;
}

Mat Linear::Forward(const Mat& x) {
  const int64_t o = weight_.tp_box.sizes[0], i = weight_.tp_box.sizes[1];
  CheckCols(x, i, "Linear");
  x_ = x;
  Mat y(x.rows, o);
  Gemm(false, true, x.rows, o, i, x.data(), i, weight_.value(), i, 0.0f, y.data(), o);
  if (parallel_ == Parallel::kRow && tp_.size > 1) AllReduceSum(*tp_.comm, y.data(), y.v.size());
  if (has_bias_) {
    const float* b = bias_.value();
    for (int64_t r = 0; r < y.rows; ++r)
      for (int64_t c = 0; c < o; ++c) y.at(r, c) += b[c];
  }
  return y;
}

Mat Linear::Backward(const Mat& dy) {
  const int64_t o = weight_.tp_box.sizes[0], i = weight_.tp_box.sizes[1];
  CheckCols(dy, o, "Linear backward");
  Gemm(true, false, o, i, dy.rows, dy.data(), o, x_.data(), i, 1.0f, weight_.grad_value(), i);
  if (has_bias_) {
    float* db = bias_.grad_value();
    for (int64_t r = 0; r < dy.rows; ++r)
      for (int64_t c = 0; c < o; ++c) db[c] += dy.at(r, c);
  }
  Mat dx(dy.rows, i);
  Gemm(false, false, dy.rows, i, o, dy.data(), o, weight_.value(), i, 0.0f, dx.data(), i);
  if (parallel_ == Parallel::kColumn && tp_.size > 1)
    AllReduceSum(*tp_.comm, dx.data(), dx.v.size());
  x_ = Mat();
  return dx;
}

// ---- Gelu ------------------------------------------------------------------------

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluC = 0.044715f;
}  // namespace

Mat Gelu::Forward(const Mat& x) {
  x_ = x;
  Mat y(x.rows, x.cols);
  for (std::size_t j = 0; j < x.v.size(); ++j) {
    const float v = x.v[j];
    y.v[j] = 0.5f * v * (1.0f + std::tanh(kGeluK * (v + kGeluC * v * v * v)));
  }
  return y;
}

Mat Gelu::Backward(const Mat& dy) {
  Mat dx(dy.rows, dy.cols);
  for (std::size_t j = 0; j < dy.v.size(); ++j) {
    const float v = x_.v[j];
    const float t = std::tanh(kGeluK * (v + kGeluC * v * v * v));
    const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * v * v);
    dx.v[j] = dy.v[j] * d;
  }
  x_ = Mat();
  return dx;
}

// ---- LayerNorm -------------------------------------------------------------------

LayerNorm::LayerNorm(int64_t dim, float eps) : Module("LayerNorm"), dim_(dim), eps_(eps) {
  weight_ = Parameter::Make({dim});
  bias_ = Parameter::Make({dim});
  std::fill(weight_.data.begin(), weight_.data.end(), 1.0f);
}

std::vector<Module::NamedParam> LayerNorm::OwnParameters() {
  return {{"weight", &weight_}, {"bias", &bias_}};
}

Mat LayerNorm::Forward(const Mat& x) {
  CheckCols(x, dim_, "LayerNorm");
  xhat_ = Mat(x.rows, dim_);
  rstd_.assign(static_cast<std::size_t>(x.rows), 0.0f);
  Mat y(x.rows, dim_);
  const float* g = weight_.value();
  const float* b = bias_.value();
  for (int64_t r = 0; r < x.rows; ++r) {
    float mean = 0.0f;
    for (int64_t c = 0; c < dim_; ++c) mean += x.at(r, c);
    mean /= static_cast<float>(dim_);
    float var = 0.0f;
    for (int64_t c = 0; c < dim_; ++c) var += (x.at(r, c) - mean) * (x.at(r, c) - mean);
    var /= static_cast<float>(dim_);
    const float rstd = 1.0f / std::sqrt(var + eps_);
    rstd_[static_cast<std::size_t>(r)] = rstd;
    for (int64_t c = 0; c < dim_; ++c) {
      const float h = (x.at(r, c) - mean) * rstd;
      xhat_.at(r, c) = h;
      y.at(r, c) = h * g[c] + b[c];
    }
  }
  return y;
}

Mat LayerNorm::Backward(const Mat& dy) {
  Mat dx(dy.rows, dim_);
  const float* g = weight_.value();
  float* dg = weight_.grad_value();
  float* db = bias_.grad_value();
  for (int64_t r = 0; r < dy.rows; ++r) {
    float m1 = 0.0f, m2 = 0.0f;
    for (int64_t c = 0; c < dim_; ++c) {
      const float d = dy.at(r, c), h = xhat_.at(r, c);
      dg[c] += d * h;
      db[c] += d;
      m1 += d * g[c];
      m2 += d * g[c] * h;
    }
    m1 /= static_cast<float>(dim_);
    m2 /= static_cast<float>(dim_);
    const float rstd = rstd_[static_cast<std::size_t>(r)];
    for (int64_t c = 0; c < dim_; ++c)
      dx.at(r, c) = rstd * (dy.at(r, c) * g[c] - m1 - xhat_.at(r, c) * m2);
  }
  xhat_ = Mat();
  return dx;
}

// ---- EmbeddingBag ----------------------------------------------------------------

EmbeddingBag::EmbeddingBag(int64_t vocab, int64_t dim, Generator& gen)
    : Module("EmbeddingBag"), vocab_(vocab), dim_(dim) {
  weight_ = Parameter::Make({vocab, dim}, -1, false);
  weight_.DeferNormal(gen, 0.0f, 1.0f);
}

std::vector<Module::NamedParam> EmbeddingBag::OwnParameters() { return {{"weight", &weight_}}; }

Mat EmbeddingBag::Forward(const Mat& x) {
  x_ = x;
  Mat y(x.rows, dim_);
  const float* w = weight_.value();
  const float scale = 1.0f / static_cast<float>(std::max<int64_t>(x.cols, 1));
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t j = 0; j < x.cols; ++j) {
      const auto t = static_cast<int64_t>(x.at(r, j));
      if (t < 0 || t >= vocab_)
        throw Error(ErrorCode::kInvalidArgument, "EmbeddingBag: token " + std::to_string(t) +
                                                     " outside the vocabulary of " +
                                                     std::to_string(vocab_));
      for (int64_t c = 0; c < dim_; ++c) y.at(r, c) += scale * w[t * dim_ + c];
    }
  return y;
}

Mat EmbeddingBag::Backward(const Mat& dy) {
  float* dw = weight_.grad_value();
  const float scale = 1.0f / static_cast<float>(std::max<int64_t>(x_.cols, 1));
  for (int64_t r = 0; r < x_.rows; ++r)
    for (int64_t j = 0; j < x_.cols; ++j) {
      const auto t = static_cast<int64_t>(x_.at(r, j));
      for (int64_t c = 0; c < dim_; ++c) dw[t * dim_ + c] += scale * dy.at(r, c);
    }
  x_ = Mat();
  return Mat();
}

// ---- Containers ------------------------------------------------------------------

Sequential& Sequential::Add(std::unique_ptr<Module> m) {
  children_.push_back(std::move(m));
  return *this;
}

std::unique_ptr<Module> Sequential::Clone() const {
  auto copy = std::make_unique<Sequential>();
  for (const auto& c : children_) copy->Add(c->Clone());
  return copy;
}

std::vector<Module::NamedModule> Sequential::Children() {
  std::vector<NamedModule> out;
  for (std::size_t i = 0; i < children_.size(); ++i)
    out.emplace_back(std::to_string(i), children_[i].get());
  return out;
}

Mat Sequential::Forward(const Mat& x) {
  Mat h = x;
  for (auto& c : children_) h = c->Call(h);
  return h;
}

Mat Sequential::Backward(const Mat& dy) {
  Mat g = dy;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) g = (*it)->CallBackward(g);
  return g;
}

MlpBlock::MlpBlock(int64_t dim, int64_t hidden, Generator& gen)
    : Module("MlpBlock"),
      norm_(std::make_unique<LayerNorm>(dim)),
      fc1_(std::make_unique<Linear>(dim, hidden, gen, Linear::Parallel::kColumn)),
      act_(std::make_unique<Gelu>()),
      fc2_(std::make_unique<Linear>(hidden, dim, gen, Linear::Parallel::kRow)) {}

MlpBlock::MlpBlock(const MlpBlock& other)
    : Module(other),
      norm_(std::make_unique<LayerNorm>(*other.norm_)),
      fc1_(std::make_unique<Linear>(*other.fc1_)),
      act_(std::make_unique<Gelu>(*other.act_)),
      fc2_(std::make_unique<Linear>(*other.fc2_)) {}

std::unique_ptr<Module> MlpBlock::Clone() const {
  return std::unique_ptr<Module>(new MlpBlock(*this));
}

std::vector<Module::NamedModule> MlpBlock::Children() {
  return {{"norm", norm_.get()}, {"fc1", fc1_.get()}, {"act", act_.get()}, {"fc2", fc2_.get()}};
}

Mat MlpBlock::Forward(const Mat& x) {
  Mat y = fc2_->Call(act_->Call(fc1_->Call(norm_->Call(x))));
  for (std::size_t j = 0; j < y.v.size(); ++j) y.v[j] += x.v[j];
  return y;
}

Mat MlpBlock::Backward(const Mat& dy) {
  Mat dx = norm_->CallBackward(fc1_->CallBackward(act_->CallBackward(fc2_->CallBackward(dy))));
  for (std::size_t j = 0; j < dx.v.size(); ++j) dx.v[j] += dy.v[j];
  return dx;
}

float CrossEntropy(const Mat& logits, const std::vector<int32_t>& labels, Mat* dlogits) {
  if (static_cast<int64_t>(labels.size()) != logits.rows)
    throw Error(ErrorCode::kInvalidArgument, "CrossEntropy: " + std::to_string(labels.size()) +
                                                 " labels for " + std::to_string(logits.rows) +
                                                 " rows");
  if (dlogits) *dlogits = Mat(logits.rows, logits.cols);
  double total = 0.0;
  const float inv = 1.0f / static_cast<float>(std::max<int64_t>(logits.rows, 1));
  for (int64_t r = 0; r < logits.rows; ++r) {
    float mx = logits.at(r, 0);
    for (int64_t c = 1; c < logits.cols; ++c) mx = std::max(mx, logits.at(r, c));
    float sum = 0.0f;
    for (int64_t c = 0; c < logits.cols; ++c) sum += std::exp(logits.at(r, c) - mx);
    const int32_t y = labels[static_cast<std::size_t>(r)];
    total += static_cast<double>(std::log(sum) - (logits.at(r, y) - mx));
    if (dlogits)
      for (int64_t c = 0; c < logits.cols; ++c)
        dlogits->at(r, c) = (std::exp(logits.at(r, c) - mx) / sum - (c == y ? 1.0f : 0.0f)) * inv;
  }
  return static_cast<float>(total / static_cast<double>(std::max<int64_t>(logits.rows, 1)));
}

}  // namespace ckpt::runtime
