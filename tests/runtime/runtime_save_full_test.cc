// save_full streams one tensor at a time to rank 0: memory stays bounded by the largest
// tensor, not the model (the seed's "FULL state gathered onto one GPU -> OOM").
#include <doctest/doctest.h>

#include "ckpt/checkpoint.h"
#include "runtime_helpers.h"
#include "test_util.h"

using namespace ckpt::runtime;
using rt_test::SmallConfig;

TEST_CASE("save_full of a model larger than the staging limit stays within the limit") {
  ckpt_test::TempDir tmp("full");
  TrainerConfig cfg = SmallConfig(Strategy::kFsdp);
  cfg.model.layers = 6;
  cfg.model.dim = 32;
  cfg.model.hidden = 96;  // each block: 2 x 32 x 96 floats = 24 KiB per weight
  const uint64_t limit = 64 * 1024;
  ckpt::RunThreads(4, [&](ckpt::Comm& c) {
    Trainer t(c, cfg);
    t.Step();
    SaveFullOptions o;
    o.max_buffer_bytes = limit;
    SaveFullReport r = t.accelerator().SaveFull(tmp / "full", o);
    if (c.rank() == 0) {
      MESSAGE("model+optimizer " << r.total_tensor_bytes << " B, largest tensor "
                                 << r.largest_tensor_bytes << " B, peak staging "
                                 << r.peak_buffer_bytes << " B, limit " << limit << " B");
      CHECK(r.total_tensor_bytes > 4 * limit);  // the whole state would not fit
      CHECK(r.peak_buffer_bytes <= limit);
      CHECK(r.peak_buffer_bytes <= 2 * r.largest_tensor_bytes);
      CHECK(r.peak_buffer_bytes >= r.largest_tensor_bytes);
    }
    // A limit below one tensor is refused on every rank before anything is written.
    SaveFullOptions tight;
    tight.max_buffer_bytes = 1024;
    CHECK_THROWS_AS(t.accelerator().SaveFull(tmp / "tight", tight), ckpt::Error);
  });
  CHECK_FALSE(std::filesystem::exists(tmp / "tight" / ckpt::kMetadataFileName));
  const ckpt::Metadata md = ckpt::ReadMetadata(tmp / "full");
  CHECK(md.state_dict_type == ckpt::StateDictType::kFull);
  CHECK(md.files.size() == 1);
}
