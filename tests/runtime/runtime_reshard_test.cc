// Save under one strategy and world size, load under others: every parameter and
// optimizer-state value is bit-identical to what was saved (the seed's FSDP2 + TP
// save_state report: sharded state must round-trip into any layout).
#include <doctest/doctest.h>

#include <algorithm>
#include <tuple>

#include "ckpt/checkpoint.h"
#include "runtime_helpers.h"
#include "test_util.h"

using namespace ckpt::runtime;
using namespace ckpt::demo;
using rt_test::SmallConfig;

namespace {

struct Saved {
  rt_test::FullState tensors;
  int64_t step = 0;
  int64_t loader_index = 0;
};

Saved TrainAndSave(Strategy s, int world, int tp, const std::filesystem::path& dir,
                   const std::filesystem::path& full_dir) {
  Saved saved;
  ckpt::RunThreads(world, [&](ckpt::Comm& c) {
    Trainer t(c, SmallConfig(s, tp));
    for (int i = 0; i < 3; ++i) t.Step();
    auto full = rt_test::Gather(t.accelerator());
    t.accelerator().SaveState(dir);
    if (!full_dir.empty()) t.accelerator().SaveFull(full_dir);
    if (c.rank() == 0) {
      saved.tensors = std::move(full);
      saved.step = t.scheduler().last_step();
      saved.loader_index = t.loader().index();
    }
  });
  return saved;
}

void LoadAndCompare(const Saved& saved, const std::filesystem::path& dir, Strategy s, int world,
                    int tp = 0) {
  CAPTURE(StrategyName(s));
  CAPTURE(world);
  ckpt::RunThreads(world, [&](ckpt::Comm& c) {
    TrainerConfig cfg = SmallConfig(s, tp);
    cfg.init_seed = 99;  // different initial values: the load must overwrite them all
    Trainer t(c, cfg);
    ckpt::LoadReport report = t.accelerator().LoadState(dir);
    CHECK(report.ok());
    auto full = rt_test::Gather(t.accelerator());
    CHECK(t.scheduler().last_step() == saved.step);
    CHECK(t.loader().index() == saved.loader_index);
    CHECK(t.optimizer().lr() == doctest::Approx(t.scheduler().LrAt(saved.step)));
    if (c.rank() != 0) return;
    REQUIRE(full.size() == saved.tensors.size());
    for (const auto& [key, v] : saved.tensors) {
      CAPTURE(key);
      REQUIRE(full.count(key) == 1);
      CHECK(rt_test::BitEqual(full[key], v));
    }
  });
}

}  // namespace

TEST_CASE("FSDP x4 -> FSDP x2, TP x3, DDP x1, FSDPxTP 2x2, and FULL: bit-identical") {
  ckpt_test::TempDir tmp("reshard");
  const Saved saved = TrainAndSave(Strategy::kFsdp, 4, 0, tmp / "fsdp4", tmp / "full");
  // Optimizer state is part of what must survive.
  REQUIRE(saved.tensors.count("optimizer.state.model.blocks.0.fc1.weight.exp_avg_sq") == 1);
  LoadAndCompare(saved, tmp / "fsdp4", Strategy::kFsdp, 2);
  LoadAndCompare(saved, tmp / "fsdp4", Strategy::kTp, 3);
  LoadAndCompare(saved, tmp / "fsdp4", Strategy::kDdp, 1);
  LoadAndCompare(saved, tmp / "fsdp4", Strategy::kFsdpTp, 4, 2);

  // FULL: one chunk per tensor, the whole value, readable without the runtime.
  const ckpt::Metadata md = ckpt::ReadMetadata(tmp / "full");
  CHECK(md.state_dict_type == ckpt::StateDictType::kFull);
  auto reader = ckpt::CheckpointReader::Open(tmp / "full");
  for (const auto& [key, v] : saved.tensors) {
    CAPTURE(key);
    const ckpt::EntryMeta* e = md.Find(key);
    REQUIRE(e != nullptr);
    CHECK(e->chunks.size() == 1);
    std::vector<float> got(v.size());
    reader->ReadRegion(key, ckpt::Box::Full(e->shape), got.data());
    CHECK(rt_test::BitEqual(got, v));
  }
  // And the FULL checkpoint loads back into a sharded job.
  LoadAndCompare(saved, tmp / "full", Strategy::kFsdp, 3);
}

