// The accelerator: registry, parameter layout, FSDP / DDP hooks, save_state / load_state.
#include "ckpt/runtime/accelerator.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/error.h"
#include "runtime/internal.h"

namespace ckpt::runtime {
namespace {

using json = nlohmann::json;

// Copies `box` of a row-major tensor of `shape` between `full` and `part` (row-major
// over box.sizes): to_full true writes part into full, false reads full into part.
void CopyBox(const Shape& shape, const Box& box, float* full, float* part, bool to_full) {
  internal::ForEachRun(shape, box, [&](int64_t g, int64_t l, int64_t run) {
    const auto bytes = static_cast<std::size_t>(run) * sizeof(float);
    if (to_full) std::memcpy(full + g, part + l, bytes);
    else std::memcpy(part + l, full + g, bytes);
  });
}

uint64_t Fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool PrefixesClash(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto nested = [](const std::string& outer, const std::string& inner) {
    return inner.size() > outer.size() && inner.compare(0, outer.size(), outer) == 0 &&
           inner[outer.size()] == '.';
  };
  return nested(a, b) || nested(b, a);
}

std::vector<uint8_t> SerializeBoxes(const std::vector<Box>& boxes) {
  std::vector<int64_t> v{static_cast<int64_t>(boxes.size())};
  for (const Box& b : boxes) {
    v.push_back(static_cast<int64_t>(b.sizes.size()));
    v.insert(v.end(), b.offsets.begin(), b.offsets.end());
    v.insert(v.end(), b.sizes.begin(), b.sizes.end());
  }
  std::vector<uint8_t> out(v.size() * sizeof(int64_t));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

std::vector<Box> DeserializeBoxes(const std::vector<uint8_t>& in) {
  std::vector<int64_t> v(in.size() / sizeof(int64_t));
  std::memcpy(v.data(), in.data(), v.size() * sizeof(int64_t));
  std::vector<Box> out;
  std::size_t i = 1;
  for (int64_t b = 0; b < v[0]; ++b) {
    const auto nd = static_cast<std::size_t>(v[i++]);
    Box box;
    box.offsets.assign(v.begin() + static_cast<std::ptrdiff_t>(i),
                       v.begin() + static_cast<std::ptrdiff_t>(i + nd));
    box.sizes.assign(v.begin() + static_cast<std::ptrdiff_t>(i + nd),
                     v.begin() + static_cast<std::ptrdiff_t>(i + 2 * nd));
    i += 2 * nd;
    out.push_back(std::move(box));
  }
  return out;
}

// Rank 0 receives each tensor of `sd` whole, one at a time, and hands it to `sink`;
// non-tensor entries go to `other` on rank 0. Every rank must pass the same keys in
// the same order. Pieces held identically by several ranks are sent once (by the
// lowest rank). Rank 0 copies its own pieces straight into the whole tensor and
// receives the others' in rounds of at most one tensor's bytes, so it never holds more
// than twice the tensor (what `report` records). COLLECTIVE.
void StreamFull(Comm& comm, StateDict& sd, uint64_t max_buffer_bytes, SaveFullReport& report,
                const std::function<void(const std::string&, const Tensor&, std::vector<float>&)>& sink,
                const std::function<void(const std::string&, const Entry&)>& other) {
  const bool root = comm.rank() == 0;
  for (auto& [key, entry] : sd) {
    if (!std::holds_alternative<Tensor>(entry)) {
      if (root) other(key, entry);
      continue;
    }
    const Tensor& t = std::get<Tensor>(entry);
    if (t.dtype != DType::kFloat32)
      throw Error(ErrorCode::kUnsupported, "'" + key + "': the runtime streams float32 tensors only");
    const uint64_t bytes = static_cast<uint64_t>(NumElements(t.shape)) * sizeof(float);
    report.largest_tensor_bytes = std::max(report.largest_tensor_bytes, bytes);
    report.total_tensor_bytes += bytes;
    std::vector<Box> mine;
    for (const Chunk& c : t.chunks) mine.push_back(c.box);
    auto all_boxes = comm.AllGather(SerializeBoxes(mine));
    // Owner of each distinct box: the lowest rank that holds it; the bytes each rank sends.
    const auto n = all_boxes.size();
    std::vector<std::vector<bool>> owns(n);
    std::vector<std::vector<Box>> boxes(n);
    std::vector<uint64_t> send_bytes(n, 0);
    std::vector<Box> seen;
    for (std::size_t r = 0; r < n; ++r) {
      boxes[r] = DeserializeBoxes(all_boxes[r]);
      for (const Box& b : boxes[r]) {
        const bool first = std::find(seen.begin(), seen.end(), b) == seen.end();
        if (first) seen.push_back(b);
        owns[r].push_back(first && b.NumElements() > 0);
        if (owns[r].back()) send_bytes[r] += static_cast<uint64_t>(b.NumElements()) * sizeof(float);
      }
    }
    all_boxes = {};
    // Rounds of senders (ranks 1..n-1, in order) whose pieces together fit in one tensor's
    // bytes (a piece larger than that goes alone). Every rank computes the same rounds.
    std::vector<std::vector<std::size_t>> rounds;
    uint64_t round_bytes = 0, staging = bytes;
    for (std::size_t r = 1; r < n; ++r) {
      if (send_bytes[r] == 0) continue;
      if (rounds.empty() || round_bytes + send_bytes[r] > bytes) {
        rounds.emplace_back();
        round_bytes = 0;
      }
      rounds.back().push_back(r);
      round_bytes += send_bytes[r];
      staging = std::max(staging, bytes + round_bytes);
    }
    if (max_buffer_bytes != 0 && staging > max_buffer_bytes)
      throw Error(ErrorCode::kInvalidArgument,
                  "'" + key + "': gathering it needs " + std::to_string(staging) +
                      " bytes on rank 0, more than the limit of " + std::to_string(max_buffer_bytes));
    const auto me = static_cast<std::size_t>(comm.rank());
    std::vector<float> full;
    if (root) {
      report.peak_buffer_bytes = std::max(report.peak_buffer_bytes, staging);
      full.assign(static_cast<std::size_t>(NumElements(t.shape)), 0.0f);
      for (std::size_t i = 0; i < t.chunks.size(); ++i)
        if (owns[0][i])
          CopyBox(t.shape, boxes[0][i], full.data(), static_cast<float*>(t.chunks[i].data), true);
    }
    for (const auto& round : rounds) {
      std::vector<uint8_t> payload;
      if (std::find(round.begin(), round.end(), me) != round.end()) {
        payload.reserve(send_bytes[me]);
        for (std::size_t i = 0; i < t.chunks.size(); ++i) {
          if (!owns[me][i]) continue;
          const auto len = static_cast<std::size_t>(t.chunks[i].box.NumElements()) * sizeof(float);
          const auto* src = static_cast<const uint8_t*>(t.chunks[i].data);
          payload.insert(payload.end(), src, src + len);
        }
      }
      auto pieces = comm.Gather(payload, 0);
      std::vector<uint8_t>().swap(payload);
      if (!root) continue;
      for (std::size_t r : round) {
        std::size_t off = 0;
        for (std::size_t i = 0; i < boxes[r].size(); ++i) {
          if (!owns[r][i]) continue;
          CopyBox(t.shape, boxes[r][i], full.data(),
                  reinterpret_cast<float*>(pieces[r].data() + off), true);
          off += static_cast<std::size_t>(boxes[r][i].NumElements()) * sizeof(float);
        }
        std::vector<uint8_t>().swap(pieces[r]);
      }
    }
    if (root) sink(key, t, full);
  }
}

// Agrees on the outcome across `comm` and throws on every rank if any rank failed. One
// message when every failing rank says the same thing, else "rank R: ..." lines.
void AgreeOrThrow(Comm& comm, const std::string& my_error, ErrorCode code) {
  if (comm.size() == 1) {
    if (!my_error.empty()) throw Error(code, my_error);
    return;
  }
  auto all = comm.AllGather(std::span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(my_error.data()), my_error.size()));
  std::set<std::string> distinct;
  for (const auto& b : all)
    if (!b.empty()) distinct.emplace(b.begin(), b.end());
  if (distinct.empty()) return;
  if (distinct.size() == 1) throw Error(code, *distinct.begin());
  throw Error(code, comm.AgreeOnErrors(my_error));
}

}  // namespace

std::string_view StrategyName(Strategy s) {
  switch (s) {
    case Strategy::kDdp: return "ddp";
    case Strategy::kFsdp: return "fsdp";
    case Strategy::kTp: return "tp";
    case Strategy::kFsdpTp: return "fsdp_tp";
  }
  return "?";
}

Strategy StrategyFromName(std::string_view name) {
  for (Strategy s : {Strategy::kDdp, Strategy::kFsdp, Strategy::kTp, Strategy::kFsdpTp})
    if (StrategyName(s) == name) return s;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown strategy '" + std::string(name) + "', expected ddp, fsdp, tp or fsdp_tp");
}

// ---- DistributedModel ------------------------------------------------------------

// FSDP: gathers a module's sharded parameters before it computes and frees them after;
// reduce-scatters their gradients after backward. DDP: all-reduces the gradients.
class DistributedModel::FsdpHook final : public ModuleHook {
 public:
  FsdpHook(DistributedModel& model, Comm& dp, bool shard) : model_(&model), dp_(&dp), shard_(shard) {}

