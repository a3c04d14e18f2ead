// State-dict types: LOCAL (flat-parameter layout) round-trips into the same layout and
// is refused, naming both types, anywhere else (the seed's "saved as one type, loaded as
// another" report).
#include <doctest/doctest.h>

#include "ckpt/checkpoint.h"
#include "runtime_helpers.h"
#include "test_util.h"

using namespace ckpt::runtime;
using namespace ckpt::demo;
using rt_test::SmallConfig;

namespace {

void Save(const std::filesystem::path& dir, ckpt::StateDictType type, Strategy s, int world,
          rt_test::FullState* out) {
  ckpt::RunThreads(world, [&](ckpt::Comm& c) {
    Trainer t(c, SmallConfig(s));
    t.Step();
    SaveStateOptions o;
    o.state_dict_type = type;
    t.accelerator().SaveState(dir, o);
    auto full = rt_test::Gather(t.accelerator());
    if (c.rank() == 0 && out) *out = std::move(full);
  });
}

// Loads `dir` as `type` and expects an error whose message names both types; the
// target must be untouched (nothing read into it).
void ExpectRefused(const std::filesystem::path& dir, ckpt::StateDictType type, Strategy s, int world,
                   const std::string& saved_name, const std::string& wanted_name) {
  ckpt::RunThreads(world, [&](ckpt::Comm& c) {
    TrainerConfig cfg = SmallConfig(s);
    cfg.init_seed = 77;
    Trainer t(c, cfg);
    auto before = rt_test::Gather(t.accelerator());
    LoadStateOptions o;
    o.state_dict_type = type;
    std::string message;
    try {
      t.accelerator().LoadState(dir, o);
    } catch (const ckpt::Error& e) {
      message = e.what();
    }
    CAPTURE(message);
    CHECK(message.find(saved_name) != std::string::npos);
    CHECK(message.find(wanted_name) != std::string::npos);
    CHECK(message.find("KeyError") == std::string::npos);
    auto after = rt_test::Gather(t.accelerator());
    if (c.rank() == 0)
      for (auto& [k, v] : before) CHECK(rt_test::BitEqual(v, after[k]));
    CHECK(t.step() == 0);
  });
}

}  // namespace

TEST_CASE("LOCAL round-trips into the same layout, bit-exact") {
  ckpt_test::TempDir tmp("local");
  rt_test::FullState saved;
  Save(tmp / "local", ckpt::StateDictType::kLocal, Strategy::kFsdp, 3, &saved);
  const ckpt::Metadata md = ckpt::ReadMetadata(tmp / "local");
  CHECK(md.state_dict_type == ckpt::StateDictType::kLocal);
  CHECK(md.Find("model._flat") != nullptr);
  CHECK(md.Find("optimizer._flat") != nullptr);
  CHECK(md.Find("model.head.weight") == nullptr);
  ckpt::RunThreads(3, [&](ckpt::Comm& c) {
    TrainerConfig cfg = SmallConfig(Strategy::kFsdp);
    cfg.init_seed = 5;
    Trainer t(c, cfg);
    LoadStateOptions o;
    o.state_dict_type = ckpt::StateDictType::kLocal;
    t.accelerator().LoadState(tmp / "local", o);
    CHECK(t.step() == 1);
    auto full = rt_test::Gather(t.accelerator());
    if (c.rank() == 0)
      for (auto& [k, v] : saved) CHECK(rt_test::BitEqual(v, full[k]));
  });
}

TEST_CASE("LOCAL saved, SHARDED or FULL wanted: refused naming both types") {
  ckpt_test::TempDir tmp("local2");
  Save(tmp / "local", ckpt::StateDictType::kLocal, Strategy::kFsdp, 2, nullptr);
  ExpectRefused(tmp / "local", ckpt::StateDictType::kSharded, Strategy::kFsdp, 2, "LOCAL", "SHARDED");
  ExpectRefused(tmp / "local", ckpt::StateDictType::kFull, Strategy::kFsdp, 2, "LOCAL", "FULL");
}

TEST_CASE("SHARDED saved, LOCAL wanted: refused naming both types") {
  ckpt_test::TempDir tmp("local3");
  Save(tmp / "sharded", ckpt::StateDictType::kSharded, Strategy::kFsdp, 2, nullptr);
  ExpectRefused(tmp / "sharded", ckpt::StateDictType::kLocal, Strategy::kFsdp, 2, "SHARDED", "LOCAL");
}

TEST_CASE("LOCAL into another layout (world size or strategy): refused") {
  ckpt_test::TempDir tmp("local4");
  Save(tmp / "local", ckpt::StateDictType::kLocal, Strategy::kFsdp, 2, nullptr);
  // Same flat sizes, different meaning: FSDP x2 and DDP x1 both hold every value once.
  ExpectRefused(tmp / "local", ckpt::StateDictType::kLocal, Strategy::kDdp, 1, "fsdp, world 2", "ddp, world 1");
  ExpectRefused(tmp / "local", ckpt::StateDictType::kLocal, Strategy::kFsdp, 4, "fsdp, world 2", "fsdp, world 4");
}

TEST_CASE("FULL saved through save_state converts into a sharded job, and back") {
  ckpt_test::TempDir tmp("fullconv");
  rt_test::FullState saved;
  Save(tmp / "full", ckpt::StateDictType::kFull, Strategy::kFsdp, 3, &saved);
  CHECK(ckpt::ReadMetadata(tmp / "full").state_dict_type == ckpt::StateDictType::kFull);
  for (auto [s, world] : {std::pair{Strategy::kTp, 2}, std::pair{Strategy::kFsdp, 4}}) {
    ckpt::RunThreads(world, [&](ckpt::Comm& c) {
      TrainerConfig cfg = SmallConfig(s);
      cfg.init_seed = 3;
      Trainer t(c, cfg);
      LoadStateOptions o;
      o.state_dict_type = ckpt::StateDictType::kFull;  // FULL or SHARDED targets both load it
      t.accelerator().LoadState(tmp / "full", o);
      CHECK(t.step() == 1);
      auto full = rt_test::Gather(t.accelerator());
      if (c.rank() == 0)
        for (auto& [k, v] : saved) CHECK(rt_test::BitEqual(v, full[k]));
    });
  }
}