TEST_CASE("TP x2 and FSDPxTP 2x2 save, DDP x2 and FSDP x3 load") {
  ckpt_test::TempDir tmp("reshard2");
  const Saved tp = TrainAndSave(Strategy::kTp, 2, 0, tmp / "tp2", {});
  LoadAndCompare(tp, tmp / "tp2", Strategy::kDdp, 2);
  LoadAndCompare(tp, tmp / "tp2", Strategy::kFsdp, 3);
  const Saved mesh = TrainAndSave(Strategy::kFsdpTp, 4, 2, tmp / "mesh", {});
  LoadAndCompare(mesh, tmp / "mesh", Strategy::kTp, 3);
  LoadAndCompare(mesh, tmp / "mesh", Strategy::kDdp, 1);
}

TEST_CASE("DDP replicas are written once") {
  ckpt_test::TempDir tmp("ddp");
  TrainAndSave(Strategy::kDdp, 3, 0, tmp / "ddp3", {});
  const ckpt::Metadata md = ckpt::ReadMetadata(tmp / "ddp3");
  CHECK(md.world_size == 3);
  for (const auto& [key, e] : md.entries)
    if (e.kind == ckpt::EntryKind::kTensor) CHECK(e.chunks.size() == 1);
}

namespace {
// A module with a buffer: state without a gradient, replicated under every strategy.
class WithBuffer final : public ckpt::runtime::Module {
 public:
  WithBuffer() : Module("WithBuffer") {
    weight_ = Parameter::Make({6, 2});
    count_ = Parameter::Make({3});
    count_.is_buffer = true;
    count_.grad.clear();
    for (std::size_t i = 0; i < weight_.data.size(); ++i) weight_.data[i] = static_cast<float>(i);
  }
  std::unique_ptr<Module> Clone() const override { return std::make_unique<WithBuffer>(*this); }
  std::vector<NamedParam> OwnParameters() override { return {{"weight", &weight_}, {"count", &count_}}; }
  WithBuffer(const WithBuffer&) = default;
  Parameter weight_, count_;

 protected:
  Mat Forward(const Mat& x) override { return x; }
  Mat Backward(const Mat& dy) override { return dy; }
};
}  // namespace

TEST_CASE("buffers are replicated, saved once and restored; keys do not depend on the strategy") {
  ckpt_test::TempDir tmp("buf");
  ckpt::RunThreads(3, [&](ckpt::Comm& c) {
    WithBuffer m;
    Accelerator a(c, {Strategy::kFsdp});
    a.Prepare(m, "net");
    CHECK(m.weight_.data.size() == 4);  // 6 rows over 3 ranks
    CHECK(m.count_.data.size() == 3);   // the buffer stays whole
    m.count_.data = {1.f, 2.f, 3.f};
    a.SaveState(tmp / "b");
    m.count_.data = {0.f, 0.f, 0.f};
    a.LoadState(tmp / "b");
    CHECK(m.count_.data == std::vector<float>{1.f, 2.f, 3.f});
  });
  const ckpt::Metadata md = ckpt::ReadMetadata(tmp / "b");
  REQUIRE(md.Find("net.count") != nullptr);
  CHECK(md.Find("net.count")->chunks.size() == 1);
  CHECK(md.Find("net.weight")->chunks.size() == 3);

  std::vector<std::vector<std::string>> key_sets;
  for (auto [s, world, tp] : {std::tuple{Strategy::kDdp, 1, 0}, std::tuple{Strategy::kFsdp, 3, 0},
                              std::tuple{Strategy::kTp, 2, 0}, std::tuple{Strategy::kFsdpTp, 4, 2}}) {
    const auto dir = tmp / std::string(StrategyName(s));
    TrainAndSave(s, world, tp, dir, {});
    std::vector<std::string> keys;
    for (const auto& [k, e] : ckpt::ReadMetadata(dir).entries) keys.push_back(k);
    std::sort(keys.begin(), keys.end());
    key_sets.push_back(keys);
  }
  for (const auto& k : key_sets) CHECK(k == key_sets[0]);
}

TEST_CASE("compressed (zstd) sharded state loads bit-identically elsewhere") {
  ckpt_test::TempDir tmp("zstd");
  Saved saved;
  ckpt::RunThreads(3, [&](ckpt::Comm& c) {
    Trainer t(c, SmallConfig(Strategy::kFsdp));
    for (int i = 0; i < 2; ++i) t.Step();
    auto full = rt_test::Gather(t.accelerator());
    SaveStateOptions o;
    o.compression.codec = ckpt::Compression::Codec::kZstd;
    t.accelerator().SaveState(tmp / "z", o);
    if (c.rank() == 0) {
      saved.tensors = std::move(full);
      saved.step = t.scheduler().last_step();
      saved.loader_index = t.loader().index();
    }
  });
  const ckpt::Metadata md = ckpt::ReadMetadata(tmp / "z");
  CHECK(md.Find("model.head.weight")->chunks[0].compression.codec == ckpt::Compression::Codec::kZstd);
  LoadAndCompare(saved, tmp / "z", Strategy::kTp, 2);
}