  void PreForward(Module& m) override { Gather(m, false); }
  void PostForward(Module& m) override { Free(m); }
  void PreBackward(Module& m) override { Gather(m, true); }
  void PostBackward(Module& m) override {
    const auto inv = 1.0f / static_cast<float>(dp_->size());
    for (auto& [name, p] : m.OwnParameters()) {
      if (p->is_buffer) continue;
      if (!shard_ || !p->fsdp_sharded) {  // replicated across dp (DDP, or a 0-D tensor)
        if (dp_->size() > 1) {
          AllReduceSum(*dp_, p->grad.data(), p->grad.size());
          ++model_->stats_.all_reduces;
          for (float& g : p->grad) g *= inv;
        }
        continue;
      }
      const auto [maxrows, row] = Rows(*p);
      const int n = dp_->size();
      // Blocks of maxrows rows per rank; an even split is already laid out that way.
      std::vector<float> padded;
      const float* send = p->work_grad.data();
      if (maxrows * n != p->tp_box.sizes[0]) {
        padded.assign(static_cast<std::size_t>(n * maxrows * row), 0.0f);
        for (int r = 0; r < n; ++r) {
          const auto [b, c] = BalancedSplit(p->tp_box.sizes[0], n, r);
          std::copy_n(p->work_grad.data() + b * row, c * row, padded.data() + r * maxrows * row);
        }
        send = padded.data();
      }
      std::vector<float> recv(static_cast<std::size_t>(maxrows * row));
      dp_->ReduceScatter(send, recv.data(), static_cast<std::size_t>(maxrows * row),
                         DType::kFloat32, ReduceOp::kSum);
      ++model_->stats_.reduce_scatters;
      for (std::size_t j = 0; j < p->grad.size(); ++j) p->grad[j] += recv[j] * inv;
      Release(p->work_grad);
    }
    Free(m);
  }

