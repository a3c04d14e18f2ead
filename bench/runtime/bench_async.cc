// ckpt-bench-async: what an asynchronous save costs the training loop (issue 11).
//
//  1. gpt2s (GPT-2 small + Adam state, 592 tensors, 1.49 GB float32: bench/common/gpt2s.h),
//     dim-0 row shards on 1 and 4 ranks (threads): the time the caller is blocked by Save
//     against SaveAsync (the first SaveAsync into fresh staging, and the best of the later
//     ones, which reuse it), the background save's total time, and the staging memory.
//     Blocked time is the slowest rank's, from a barrier to the call's return.
//  2. The slowdown of training steps that run while a background save is being written:
//     the example model (as ckpt-bench-runtime) trained on --world ranks, the mean step
//     time with no save against the mean over the steps that ran during one.
//
// Usage: ckpt-bench-async --dir DIR [--repeats N] [--world N] [--json]
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/ckpt.h"
#include "ckpt/runtime/runtime.h"
#include "ckpt_demo/trainer.h"
#include "common/example_model.h"
#include "common/gpt2s.h"

namespace fs = std::filesystem;
namespace rt = ckpt::runtime;
namespace demo = ckpt::demo;

namespace {

using Clock = std::chrono::steady_clock;
double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One rank's dim-0 row shard of every gpt2s tensor (0-D ones on rank 0), filled with a
// pattern that differs per tensor.
struct Gpt2sShard {
  std::vector<std::vector<float>> buffers;
  std::vector<int64_t> steps;
  ckpt::StateDict sd;

  Gpt2sShard(int rank, int world) {
    const auto params = ckpt_bench::Gpt2sParams();
    std::vector<std::pair<std::string, ckpt::Shape>> tensors;
    for (const auto& [name, shape] : params) tensors.emplace_back(name, shape);
    for (const auto& [name, shape] : params) {
      tensors.emplace_back("optimizer.state." + name + ".exp_avg", shape);
      tensors.emplace_back("optimizer.state." + name + ".exp_avg_sq", shape);
    }
    buffers.reserve(tensors.size());
    for (const auto& [name, shape] : tensors) {
      const int64_t rows = shape[0];
      const auto [begin, count] = ckpt::BalancedSplit(rows, world, rank);
      const int64_t row = ckpt::NumElements(shape) / rows;
      buffers.emplace_back(static_cast<std::size_t>(count * row));
      auto& b = buffers.back();
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>((i * 2654435761u + buffers.size()) % 65521) * 1e-5f;
      sd.Add(name, ckpt::Tensor::Slice(ckpt::DType::kFloat32, shape, 0, begin, count, b.data()));
    }
    steps.assign(params.size(), 1000);
    if (rank == 0) {
      for (std::size_t i = 0; i < params.size(); ++i) {
        sd.Add("optimizer.state." + params[i].first + ".step",
               ckpt::Tensor::Full(ckpt::DType::kInt64, {}, &steps[i]));
      }
    }
  }
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const auto& b : buffers) n += b.size() * sizeof(float);
    return n + steps.size() * sizeof(int64_t);
  }
};

double MaxOver(ckpt::Comm& comm, double v) {
  comm.AllReduce(&v, 1, ckpt::DType::kFloat64, ckpt::ReduceOp::kMax);
  return v;
}

struct BlockedResult {
  int world = 1;
  uint64_t state_bytes = 0, staging_bytes = 0;
  double sync_s = 1e30, async_first_s = 0, async_best_s = 1e30, async_total_s = 1e30;
  double recorded_blocked_max = 0, recorded_write_max = 0;
};

BlockedResult MeasureBlocked(const fs::path& dir, int world, int repeats) {
  BlockedResult r;
  r.world = world;
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    Gpt2sShard shard(comm.rank(), world);
    uint64_t bytes = shard.bytes();
    comm.AllReduce(&bytes, 1, ckpt::DType::kInt64, ckpt::ReduceOp::kSum);
    ckpt::SaveOptions so;
    so.overwrite = true;
    ckpt::AsyncSaveOptions ao;
    ao.overwrite = true;
    ao.staging = std::make_shared<ckpt::StagingPool>();
    double sync_best = 1e30, first = 0, best = 1e30, total_best = 1e30;
    for (int i = 0; i < repeats; ++i) {
      comm.Barrier();
      auto t0 = Clock::now();
      ckpt::Save(dir / "sync", shard.sd, comm, so);
      sync_best = std::min(sync_best, MaxOver(comm, Seconds(t0)));

      comm.Barrier();
      t0 = Clock::now();
      const ckpt::SaveHandle h = ckpt::SaveAsync(dir / "async", shard.sd, comm, ao);
      const double blocked = MaxOver(comm, Seconds(t0));
      h.Wait();
      const double total = MaxOver(comm, Seconds(t0));
      if (i == 0) first = blocked;
      else best = std::min(best, blocked);
      total_best = std::min(total_best, total);
    }
    uint64_t staging = ao.staging->reserved_bytes();
    comm.AllReduce(&staging, 1, ckpt::DType::kInt64, ckpt::ReduceOp::kSum);
    if (comm.rank() == 0) {
      r.state_bytes = bytes;
      r.staging_bytes = staging;
      r.sync_s = sync_best;
      r.async_first_s = first;
      r.async_best_s = repeats > 1 ? best : first;
      r.async_total_s = total_best;
      const ckpt::Metadata md = ckpt::ReadMetadata(dir / "async", false);
      if (md.save_timings) {
        r.recorded_blocked_max = md.save_timings->blocked.max;
        r.recorded_write_max = md.save_timings->write.max;
      }
    }
  });
  return r;
}

