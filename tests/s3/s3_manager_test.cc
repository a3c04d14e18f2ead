// CheckpointManager on an s3:// root (the project's own Ceph gateway): keep-last-N prunes
// metadata.json first, then the objects; Latest() is the newest committed step; an
// uncommitted newer step is never latest; SaveAsync moves on after the commit; the newest
// checkpoint downloads and loads into the trainer bit-equal to what was saved, and Resume
// (Load's interim s3:// path) restores it.
#include <doctest/doctest.h>

#include <algorithm>

#include "ckpt/files.h"
#include "runtime/runtime_helpers.h"
#include "s3_gateway.h"
#include "storage/s3_sign.h"
#include "test_util.h"

using namespace ckpt::runtime;
using namespace ckpt::demo;
namespace st = ckpt::storage;

TEST_CASE("s3 checkpoint manager: keeps the last N, latest is the newest committed, loads back") {
  s3_test::StoreFixture f("s3mgr");
  const std::string root = f.Url("run");
  const auto prefixes = [&] {
    std::vector<std::string> out;
    for (const std::string& key : f.Keys("run/")) {
      std::string p = key.substr(4, key.find('/', 4) - 4);
      if (out.empty() || out.back() != p) out.push_back(p);
    }
    return out;
  };
  rt_test::FullState saved;
  ckpt::RunThreads(2, [&](ckpt::Comm& c) {
    Trainer t(c, rt_test::SmallConfig(Strategy::kFsdp));
    CheckpointManager mgr(t.accelerator(), root, 2, f.options);
    CHECK_FALSE(mgr.Latest().has_value());
    for (int step = 1; step <= 3; ++step) {
      t.Step();
      mgr.Save(step);
    }
    t.Step();
    mgr.SaveAsync(4);
    mgr.Wait();
    rt_test::FullState now = rt_test::Gather(t.accelerator());
    c.Barrier();
    const auto committed = mgr.Committed();
    REQUIRE(committed.size() == 2);
    CHECK(committed[0].first == 3);
    CHECK(committed[1].first == 4);
    CHECK(committed[1].second.string() == root + "/step-00000004");
    CHECK(mgr.Latest()->first == 4);
    c.Barrier();
    if (c.rank() == 0) {
      saved = std::move(now);
      // Pruned steps are gone entirely: metadata.json and their objects.
      CHECK(prefixes() == std::vector<std::string>{"step-00000003", "step-00000004"});
      // A newer save that never committed (its shard only) is not latest.
      f.store.Put(f.bucket.name(), "run/step-00000009/shard-00000-of-00002.0123456789abcdef.h5",
                  st::s3::AsBytes(std::string("partial")));
    }
    c.Barrier();
    CHECK(mgr.Latest()->first == 4);
    // The latest checkpoint, downloaded, loads into the trainer bit-equal to what was saved.
    for (int i = 0; i < 2; ++i) t.Step();
    if (c.rank() == 0) ckpt::files::DownloadObjectCheckpoint(root + "/step-00000004", f.options, f.tmp / "dl", 64 << 20);
    c.Barrier();
    t.accelerator().LoadState(f.tmp / "dl");
    const rt_test::FullState back = rt_test::Gather(t.accelerator());
    if (c.rank() == 0) {
      REQUIRE(back.size() == saved.size());
      for (const auto& [k, v] : saved) CHECK(rt_test::BitEqual(back.at(k), v));
    }
    // Resume reads the latest through Load's interim s3:// path.
    for (int i = 0; i < 2; ++i) t.Step();
    CHECK(mgr.Resume() == std::optional<int64_t>(4));
    CHECK(t.step() == 4);
    const rt_test::FullState resumed = rt_test::Gather(t.accelerator());
    if (c.rank() == 0) {
      for (const auto& [k, v] : saved) CHECK(rt_test::BitEqual(resumed.at(k), v));
    }
  });
  // The uncommitted step's object is a leftover: removed past the grace period (0 here),
  // the committed steps stay.
  ckpt::ObjectStoreOptions now = f.options;
  now.leftover_grace_seconds = 0;
  CHECK(ckpt::files::CleanObjectLeftovers(root, now) == 1);
  CHECK(ckpt::files::ListObjectCheckpoints(root, f.options) == std::vector<std::string>{"step-00000003", "step-00000004"});
}