 private:
  // Rows of the padded per-rank block, and elements per row of dim 0.
  std::pair<int64_t, int64_t> Rows(const Parameter& p) const {
    const int64_t rows = p.tp_box.sizes[0];
    const int64_t row = rows == 0 ? 0 : p.tp_numel() / rows;
    return {(rows + dp_->size() - 1) / dp_->size(), row};
  }
  void Gather(Module& m, bool for_backward) {
    if (!shard_) return;
    for (auto& [name, p] : m.OwnParameters()) {
      if (!p->fsdp_sharded) continue;
      const auto [maxrows, row] = Rows(*p);
      const int n = dp_->size();
      const auto block = static_cast<std::size_t>(maxrows * row);
      p->work.resize(static_cast<std::size_t>(p->tp_numel()));
      if (maxrows * n == p->tp_box.sizes[0]) {  // even split: gather straight into place
        dp_->AllGatherInto(p->data.data(), p->work.data(), block * sizeof(float));
      } else {  // uneven: pad every block to maxrows rows, then drop the padding
        std::vector<float> send(block, 0.0f);
        std::copy(p->data.begin(), p->data.end(), send.begin());
        std::vector<float> recv(block * static_cast<std::size_t>(n));
        dp_->AllGatherInto(send.data(), recv.data(), block * sizeof(float));
        for (int r = 0; r < n; ++r) {
          const auto [b, c] = BalancedSplit(p->tp_box.sizes[0], n, r);
          std::copy_n(recv.data() + r * maxrows * row, c * row, p->work.data() + b * row);
        }
      }
      ++model_->stats_.all_gathers;
      if (for_backward) p->work_grad.assign(p->work.size(), 0.0f);
    }
  }
  // Gives the buffer's memory back: `v = {}` would only clear it and keep its capacity,
  // so every rank would end up holding the whole model gathered.
  static void Release(std::vector<float>& v) { std::vector<float>().swap(v); }
  void Free(Module& m) {
    if (!shard_) return;
    for (auto& [name, p] : m.OwnParameters())
      if (p->fsdp_sharded) Release(p->work);
  }

