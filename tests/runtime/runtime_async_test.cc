// Background saves in the runtime (Accelerator::SaveStateAsync, CheckpointManager::SaveAsync):
// training goes on while the checkpoint is written (the write is held at a gate in the
// file-system seam, so no step count depends on timing), `latest` moves only after the
// commit, and resuming from the background checkpoint is bit-exact.
#include <doctest/doctest.h>

#include <optional>

#include "ckpt/files.h"
#include "fault/fault_fs.h"
#include "runtime_helpers.h"
#include "test_util.h"

using namespace ckpt::runtime;
using namespace ckpt::demo;
using rt_test::SmallConfig;
namespace fs = std::filesystem;

TEST_CASE("training continues during a background save; resume from it is bit-exact") {
  for (Strategy s : {Strategy::kDdp, Strategy::kFsdp}) {
    CAPTURE(StrategyName(s));
    ckpt_test::TempDir tmp("rt-async");
    const fs::path root = tmp / "run";
    std::vector<float> straight_losses;
    rt_test::FullState straight;
    {
      ckpt_test::GateFs gate;
      ckpt_test::Installed on(gate);
      ckpt::RunThreads(2, [&](ckpt::Comm& c) {
        Trainer t(c, SmallConfig(s));
        CheckpointManager mgr(t.accelerator(), root, 2);
        for (int i = 0; i < 4; ++i) t.Step();
        const ckpt::SaveHandle h = mgr.SaveAsync(4);
        std::vector<float> losses;
        for (int i = 4; i < 8; ++i) losses.push_back(t.Step());  // while the write is held
        CHECK(t.step() == 8);
        CHECK_FALSE(h.Done());
        CHECK_FALSE(fs::exists(root / "latest"));  // moves only after the commit
        c.Barrier();
        if (c.rank() == 0) gate.Open();
        mgr.Wait();
        CHECK(h.Done());
        auto full = rt_test::Gather(t.accelerator());
        if (c.rank() == 0) {
          straight_losses = losses;
          straight = std::move(full);
        }
      });
    }
    CHECK(ckpt::files::ReadSmallFile(root / "latest", 100) == "step-00000004\n");
    const ckpt::Metadata md = ckpt::ReadMetadata(root / "step-00000004", false);
    REQUIRE(md.save_timings.has_value());
    CHECK(md.save_timings->async);

    // A fresh process group resumes from the background checkpoint and retraces steps 4-8.
    std::vector<float> resumed_losses;
    rt_test::FullState resumed;
    ckpt::RunThreads(2, [&](ckpt::Comm& c) {
      TrainerConfig cfg = SmallConfig(s);
      cfg.init_seed = 1234;  // the resumed job must not depend on its own init
      Trainer t(c, cfg);
      CheckpointManager mgr(t.accelerator(), root, 2);
      const auto step = mgr.Resume();
      REQUIRE(step.has_value());
      CHECK(*step == 4);
      std::vector<float> losses;
      for (int i = 4; i < 8; ++i) losses.push_back(t.Step());
      auto full = rt_test::Gather(t.accelerator());
      if (c.rank() == 0) {
        resumed_losses = losses;
        resumed = std::move(full);
      }
    });
    CHECK(resumed_losses == straight_losses);
    REQUIRE(resumed.size() == straight.size());
    for (const auto& [key, v] : straight) {
      CAPTURE(key);
      CHECK(rt_test::BitEqual(resumed.at(key), v));
    }
  }
}

TEST_CASE("checkpoint manager: background saves rotate after each commit") {
  ckpt_test::TempDir tmp("rt-async-rotate");
  const fs::path root = tmp / "run";
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Trainer t(c, SmallConfig(Strategy::kFsdp));
    CheckpointManager mgr(t.accelerator(), root, 2);
    for (int s = 1; s <= 4; ++s) {
      t.Step();
      mgr.SaveAsync(s);  // waits for the one before: rotation after its commit
    }
    mgr.Wait();
    const auto committed = mgr.Committed();
    REQUIRE(committed.size() == 2);
    CHECK(committed[0].first == 3);
    CHECK(committed[1].first == 4);
    CHECK(mgr.Latest()->first == 4);
    // A sync save after background ones, and FULL is refused asynchronously.
    t.Step();
    mgr.Save(5);
    CHECK(mgr.Latest()->first == 5);
    SaveStateOptions full;
    full.state_dict_type = ckpt::StateDictType::kFull;
    CHECK_THROWS_AS(t.accelerator().SaveStateAsync(tmp / "full", full), ckpt::Error);
  });
}

TEST_CASE("checkpoint manager: a background failure its destructor waited for is the next save's to report") {
  ckpt_test::TempDir tmp("rt-async-fail");
  const fs::path root = tmp / "run";
  ckpt_test::FaultFs failing(1, EIO, "shard-00001-of-");
  std::optional<ckpt_test::Installed> on(std::in_place, failing);
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Trainer t(c, SmallConfig(Strategy::kDdp));
    t.Step();
    {
      CheckpointManager mgr(t.accelerator(), root, 2);
      mgr.SaveAsync(1);
    }  // waits for it, and reports nothing
    c.Barrier();
    if (c.rank() == 0) on.reset();
    c.Barrier();
    SaveStateOptions so;
    CHECK_THROWS_WITH_AS(t.accelerator().SaveStateAsync(tmp / "next", so), doctest::Contains("shard-00001-of-"),
                         ckpt::Error);
    CheckpointManager mgr(t.accelerator(), root, 2);
    mgr.SaveAsync(2);  // reported once: this one commits
    mgr.Wait();
    CHECK(mgr.Latest()->first == 2);
  });
  CHECK_FALSE(fs::exists(root / "step-00000001"));
  CHECK_FALSE(fs::exists(tmp / "next"));
}
