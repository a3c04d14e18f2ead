// train: the runtime end to end. Trains a small classifier on a synthetic task with
// --world ranks (threads of this process) under a strategy, checkpoints every
// --save-every steps, and with --resume continues from the latest checkpoint in
// --ckpt-dir, whatever world size and strategy saved it.
//
//   train --world 4 --strategy fsdp --steps 100 --save-every 50 --ckpt-dir /tmp/ck
//   train --world 3 --strategy tp   --steps 200 --save-every 50 --ckpt-dir /tmp/ck --resume
//   train --world 4 --steps 100 --save-every 20 --ckpt-dir /tmp/ck --async-save
//   mpiexec -n 4 train --mpi --strategy fsdp_tp ...     (real processes, when built with MPI)
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>

#include "ckpt/ckpt.h"
#include "ckpt/runtime/runtime.h"
#include "ckpt_demo/trainer.h"
#if CKPT_TRAIN_MPI
#include "ckpt/mpi.h"
#endif

namespace rt = ckpt::runtime;
namespace demo = ckpt::demo;

int main(int argc, char** argv) {
  CLI::App app{"Train a small model across in-process ranks with ckpt checkpoints"};
  int world = 2;
  std::string strategy = "ddp";
  int tp = 0;
  int64_t steps = 100, save_every = 0, log_every = 10;
  std::string ckpt_dir;
  bool resume = false, full = false;
  int keep = 3;
  demo::TrainerConfig cfg;
  cfg.model.dim = 64;
  cfg.model.hidden = 256;
  cfg.total_steps = 1000;
  cfg.lr = 1e-2;
  bool mpi = false;
  app.add_option("--world", world, "number of ranks (threads of this process)")
      ->check(CLI::Range(1, 256));
  app.add_flag("--mpi", mpi, "one rank per MPI process (run under mpiexec); --world is ignored");
  app.add_option("--strategy", strategy, "ddp, fsdp, tp or fsdp_tp")
      ->check(CLI::IsMember({"ddp", "fsdp", "tp", "fsdp_tp"}));
  app.add_option("--tp", tp, "tensor-parallel size (tp, fsdp_tp); 0: automatic");
  app.add_option("--steps", steps, "train until this global step");
  app.add_option("--save-every", save_every, "checkpoint every N steps (0: only at the end when --ckpt-dir)");
  app.add_option("--ckpt-dir", ckpt_dir, "checkpoint root (step-<N> directories, 'latest')");
  app.add_flag("--resume", resume, "continue from the latest complete checkpoint in --ckpt-dir");
  app.add_option("--keep", keep, "checkpoints kept");
  app.add_flag("--full", full, "also write a FULL export to <ckpt-dir>/full at the end");
  bool zstd = false;
  app.add_flag("--zstd", zstd, "compress checkpoints (zstd, HDF5 filter 32015)");
  bool async_save = false;
  app.add_flag("--async-save", async_save,
               "save in the background: training resumes once the state is copied to staging memory");
  app.add_option("--log-every", log_every, "print the loss every N steps");
  app.add_option("--dim", cfg.model.dim, "model width");
  app.add_option("--hidden", cfg.model.hidden, "MLP hidden width");
  app.add_option("--layers", cfg.model.layers, "MLP blocks");
  app.add_option("--vocab", cfg.model.vocab, "vocabulary size");
  app.add_option("--batch", cfg.global_batch, "global batch (divisible by the data-parallel size)");
  app.add_option("--lr", cfg.lr, "peak learning rate");
  app.add_option("--seed", cfg.init_seed, "initialisation seed");
  CLI11_PARSE(app, argc, argv);
  if ((resume || save_every > 0 || full) && ckpt_dir.empty()) {
    std::fprintf(stderr, "train: --resume, --save-every and --full need --ckpt-dir\n");
    return 2;
  }

#if CKPT_TRAIN_MPI
  std::unique_ptr<ckpt::MpiSession> session;
  std::unique_ptr<ckpt::Comm> mpi_world;
  if (mpi) {
    session = std::make_unique<ckpt::MpiSession>(&argc, &argv);
    mpi_world = ckpt::MpiWorld();
    world = mpi_world->size();
  }
#else
  if (mpi) {
    std::fprintf(stderr, "train: built without MPI: --mpi is not available\n");
    return 2;
  }
#endif

  try {
    cfg.strategy = rt::StrategyFromName(strategy);
    cfg.tp_size = tp;
    auto run = [&](ckpt::Comm& comm) {
      const bool root = comm.rank() == 0;
      demo::Trainer trainer(comm, cfg);
      rt::Accelerator& accel = trainer.accelerator();
      if (root)
        std::printf("train: %s on %d rank%s (mesh dp=%d x tp=%d), %zu parameters\n", strategy.c_str(),
                    world, world == 1 ? "" : "s", accel.dp_size(), accel.tp_size(),
                    [&] {
                      std::size_t n = 0;
                      for (auto& [k, p] : trainer.model().keyed_parameters())
                        n += static_cast<std::size_t>(ckpt::NumElements(p->shape));
                      return n;
                    }());
      std::unique_ptr<rt::CheckpointManager> mgr;
      if (!ckpt_dir.empty()) mgr = std::make_unique<rt::CheckpointManager>(accel, ckpt_dir, keep);
      if (resume) {
        auto latest = mgr->Latest();
        auto step = mgr->Resume();
        if (root) {
          if (step) {
            const ckpt::Metadata md = ckpt::ReadMetadata(latest->second);
            std::printf("resumed from %s at step %lld (saved %s by %d ranks)\n",
                        latest->second.string().c_str(), static_cast<long long>(*step),
                        std::string(ckpt::StateDictTypeName(md.state_dict_type)).c_str(),
                        md.world_size);
          } else {
            std::printf("no checkpoint in %s: starting from scratch\n", ckpt_dir.c_str());
          }
        }
      }
      const int64_t start = trainer.step();
      float loss = 0, sum = 0;
      int n = 0;
      while (trainer.step() < steps) {
        loss = trainer.Step();
        sum += loss;
        ++n;
        const int64_t s = trainer.step();
        if (root && (s % log_every == 0 || s == steps))
          std::printf("step %5lld  loss %.4f (mean of last %d)  lr %.2e\n", static_cast<long long>(s),
                      sum / static_cast<float>(n), n, trainer.optimizer().lr());
        if (s % log_every == 0) sum = 0, n = 0;
        if (mgr && ((save_every > 0 && s % save_every == 0) || (s == steps && save_every == 0))) {
          const auto t0 = std::chrono::steady_clock::now();
          rt::SaveStateOptions so;
          if (zstd) so.compression.codec = ckpt::Compression::Codec::kZstd;
          if (async_save) {
            const ckpt::SaveHandle h = mgr->SaveAsync(s, so);
            if (root)
              std::printf("saving %s in the background (training blocked %.1f ms)\n", h.dir().string().c_str(),
                          1e3 * h.blocked_seconds());
          } else {
            const auto dir = mgr->Save(s, so);
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (root) std::printf("saved %s (%.1f ms)\n", dir.string().c_str(), ms);
          }
        }
      }
      if (mgr && async_save) {
        mgr->Wait();  // the last background save committed (or its failure thrown)
        if (root) std::printf("background saves committed\n");
      }
      if (full) {
        rt::SaveFullOptions o;
        o.overwrite = true;
        const auto r = accel.SaveFull(std::filesystem::path(ckpt_dir) / "full", o);
        if (root)
          std::printf("wrote FULL export %s/full (%llu bytes of tensors, peak staging %llu bytes)\n",
                      ckpt_dir.c_str(), static_cast<unsigned long long>(r.total_tensor_bytes),
                      static_cast<unsigned long long>(r.peak_buffer_bytes));
      }
      if (root) {
        if (trainer.step() == start)
          std::printf("already at step %lld (--steps %lld): nothing to train\n",
                      static_cast<long long>(trainer.step()), static_cast<long long>(steps));
        else
          std::printf("done at step %lld, loss %.4f\n", static_cast<long long>(trainer.step()), loss);
      }
    };
#if CKPT_TRAIN_MPI
    if (mpi_world) {
      run(*mpi_world);
      return 0;
    }
#endif
    ckpt::RunThreads(world, run);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train: %s\n", e.what());
    return 1;
  }
  return 0;
}