  DistributedModel* model_;
  Comm* dp_;
  bool shard_;
};

DistributedModel::DistributedModel(Accelerator& accel, Module& module, const std::string& prefix)
    : accel_(&accel), module_(&module) {
  for (auto& [name, p] : module.NamedParameters()) params_.emplace_back(prefix + "." + name, p);
  const bool shard = accel.shards_parameters();
  if (shard || accel.dp_size() > 1) {
    for (auto& [name, m] : module.NamedModules()) {
      if (m->OwnParameters().empty()) continue;
      hooks_.push_back(std::make_unique<FsdpHook>(*this, accel.dp(), shard));
      m->AddHook(hooks_.back().get());
    }
  }
}

DistributedModel::~DistributedModel() {
  // The module outlives its accelerator (a REQUIRES of Prepare): leave it without hooks
  // or groups that point into the accelerator. Its parameters keep their local layout.
  for (auto& [name, m] : module_->NamedModules()) {
    for (auto& h : hooks_) m->RemoveHook(h.get());
    m->SetTpGroup(TpGroup{});
  }
}

Mat DistributedModel::Forward(const Mat& x) { return module_->Call(x); }
void DistributedModel::Backward(const Mat& dy) { module_->CallBackward(dy); }

std::size_t DistributedModel::num_hooks() const {
  std::size_t n = 0;
  for (auto& [name, m] : module_->NamedModules()) n += m->num_hooks();
  return n;
}

void DistributedModel::CollectState(const std::string&, StateDict& sd) {
  for (auto& [key, p] : params_) {
    p->Materialize();
    sd.Add(key, internal::ViewLike(*p, p->data.data()));
  }
}

// ---- Accelerator -----------------------------------------------------------------

Accelerator::Accelerator(Comm& world, const AcceleratorOptions& options)
    : world_(&world), options_(options) {
  const int n = world.size();
  int tp = 1;
  switch (options.strategy) {
    case Strategy::kDdp:
    case Strategy::kFsdp:
      if (options.tp_size > 1)
        throw Error(ErrorCode::kInvalidArgument, "tp_size is for the tp and fsdp_tp strategies");
      break;
    case Strategy::kTp: tp = options.tp_size > 0 ? options.tp_size : n; break;
    case Strategy::kFsdpTp:
      if (options.tp_size > 0) {
        tp = options.tp_size;
      } else {
        for (int d = 1; d * d <= n; ++d)
          if (n % d == 0) tp = d;
      }
      break;
  }
  if (tp <= 0 || n % tp != 0)
    throw Error(ErrorCode::kInvalidArgument, "tensor-parallel size " + std::to_string(tp) +
                                                 " does not divide the world size " +
                                                 std::to_string(n));
  const int dp_rank = world.rank() / tp, tp_rank = world.rank() % tp;
  tp_ = world.Split(dp_rank, tp_rank);
  dp_ = world.Split(tp_rank, dp_rank);
}

Accelerator::~Accelerator() = default;

bool Accelerator::shards_parameters() const {
  return options_.strategy == Strategy::kFsdp || options_.strategy == Strategy::kFsdpTp;
}

std::string Accelerator::MeshJson() const {
  json j;
  j["strategy"] = std::string(StrategyName(options_.strategy));
  j["world"] = world_->size();
  j["dims"] = {"dp", "tp"};
  j["shape"] = {dp_size(), tp_size()};
  j["placements"] = {
      {"dp", shards_parameters() ? "Shard(0) of each parameter and its optimizer state"
                                 : "Replicate"},
      {"tp", "Linear column-parallel: Shard(0); row-parallel: Shard(1); others Replicate"}};
  return j.dump();
}

const RegistryEntry* Accelerator::Find(const void* object) const {
  auto it = by_address_.find(object);
  return it == by_address_.end() ? nullptr : &registry_[it->second];
}

RegistryEntry& Accelerator::Register(const void* object, Stateful* handle, const std::string& kind,
                                     const std::string& prefix) {
  RegistryEntry e;
  e.object = object;
  e.handle = handle;
  e.kind = kind;
  e.prefix = prefix;
  e.order = static_cast<int>(registry_.size());
  registry_.push_back(e);
  by_address_[object] = registry_.size() - 1;
  by_address_[handle] = registry_.size() - 1;
  return registry_.back();
}

namespace {
void CheckPrefix(const std::vector<RegistryEntry>& registry, const std::string& prefix,
                 const std::string& kind) {
  if (prefix.empty() || prefix.front() == '.' || prefix.back() == '.')
    throw Error(ErrorCode::kInvalidArgument, "prepare: invalid checkpoint prefix '" + prefix + "'");
  for (const RegistryEntry& e : registry)
    if (PrefixesClash(e.prefix, prefix))
      throw Error(ErrorCode::kInvalidArgument,
                  "prepare: a different " + kind + " would save under prefix '" + prefix +
                      "', which clashes with the " + e.kind + " already prepared under '" +
                      e.prefix + "' (entry " + std::to_string(e.order) +
                      "); give each object its own prefix");
}
}  // namespace

void Accelerator::LayOut(Module& module) {
  const TpGroup group{tp_.get(), tp_rank(), tp_size()};
  for (auto& [name, m] : module.NamedModules()) m->SetTpGroup(group);
  const bool shard = shards_parameters();
  for (auto& [name, p] : module.NamedParameters()) {
    Box tp_box = Box::Full(p->shape);
    if (p->tp_dim >= 0 && tp_size() > 1) {
      const auto d = static_cast<std::size_t>(p->tp_dim);
      const auto [b, c] = BalancedSplit(p->shape[d], tp_size(), tp_rank());
      tp_box.offsets[d] = b;
      tp_box.sizes[d] = c;
    }
    Box local = tp_box;
    if (shard && !p->is_buffer && !p->shape.empty() && dp_size() > 1) {
      const auto [b, c] = BalancedSplit(tp_box.sizes[0], dp_size(), dp_rank());
      local.offsets[0] = tp_box.offsets[0] + b;
      local.sizes[0] = c;
    }
    if (p->materialized) {  // values given: keep the local part
      std::vector<float> part(static_cast<std::size_t>(local.NumElements()));
      CopyBox(p->shape, local, p->data.data(), part.data(), false);
      p->data = std::move(part);
      p->grad.assign(p->is_buffer ? 0 : p->data.size(), 0.0f);
    }
    p->tp_box = tp_box;
    p->local_box = local;
    p->Materialize();  // deferred init: computes the local part only
    p->fsdp_sharded = !(local == tp_box);
    ++p->wraps;
  }
}

DistributedModel& Accelerator::Prepare(Module& module, const std::string& prefix) {
  if (const RegistryEntry* e = Find(&module)) {
    if (e->kind != "model")
      throw Error(ErrorCode::kInvalidArgument, "prepare: object already prepared as a " + e->kind);
    return *static_cast<DistributedModel*>(e->handle);
  }
  CheckPrefix(registry_, prefix, "model");
  for (auto& [name, p] : module.NamedParameters())
    if (p->wraps != 0 || !(p->local_box == Box::Full(p->shape)))
      throw Error(ErrorCode::kInvalidArgument,
                  "prepare: parameter '" + name + "' of the " + module.type() +
                      " for prefix '" + prefix +
                      "' is already laid out by another prepare (a sub-module of a prepared "
                      "model, or a copy made after prepare); deep-copy before preparing");
  LayOut(module);
  models_.push_back(std::unique_ptr<DistributedModel>(new DistributedModel(*this, module, prefix)));
  Register(&module, models_.back().get(), "model", prefix);
  return *models_.back();
}

DistributedModel& Accelerator::Prepare(DistributedModel& handle) {
  const RegistryEntry* e = Find(&handle);
  if (!e)
    throw Error(ErrorCode::kInvalidArgument, "prepare: this model handle belongs to another accelerator");
  return handle;
}

Optimizer& Accelerator::Prepare(Optimizer& optimizer, const std::string& prefix) {
  if (const RegistryEntry* e = Find(&optimizer)) return *static_cast<Optimizer*>(e->handle);
  CheckPrefix(registry_, prefix, "optimizer");
  std::unordered_map<const Parameter*, std::string> keys;
  for (auto& m : models_)
    for (auto& [key, p] : m->keyed_parameters()) keys[p] = key;
  std::vector<std::string> param_keys;
  for (std::size_t i = 0; i < optimizer.num_params(); ++i) {
    auto it = keys.find(&optimizer.param(i));
    if (it == keys.end())
      throw Error(ErrorCode::kInvalidArgument,
                  "prepare: parameter " + std::to_string(i) + " of optimizer '" + prefix +
                      "' belongs to no prepared model; prepare the model first");
    param_keys.push_back(it->second);
  }
  optimizer.Bind(std::move(param_keys));
  Register(&optimizer, &optimizer, optimizer.Kind(), prefix);
  return optimizer;
}

DataLoader& Accelerator::Prepare(DataLoader& loader, const std::string& prefix) {
  if (const RegistryEntry* e = Find(&loader)) return *static_cast<DataLoader*>(e->handle);
  CheckPrefix(registry_, prefix, "dataloader");
  loader.SetDataParallel(dp_rank(), dp_size());
  Register(&loader, &loader, loader.Kind(), prefix);
  return loader;
}

Stateful& Accelerator::Prepare(Stateful& object, const std::string& prefix) {
  if (const RegistryEntry* e = Find(&object)) return *e->handle;
  if (auto* o = dynamic_cast<Optimizer*>(&object)) return Prepare(*o, prefix);
  if (auto* d = dynamic_cast<DataLoader*>(&object)) return Prepare(*d, prefix);
  if (dynamic_cast<DistributedModel*>(&object))
    throw Error(ErrorCode::kInvalidArgument, "prepare: this model handle belongs to another accelerator");
  CheckPrefix(registry_, prefix, object.Kind());
  Register(&object, &object, object.Kind(), prefix);
  return object;
}

LrScheduler& Accelerator::Prepare(LrScheduler& s, const std::string& prefix) {
  return static_cast<LrScheduler&>(Prepare(static_cast<Stateful&>(s), prefix));
}

Generator& Accelerator::Prepare(Generator& g, const std::string& prefix) {
  return static_cast<Generator&>(Prepare(static_cast<Stateful&>(g), prefix));
}

StateDict Accelerator::CollectState(StateDictType type) {
  StateDict sd;
  for (const RegistryEntry& e : registry_) {
    StateDict part;
    e.handle->CollectState(e.prefix, part);
    for (auto& [key, entry] : part)
      if (key.compare(0, e.prefix.size() + 1, e.prefix + ".") != 0)
        throw Error(ErrorCode::kInternal, "the " + e.kind + " under '" + e.prefix +
                                              "' produced key '" + key + "' outside its prefix");
    if (type != StateDictType::kLocal) {
      for (auto& [key, entry] : part) sd.Add(key, std::move(entry));
      continue;
    }
    // LOCAL: this object's tensors become one flat 1-D tensor, each rank's local parts
    // concatenated at its own offset: the layout-specific flat-parameter form.
    std::vector<Chunk> chunks;
    int64_t mine = 0;
    for (auto& [key, entry] : part) {
      if (!std::holds_alternative<Tensor>(entry)) {
        sd.Add(key, std::move(entry));
        continue;
      }
      for (const Chunk& c : std::get<Tensor>(entry).chunks) {
        const int64_t n = c.box.NumElements();
        if (n == 0) continue;
        chunks.push_back(Chunk{Box{{mine}, {n}}, c.data});
        mine += n;
      }
    }
    auto counts = world_->AllGather(std::span<const uint8_t>(
        reinterpret_cast<const uint8_t*>(&mine), sizeof(mine)));
    int64_t offset = 0, total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      int64_t n = 0;
      std::memcpy(&n, counts[r].data(), sizeof(n));
      if (static_cast<int>(r) < world_->rank()) offset += n;
      total += n;
    }
    if (total == 0) continue;
    for (Chunk& c : chunks) c.box.offsets[0] += offset;
    sd.Add(e.prefix + "._flat", Tensor::Sharded(DType::kFloat32, {total}, std::move(chunks)));
  }
  return sd;
}