struct SlowdownResult {
  int world = 1, steps_during = 0;
  double step_s = 0, step_during_s = 0, save_s = 0;
  uint64_t state_bytes = 0;
};

SlowdownResult MeasureSlowdown(const fs::path& dir, int world, int baseline_steps) {
  SlowdownResult r;
  r.world = world;
  demo::TrainerConfig cfg = ckpt_bench::ExampleModelConfig();
  cfg.strategy = rt::Strategy::kFsdp;
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    demo::Trainer t(comm, cfg);
    for (int i = 0; i < 2; ++i) t.Step();  // warm-up
    comm.Barrier();
    auto t0 = Clock::now();
    // The same agreement per step as the loop during the save below, so that only the save
    // differs between the two.
    for (int i = 0; i < baseline_steps; ++i) {
      if (!comm.AllOk(true)) break;
      t.Step();
    }
    const double step_s = MaxOver(comm, Seconds(t0)) / baseline_steps;
    rt::SaveStateOptions so;
    so.overwrite = true;
    t.accelerator().SaveStateAsync(dir / "warm", so).Wait();  // staging allocated once
    comm.Barrier();
    t0 = Clock::now();
    const ckpt::SaveHandle h = t.accelerator().SaveStateAsync(dir / "during", so);
    int steps = 0;
    const auto s0 = Clock::now();
    // Every rank steps until every rank's save is done (the decision is agreed each step).
    for (;;) {
      if (comm.AllOk(h.Done())) break;
      t.Step();
      ++steps;
    }
    const double during = Seconds(s0);
    h.Wait();
    const double save_s = MaxOver(comm, Seconds(t0));
    if (comm.rank() == 0) {
      r.step_s = step_s;
      r.steps_during = steps;
      r.step_during_s = steps ? during / steps : 0;
      r.save_s = save_s;
      for (const auto& e : fs::directory_iterator(dir / "during"))
        if (e.is_regular_file()) r.state_bytes += e.file_size();
    }
  });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Async save benchmark: blocked time of SaveAsync vs Save, step slowdown during a background write"};
  std::string dir = "build-bench/scratch/async";
  int repeats = 3, world = 2, steps = 5;
  app.add_option("--dir", dir, "scratch directory (removed at the end; needs ~3.5 GB)");
  app.add_option("--repeats", repeats, "saves of each kind per world size")->check(CLI::Range(1, 100));
  app.add_option("--world", world, "ranks of the training-slowdown run")->check(CLI::Range(1, 64));
  app.add_option("--steps", steps, "baseline training steps")->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);
  const fs::path root = fs::absolute(dir);
  fs::remove_all(root);
  fs::create_directories(root);
  try {
    std::printf("gpt2s: blocked time of Save vs SaveAsync (slowest rank; best of %d, first async separately)\n", repeats);
    std::printf("%-6s %10s %10s %12s %12s %8s %12s %14s\n", "ranks", "state", "sync s", "async 1st s", "async s",
                "ratio", "async total", "staging");
    for (int w : {1, 4}) {
      const BlockedResult r = MeasureBlocked(root / ("gpt2s-" + std::to_string(w)), w, repeats);
      std::printf("%-6d %8.2fGB %10.3f %12.4f %12.4f %7.2f%% %11.3fs %12.2fGB\n", r.world, r.state_bytes / 1e9, r.sync_s,
                  r.async_first_s, r.async_best_s, 100.0 * r.async_best_s / r.sync_s, r.async_total_s,
                  r.staging_bytes / 1e9);
      std::printf("{\"bench\":\"async\",\"workload\":\"gpt2s\",\"world\":%d,\"state_bytes\":%llu,\"sync_blocked_s\":%.4f,"
                  "\"async_blocked_first_s\":%.4f,\"async_blocked_s\":%.4f,\"async_total_s\":%.4f,"
                  "\"staging_bytes\":%llu,\"recorded_blocked_max_s\":%.6f,\"recorded_write_max_s\":%.6f}\n",
                  r.world, static_cast<unsigned long long>(r.state_bytes), r.sync_s, r.async_first_s, r.async_best_s,
                  r.async_total_s, static_cast<unsigned long long>(r.staging_bytes), r.recorded_blocked_max,
                  r.recorded_write_max);
      fs::remove_all(root / ("gpt2s-" + std::to_string(w)));
    }
    const SlowdownResult s = MeasureSlowdown(root / "train", world, steps);
    std::printf("training (example model, fsdp, %d ranks, checkpoint %.0f MB): step %.3f s alone, %.3f s during a "
                "background save (%d steps, %+.0f%%); the save took %.2f s\n",
                s.world, s.state_bytes / 1e6, s.step_s, s.step_during_s, s.steps_during,
                s.step_s > 0 && s.steps_during ? 100.0 * (s.step_during_s / s.step_s - 1) : 0.0, s.save_s);
    std::printf("{\"bench\":\"async\",\"workload\":\"train\",\"world\":%d,\"step_s\":%.4f,\"step_during_save_s\":%.4f,"
                "\"steps_during_save\":%d,\"save_s\":%.4f}\n",
                s.world, s.step_s, s.step_during_s, s.steps_during, s.save_s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-bench-async: %s\n", e.what());
    fs::remove_all(root);
    return 1;
  }
  fs::remove_all(root);
  return 0;
}
