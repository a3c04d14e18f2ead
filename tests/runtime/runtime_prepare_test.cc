// Prepare-once: the seed scenario of shared/seeds (prepare() twice silently double-wraps
// and double-serializes). Preparing again returns the same handle and changes nothing.
#include <doctest/doctest.h>

#include <filesystem>

#include "ckpt/checkpoint.h"
#include "runtime_helpers.h"
#include "test_util.h"

using namespace ckpt::runtime;
using namespace ckpt::demo;
using rt_test::SmallConfig;
namespace fs = std::filesystem;

namespace {

struct Summary {
  std::vector<std::string> keys;
  std::size_t datasets = 0;
  uint64_t stored_bytes = 0;
  uint64_t file_bytes = 0;
};

Summary Summarize(const fs::path& dir) {
  const ckpt::Metadata md = ckpt::ReadMetadata(dir);
  Summary s;
  for (const auto& [key, e] : md.entries) {
    s.keys.push_back(key);
    s.datasets += e.chunks.size();
    for (const auto& c : e.chunks) s.stored_bytes += c.stored_bytes;
  }
  for (const auto& f : md.files) s.file_bytes += fs::file_size(dir / f.name);
  return s;
}

// A user object with state, prepared under its own prefix.
struct Counter final : Stateful {
  int64_t value = 0;
  void CollectState(const std::string& prefix, ckpt::StateDict& sd) override {
    sd.Add(prefix + ".value", ckpt::Scalar::Int(value));
  }
  void RestoreState(const std::string& prefix, const ckpt::StateDict& sd) override {
    value = std::get<ckpt::Scalar>(sd.At(prefix + ".value")).AsInt();
  }
};

// Trains two steps under `strategy` on 2 ranks, preparing everything `times` times
// (the module, then the handle, then the module again; optimizer likewise), and saves.
void TrainAndSave(Strategy strategy, int times, const fs::path& dir, CommStats* stats) {
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Trainer t(c, SmallConfig(strategy));  // prepares each object once
    Accelerator& a = t.accelerator();
    for (int i = 1; i < times; ++i) {
      DistributedModel& again = a.Prepare(t.module());
      CHECK(&again == &t.model());
      CHECK(&a.Prepare(again) == &t.model());
      CHECK(&a.Prepare(t.optimizer()) == &t.optimizer());
      CHECK(&a.Prepare(static_cast<Stateful&>(t.optimizer()), "optimizer2") == &t.optimizer());
      CHECK(&a.Prepare(t.loader()) == &t.loader());
      CHECK(&a.Prepare(t.scheduler()) == &t.scheduler());
      CHECK(&a.Prepare(t.rng()) == &t.rng());
    }
    CHECK(a.registry().size() == 5);
    t.Step();
    t.Step();
    a.SaveState(dir);
    if (c.rank() == 0 && stats) *stats = t.model().comm_stats();
  });
}

}  // namespace

TEST_CASE("preparing the same model twice and its handle a third time: one entry, depth one") {
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Generator gen(1);
    ClassifierConfig cfg = SmallConfig(Strategy::kFsdp).model;
    Classifier model(cfg, gen);
    Accelerator accel(c, {Strategy::kFsdp});
    DistributedModel& h1 = accel.Prepare(model);
    const std::size_t hooks = h1.num_hooks();
    const auto local = model.NamedParameters()[0].second->data.size();
    DistributedModel& h2 = accel.Prepare(model);
    DistributedModel& h3 = accel.Prepare(h1);
    CHECK(&h1 == &h2);
    CHECK(&h1 == &h3);
    CHECK(&h1.module() == &model);  // the handle wraps the module itself: depth one
    CHECK(accel.registry().size() == 1);
    CHECK(accel.registry()[0].kind == "model");
    CHECK(accel.registry()[0].prefix == "model");
    CHECK(accel.registry()[0].object == &model);
    CHECK(accel.registry()[0].handle == &h1);
    CHECK(accel.Find(&model) == accel.Find(&h1));
    CHECK(h1.num_hooks() == hooks);  // no second all-gather hook
    for (auto& [name, p] : model.NamedParameters()) CHECK(p->wraps == 1);
    CHECK(model.NamedParameters()[0].second->data.size() == local);  // not sharded twice
  });
}