std::string Accelerator::LayoutName() const {
  return std::string(StrategyName(options_.strategy)) + ", world " + std::to_string(world_->size()) +
         " (dp " + std::to_string(dp_size()) + " x tp " + std::to_string(tp_size()) + ")";
}

std::string Accelerator::LayoutFingerprint() {
  std::string s = MeshJson();
  for (auto& m : models_)
    for (auto& [key, p] : m->keyed_parameters()) {
      s += key;
      for (int64_t d : p->shape) s += "," + std::to_string(d);
      s += ";";
    }
  for (const RegistryEntry& e : registry_) s += e.prefix + ":" + e.kind + ";";
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(Fnv1a(s)));
  return buf;
}

void Accelerator::SaveState(const std::filesystem::path& dir, const SaveStateOptions& options) {
  if (options.state_dict_type == StateDictType::kFull) {  // whole tensors, streamed via rank 0
    if (options.compression.codec != Compression::Codec::kNone)
      throw Error(ErrorCode::kUnsupported, "save_state: FULL exports are written uncompressed");
    SaveFullOptions fo;
    fo.overwrite = options.overwrite;
    SaveFull(dir, fo);
    return;
  }
  StateDict sd = CollectState(options.state_dict_type);
  Save(dir, sd, *world_, CoreSaveOptions(options));
}

