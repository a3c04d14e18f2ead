// ckpt-bench-runtime: the example model at a size where one checkpoint is a few hundred
// MB, trained with --world in-process ranks. Reports the time per training step, the
// save_state time and its share of a --save-every step interval, the load_state time,
// and the bytes written with one prepare vs two prepares (which must be equal).
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include "ckpt/ckpt.h"
#include "ckpt/runtime/runtime.h"
#include "ckpt_demo/trainer.h"
#include "common/example_model.h"

namespace fs = std::filesystem;
namespace rt = ckpt::runtime;
namespace demo = ckpt::demo;

namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

uint64_t DirBytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

std::size_t Datasets(const fs::path& dir) {
  std::size_t n = 0;
  for (const auto& [key, e] : ckpt::ReadMetadata(dir).entries) n += e.chunks.size();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runtime benchmark: step, save_state and load_state times"};
  int world = 4, steps = 5, warmup = 2, repeats = 2;
  int64_t save_every = 100;
  std::string strategy = "fsdp", dir = "build-bench/scratch/runtime";
  demo::TrainerConfig cfg = ckpt_bench::ExampleModelConfig();
  app.add_option("--world", world);
  app.add_option("--strategy", strategy)->check(CLI::IsMember({"ddp", "fsdp", "tp", "fsdp_tp"}));
  app.add_option("--dir", dir, "scratch directory (removed at the end)");
  app.add_option("--steps", steps, "timed training steps");
  app.add_option("--repeats", repeats, "timed saves and loads (the best is reported)");
  app.add_option("--save-every", save_every, "the step interval the save share is computed for");
  app.add_option("--dim", cfg.model.dim);
  app.add_option("--hidden", cfg.model.hidden);
  app.add_option("--layers", cfg.model.layers);
  app.add_option("--vocab", cfg.model.vocab);
  app.add_option("--batch", cfg.global_batch);
  CLI11_PARSE(app, argc, argv);
  cfg.strategy = rt::StrategyFromName(strategy);

  const fs::path root = fs::absolute(dir);
  fs::remove_all(root);
  fs::create_directories(root);
  try {
    ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
      const bool lead = comm.rank() == 0;
      demo::Trainer t(comm, cfg);
      rt::Accelerator& a = t.accelerator();
      std::size_t params = 0;
      for (auto& [k, p] : t.model().keyed_parameters())
        params += static_cast<std::size_t>(ckpt::NumElements(p->shape));
      for (int i = 0; i < warmup; ++i) t.Step();
      comm.Barrier();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) t.Step();
      comm.Barrier();
      const double step_s = Seconds(t0) / steps;

      double save_s = 1e30, load_s = 1e30;
      rt::SaveStateOptions so;
      so.overwrite = true;
      for (int r = 0; r < repeats; ++r) {
        comm.Barrier();
        t0 = std::chrono::steady_clock::now();
        a.SaveState(root / "once", so);
        comm.Barrier();
        save_s = std::min(save_s, Seconds(t0));
      }
      for (int r = 0; r < repeats; ++r) {
        comm.Barrier();
        t0 = std::chrono::steady_clock::now();
        a.LoadState(root / "once");
        comm.Barrier();
        load_s = std::min(load_s, Seconds(t0));
      }
      // The seed's scenario: prepare everything a second time, then save again.
      a.Prepare(t.module());
      a.Prepare(t.model());
      a.Prepare(t.optimizer());
      a.Prepare(t.scheduler());
      a.Prepare(t.loader());
      a.Prepare(t.rng());
      a.SaveState(root / "twice", so);
      comm.Barrier();
      if (lead) {
        const uint64_t once = DirBytes(root / "once"), twice = DirBytes(root / "twice");
        const double share = save_s / (static_cast<double>(save_every) * step_s + save_s);
        std::printf("model: %s, world %d (dp %d x tp %d), %zu parameters, global batch %lld\n",
                    strategy.c_str(), world, a.dp_size(), a.tp_size(), params,
                    static_cast<long long>(cfg.global_batch));
        std::printf("checkpoint:            %.1f MB in %zu datasets (%zu registry entries)\n",
                    static_cast<double>(once) / 1e6, Datasets(root / "once"), a.registry().size());
        std::printf("time per step:         %.3f s\n", step_s);
        std::printf("save_state:            %.3f s  (%.0f MB/s)\n", save_s,
                    static_cast<double>(once) / 1e6 / save_s);
        std::printf("save share of a %lld-step interval: %.2f %%\n", static_cast<long long>(save_every),
                    100.0 * share);
        std::printf("load_state:            %.3f s  (%.0f MB/s)\n", load_s,
                    static_cast<double>(once) / 1e6 / load_s);
        std::printf("bytes, one prepare:    %llu\n", static_cast<unsigned long long>(once));
        std::printf("bytes, two prepares:   %llu  (%s)\n", static_cast<unsigned long long>(twice),
                    once == twice ? "equal" : "DIFFERENT");
        std::printf("{\"bench\":\"runtime\",\"strategy\":\"%s\",\"world\":%d,\"params\":%zu,"
                    "\"step_s\":%.4f,\"save_s\":%.4f,\"save_share\":%.5f,\"load_s\":%.4f,"
                    "\"bytes_once\":%llu,\"bytes_twice\":%llu}\n",
                    strategy.c_str(), world, params, step_s, save_s, share, load_s,
                    static_cast<unsigned long long>(once), static_cast<unsigned long long>(twice));
        if (once != twice) throw ckpt::Error(ckpt::ErrorCode::kInternal, "prepare twice changed the checkpoint");
      }
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-bench-runtime: %s\n", e.what());
    fs::remove_all(root);
    return 1;
  }
  fs::remove_all(root);
  return 0;
}