TEST_CASE("seed scenario: the checkpoint of a twice-prepared job equals a once-prepared one") {
  for (Strategy s : {Strategy::kDdp, Strategy::kFsdp, Strategy::kTp}) {
    CAPTURE(StrategyName(s));
    ckpt_test::TempDir tmp("prep");
    CommStats once_stats, twice_stats;
    TrainAndSave(s, 1, tmp / "once", &once_stats);
    TrainAndSave(s, 3, tmp / "twice", &twice_stats);
    const Summary once = Summarize(tmp / "once"), twice = Summarize(tmp / "twice");
    CHECK(once.keys == twice.keys);
    CHECK(once.datasets == twice.datasets);
    CHECK(once.stored_bytes == twice.stored_bytes);
    CHECK(once.file_bytes == twice.file_bytes);
    CHECK(once_stats.all_gathers == twice_stats.all_gathers);
    CHECK(once_stats.reduce_scatters == twice_stats.reduce_scatters);
    CHECK(once_stats.all_reduces == twice_stats.all_reduces);
    // Each object exactly once: one key per parameter, no duplicated prefix.
    std::size_t model_keys = 0;
    for (const auto& k : once.keys) model_keys += k.rfind("model.", 0) == 0;
    ckpt::RunThreads(1, [&](ckpt::Comm& c) {
      Trainer t(c, SmallConfig(Strategy::kDdp));
      CHECK(model_keys == t.model().keyed_parameters().size());
    });
  }
}

TEST_CASE("a deep copy is a different object; two objects may not share a prefix") {
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Generator gen(1);
    Classifier model(SmallConfig(Strategy::kDdp).model, gen);
    std::unique_ptr<ckpt::runtime::Module> copy = model.Clone();
    Accelerator accel(c, {Strategy::kFsdp});
    DistributedModel& h = accel.Prepare(model);
    try {
      accel.Prepare(*copy);  // default prefix "model" is taken
      FAIL("expected a prefix clash");
    } catch (const ckpt::Error& e) {
      CHECK(e.code() == ckpt::ErrorCode::kInvalidArgument);
      CHECK(std::string(e.what()).find("'model'") != std::string::npos);
    }
    CHECK(accel.registry().size() == 1);
    DistributedModel& hc = accel.Prepare(*copy, "ema");
    CHECK(&hc != &h);
    CHECK(accel.registry().size() == 2);
    CHECK(hc.keyed_parameters()[0].first.rfind("ema.", 0) == 0);
    // Nested prefixes would interleave keys: refused too.
    Counter counter;
    CHECK_THROWS_AS(accel.Prepare(counter, "model.extra"), ckpt::Error);
    CHECK_THROWS_AS(accel.Prepare(counter, "ema"), ckpt::Error);
    CHECK(&accel.Prepare(counter, "counter") == &counter);
    CHECK(&accel.Prepare(counter, "counter2") == &counter);  // same object: same entry
    CHECK(accel.registry().size() == 3);
    CHECK(accel.registry()[2].kind == "object");
    // A copy of a prepared module holds sharded parameters: refused with a clear error.
    auto late_copy = model.Clone();
    CHECK_THROWS_AS(accel.Prepare(*late_copy, "late"), ckpt::Error);
  });
}

TEST_CASE("an optimizer needs its model prepared first; a user object round-trips") {
  ckpt_test::TempDir tmp("obj");
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Generator gen(1);
    Classifier model(SmallConfig(Strategy::kDdp).model, gen);
    AdamW opt(model);
    Accelerator accel(c, {Strategy::kDdp});
    CHECK_THROWS_AS(accel.Prepare(opt), ckpt::Error);
    accel.Prepare(model);
    accel.Prepare(opt);
    Counter counter;
    counter.value = 41;
    accel.Prepare(counter, "counter");
    accel.SaveState(tmp / "ck");
    counter.value = 0;
    accel.LoadState(tmp / "ck");
    CHECK(counter.value == 41);
  });
  const auto md = ckpt::ReadMetadata(tmp / "ck");
  CHECK(md.Find("counter.value") != nullptr);
  CHECK(md.Find("optimizer.state.model.head.weight.exp_avg") != nullptr);
  CHECK(md.Find("optimizer.state.model.head.weight.step") != nullptr);
}

TEST_CASE("an accelerator that goes away takes its hooks with it") {
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Generator gen(1);
    Classifier model(SmallConfig(Strategy::kFsdp).model, gen);
    auto hooks = [&] {
      std::size_t n = 0;
      for (auto& [name, m] : model.NamedModules()) n += m->num_hooks();
      return n;
    };
    {
      Accelerator accel(c, {Strategy::kFsdp});
      accel.Prepare(model);
      CHECK(hooks() > 0);
    }
    CHECK(hooks() == 0);
  });
}