SaveOptions Accelerator::CoreSaveOptions(const SaveStateOptions& options) {
  json user;
  user["ckpt_runtime"] = {{"strategy", std::string(StrategyName(options_.strategy))},
                          {"world", world_->size()},
                          {"dp", dp_size()},
                          {"tp", tp_size()},
                          {"layout", LayoutFingerprint()}};
  json reg = json::array();
  for (const RegistryEntry& e : registry_) reg.push_back({{"prefix", e.prefix}, {"kind", e.kind}});
  user["ckpt_runtime"]["registry"] = reg;
  SaveOptions so;
  so.state_dict_type = options.state_dict_type;
  so.overwrite = options.overwrite;
  so.s3 = options.s3;
  so.compression = options.compression;
  so.user_metadata = user.dump();
  so.mesh = MeshJson();
  return so;
}

SaveHandle Accelerator::SaveStateAsync(const std::filesystem::path& dir, const SaveStateOptions& options,
                                       std::function<void(Comm&)> on_commit) {
  if (options.state_dict_type == StateDictType::kFull)
    throw Error(ErrorCode::kUnsupported, "save_state_async: FULL exports are synchronous (SaveFull)");
  StateDict sd = CollectState(options.state_dict_type);
  AsyncSaveOptions so;
  static_cast<SaveOptions&>(so) = CoreSaveOptions(options);
  so.on_commit = std::move(on_commit);
  return SaveAsync(dir, sd, *world_, so);
}

LoadReport Accelerator::LoadState(const std::filesystem::path& dir, const LoadStateOptions& options) {
  StateDict sd = CollectState(options.state_dict_type);
  std::string error;
  if (options.state_dict_type == StateDictType::kLocal) {
    // The core refuses LOCAL into another type; a LOCAL checkpoint of another layout
    // would have the same flat keys, so compare the layout the runtime recorded.
    try {
      const Metadata md = ReadMetadata(dir, /*resolve=*/false);  // metadata.json alone
      if (md.state_dict_type == StateDictType::kLocal) {
        const json user = json::parse(md.user.empty() ? "{}" : md.user);
        const std::string saved = user.contains("ckpt_runtime")
                                      ? user["ckpt_runtime"].value("layout", std::string("?"))
                                      : std::string("?");
        if (saved != LayoutFingerprint()) {
          std::string was = "another layout";
          if (user.contains("ckpt_runtime")) {
            const json& r = user["ckpt_runtime"];
            was = r.value("strategy", std::string("?")) + ", world " +
                  std::to_string(r.value("world", 0)) + " (dp " +
                  std::to_string(r.value("dp", 0)) + " x tp " + std::to_string(r.value("tp", 0)) + ")";
          }
          error = dir.string() + ": the LOCAL checkpoint was saved by " + was +
                  " and cannot be loaded as LOCAL by " + LayoutName() +
                  ": LOCAL state loads only into the identical layout (save SHARDED to change "
                  "strategy or world size)";
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  AgreeOrThrow(*world_, error, ErrorCode::kMismatch);
  LoadOptions lo;
  lo.state_dict_type = options.state_dict_type;
  lo.strict = options.strict;
  lo.s3 = options.s3;
  LoadReport report = Load(dir, sd, *world_, lo);
  error.clear();
  try {
    for (const RegistryEntry& e : registry_) e.handle->RestoreState(e.prefix, sd);
  } catch (const std::exception& e) {
    error = e.what();
  }
  AgreeOrThrow(*world_, error, ErrorCode::kMismatch);
  return report;
}

SaveFullReport Accelerator::SaveFull(const std::filesystem::path& dir, const SaveFullOptions& options) {
  StateDict sd = CollectState(StateDictType::kSharded);
  SaveFullReport report;
  std::unique_ptr<CheckpointWriter> writer;
  std::string error;
  if (world_->rank() == 0) {
    try {
      CheckpointWriter::Options wo;
      wo.state_dict_type = StateDictType::kFull;
      wo.world_size = 1;
      wo.num_files = 1;
      wo.overwrite = options.overwrite;
      wo.mesh = MeshJson();
      writer = CheckpointWriter::Create(dir, wo);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  AgreeOrThrow(*world_, error, ErrorCode::kIO);
  auto guard = [&](auto&& fn) {
    if (!error.empty()) return;
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  try {
    StreamFull(
        *world_, sd, options.max_buffer_bytes, report,
        [&](const std::string& key, const Tensor& t, std::vector<float>& full) {
          guard([&] { writer->WriteChunk(key, t.dtype, t.shape, Box::Full(t.shape), full.data()); });
        },
        [&](const std::string& key, const Entry& e) {
          guard([&] {
            if (const auto* s = std::get_if<Scalar>(&e)) writer->WriteScalar(key, *s);
            else if (const auto* b = std::get_if<Bytes>(&e)) writer->WriteBytes(key, b->data);
            else if (const auto* j = std::get_if<Json>(&e)) writer->WriteJson(key, j->text);
          });
        });
  } catch (const std::exception& e) {
    if (error.empty()) error = e.what();
  }
  if (world_->rank() == 0) guard([&] { writer->Commit(); });
  AgreeOrThrow(*world_, error, ErrorCode::kIO);
  return report;
}

std::vector<std::pair<std::string, std::vector<float>>> Accelerator::GatherFullTensors() {
  StateDict sd = CollectState(StateDictType::kSharded);
  SaveFullReport report;
  std::vector<std::pair<std::string, std::vector<float>>> out;
  StreamFull(
      *world_, sd, 0, report,
      [&](const std::string& key, const Tensor&, std::vector<float>& full) {
        out.emplace_back(key, std::move(full));
      },
      [](const std::string&, const Entry&) {});
  return out;
}

}  // namespace ckpt::runtime
