// bench_mpi: issue 10's "save for 4 processes": gpt2s's FSDP-like dim-0 shards saved and
// loaded by N processes under mpirun (ckpt::Save / ckpt::Load through the MPI Comm), against
// each process writing and reading its shard raw. The same workload and raw baseline as
// bench_core's "gpt2s-4" table (bench_common.h), with processes where it has threads:
//   raw-c-wb, N processes   each process write(2)s its shard's buffers into its own file in
//                           8 MiB calls, sync_file_range(WRITE) every 64 MiB, fsync; then
//                           rank 0 fsyncs the directory (after a barrier: every file exists)
//   raw load                read(2) of that file back into the (zeroed) buffers
//   ckpt, N processes       ckpt::Save of each rank's shard, MpiWorld(); ckpt::Load back
// Rounds interleave the methods (raw save, ckpt save, raw load, ckpt load). Each phase starts
// from an empty page cache (rank 0: bench_common's MakeCold, i.e. sync, drop_caches, 1 s;
// every rank waits at a barrier), is timed on rank 0 between two barriers, and records the
// CPU seconds (user + sys, every thread) summed over the processes, the sum of their peak
// RSS and rank 0's 1-minute load average at its start. Loads are verified by hash on every
// rank: a wrong load fails the benchmark (exit 1) after the ranks agree on what differed.
//
// The timing barriers sleep between polls (MPI_Ibarrier + MPI_Test): Open MPI's blocking
// barrier spins, and on a machine with fewer cores than ranks a finished rank spinning
// takes the CPU from one still writing. ckpt's own collectives are ckpt's cost and count.
//
// Usage: mpirun -np 4 ckpt-bench-mpi --dir DIR [--rounds N] [--round-index I] [--json FILE] [--keep]
//   (as root with Open MPI: mpirun --allow-run-as-root; more ranks than cores: --oversubscribe).
//   --json appends one JSON line per phase (table "gpt2s-4p" at 4 processes), as bench_core's.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <ckpt/ckpt.h>
#include <ckpt/mpi.h>

#include <fcntl.h>
#include <unistd.h>

#include "bench_common.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ckpt_bench {
namespace {

// This process's part of gpt2s. Every tensor is generated whole (the same bytes as
// bench_core's) and cut to this rank's rows; `global_rows[i]` is mine[i]'s dim 0 in the
// whole tensor, `row0[i]` its first row there. The 0-D tensors (Adam's steps) are in `mine`
// on rank 0, which writes them in its raw file as bench_core's raw 4 files do; the other ranks
// hold them in `replicas`, for ckpt only (every FSDP rank holds them).
struct Shard {
  Workload mine, replicas;
  std::vector<int64_t> global_rows, row0;

  Shard(int world, int rank) {
    const std::vector<TensorSpec> specs = Gpt2sSpecs();
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const TensorSpec& s = specs[i];
      TensorBuf whole = MakeTensor(s.name, s.dtype, s.shape, i + 1);
      if (s.shape.empty()) {
        if (rank == 0) {
          mine.push_back(std::move(whole));
          global_rows.push_back(-1);
          row0.push_back(0);
        } else {
          replicas.push_back(std::move(whole));
        }
        continue;
      }
      const auto [begin, count] = ckpt::BalancedSplit(s.shape[0], world, rank);
      if (count == 0) continue;
      mine.push_back(RowShard(whole, world, rank));
      global_rows.push_back(s.shape[0]);
      row0.push_back(begin);
    }
  }

  // ckpt's view: dim-0 slices of the whole tensors, the 0-D ones whole on every rank.
  ckpt::StateDict View() {
    ckpt::StateDict state;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      TensorBuf& t = mine[i];
      if (t.shape.empty()) {
        state.Add(t.name, ckpt::Tensor::Full(t.dtype, t.shape, t.data.get()));
        continue;
      }
      ckpt::Shape global = t.shape;
      global[0] = global_rows[i];
      state.Add(t.name, ckpt::Tensor::Slice(t.dtype, global, 0, row0[i], t.shape[0], t.data.get()));
    }
    for (TensorBuf& t : replicas) state.Add(t.name, ckpt::Tensor::Full(t.dtype, t.shape, t.data.get()));
    return state;
  }
};

void MpiCheck(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) + ": " + std::string(msg, static_cast<std::size_t>(len)));
}

// A barrier that sleeps while it waits (see the header comment).
void QuietBarrier() {
  MPI_Request req;
  MpiCheck(MPI_Ibarrier(MPI_COMM_WORLD, &req), "MPI_Ibarrier");
  for (int done = 0;;) {
    MpiCheck(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// A load that differs from what was saved, on some rank (the message says which).
struct VerifyFailed {
  std::string what;
};

struct Bench {
  Bench(ckpt::Comm& c, fs::path r) : comm(c), run(std::move(r)) {}

  ckpt::Comm& comm;
  fs::path run;  // the same on every rank
  std::FILE* json = nullptr;  // rank 0's
  std::string commit, table;
  int round = 0;
  uint64_t bytes = 0;  // the whole workload: every rank's shard

  // One timed phase: `prepare` (every rank, untimed), a cold page cache, `body` between two
  // barriers, then `check` (every rank; "" or what differs), agreed on by all ranks.
  void Phase(const std::string& method, const std::string& op, const std::function<void()>& prepare,
             const std::function<void()>& body, const std::function<std::string()>& check = {}) {
    if (prepare) prepare();
    QuietBarrier();
    if (comm.rank() == 0) MakeCold(run);
    const double load = comm.rank() == 0 ? Load1() : 0;
    ResetPeakRss();
    QuietBarrier();
    const double c0 = CpuSeconds(), t0 = Now();
    body();
    const double cpu = CpuSeconds() - c0;
    QuietBarrier();
    const double wall = Now() - t0;
    double sums[2] = {cpu, static_cast<double>(VmHWMKiB()) / 1024.0};
    comm.AllReduce(sums, 2, ckpt::DType::kFloat64, ckpt::ReduceOp::kSum);
    const std::string errors = comm.AgreeOnErrors(check ? check() : "");
    if (!errors.empty()) throw VerifyFailed{method + " " + op + ": differs from what was saved:\n" + errors};
    if (comm.rank() == 0) Record(json, {"bench_mpi", table, method, op, round, wall, sums[0], load, sums[1], bytes, commit});
  }
};

std::string Mismatch(const Workload& w) {
  const std::string bad = FirstMismatch(w);
  return bad.empty() ? "" : "tensor " + bad;
}

[[noreturn]] void Usage(const char* argv0) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::fprintf(stderr, "usage: mpirun -np 4 %s --dir DIR [--rounds N] [--round-index I] [--json FILE] [--keep]\n",
                 argv0);
  std::exit(2);
}

int Run(ckpt::Comm& comm, int argc, char** argv) {
  const int rank = comm.rank(), world = comm.size();
  RunArgs args;
  for (int i = 1; i < argc; ++i)
    if (!ParseRunArg(argc, argv, i, args, Usage)) Usage(argv[0]);
  const fs::path& base = args.dir;
  const std::string& json_path = args.json;
  if (base.empty()) Usage(argv[0]);

  // Rank 0 names the run's folder (its pid) and tells the others.
  std::string run_name = "run-mpi-" + std::to_string(::getpid());
  ckpt::ByteBuffer name_buf(run_name.begin(), run_name.end());
  comm.Broadcast(name_buf, 0);
  Bench b(comm, base / std::string(name_buf.begin(), name_buf.end()));
  b.table = "gpt2s-" + std::to_string(world) + "p";
  b.round = args.round;
  if (const char* c = std::getenv("CKPT_BENCH_COMMIT")) b.commit = c;
  if (rank == 0) {
    if (!json_path.empty() && !(b.json = std::fopen(json_path.c_str(), "a"))) Die("open " + json_path);
    fs::remove_all(b.run);
    fs::create_directories(b.run);
    std::printf("ckpt %s bench/core MPI, %d processes, commit %s\n", CKPT_VERSION_STRING, world,
                b.commit.empty() ? "?" : b.commit.c_str());
    PrintMachine(b.run, b.json, "bench_mpi", b.commit, b.round);
  }
  Shard shard(world, rank);
  ckpt::StateDict view = shard.View();
  int64_t bytes = static_cast<int64_t>(TotalBytes(shard.mine));
  comm.AllReduce(&bytes, 1, ckpt::DType::kInt64, ckpt::ReduceOp::kSum);
  b.bytes = static_cast<uint64_t>(bytes);
  if (rank == 0)
    std::printf("gpt2s: %zu tensors, %lld bytes, dim-0 shards over %d processes\n", Gpt2sSpecs().size(),
                static_cast<long long>(bytes), world);

  const fs::path raw_dir = b.run / "raw", ckpt_dir = b.run / "ckpt";
  const fs::path raw_file = raw_dir / ("raw-" + std::to_string(rank) + ".bin");
  const std::string procs = std::to_string(world) + " processes";
  const std::string raw_name = "raw-c-wb, " + procs, ckpt_name = "ckpt, " + procs;
  // Rank 0 empties `dir` and makes it again; the others wait for it.
  auto fresh = [&](const fs::path& dir) {
    return [&comm, dir] {
      if (comm.rank() == 0) {
        fs::remove_all(dir);
        fs::create_directories(dir);
      }
      QuietBarrier();
    };
  };
  auto raw_save = [&] {
    RawWriteFile(shard.mine, raw_file, true, 1, 0);
    QuietBarrier();
    if (comm.rank() == 0) FsyncPath(raw_dir, O_RDONLY | O_DIRECTORY);
  };
  for (int r = 0; r < args.rounds; ++r, ++b.round) {
    if (rank == 0) std::printf("round %d (load average %.2f)\n", b.round, Load1());
    // Untimed, as in bench_core: the first write after a round's loads runs slow on this VM.
    fresh(raw_dir)();
    QuietBarrier();
    if (rank == 0) MakeCold(b.run);
    QuietBarrier();
    raw_save();
    b.Phase(raw_name, "save", fresh(raw_dir), raw_save);
    b.Phase(ckpt_name, "save", fresh(ckpt_dir), [&] { ckpt::Save(ckpt_dir, view, comm); });
    b.Phase(
        raw_name, "load", [&] { ZeroAll(shard.mine); }, [&] { RawReadFile(shard.mine, raw_file, 1, 0); },
        [&] { return Mismatch(shard.mine); });
    b.Phase(
        ckpt_name, "load",
        [&] {
          ZeroAll(shard.mine);
          ZeroAll(shard.replicas);
        },
        [&] { ckpt::Load(ckpt_dir, view, comm); },
        [&] {
          const std::string m = Mismatch(shard.mine);
          return m.empty() ? Mismatch(shard.replicas) : m;
        });
  }
  QuietBarrier();
  if (rank == 0) {
    std::printf("page cache: %s\n", ColdMethod().c_str());
    if (b.json) {
      std::fprintf(b.json, "{\"source\": \"bench_mpi\", \"cold\": \"%s\", \"round\": %d}\n",
                   JsonEscape(ColdMethod()).c_str(), b.round - 1);
      std::fclose(b.json);
    }
    if (!args.keep) fs::remove_all(b.run);
  }
  return 0;
}

}  // namespace
}  // namespace ckpt_bench

int main(int argc, char** argv) {
  ckpt::MpiSession session(&argc, &argv);
  int rc = 0;
  try {
    std::unique_ptr<ckpt::Comm> comm = ckpt::MpiWorld();
    rc = ckpt_bench::Run(*comm, argc, argv);
  } catch (const ckpt_bench::VerifyFailed& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) std::fprintf(stderr, "ckpt-bench-mpi: FAILED: %s\n", e.what.c_str());
    rc = 1;
  } catch (const std::exception& e) {
    // One rank's error while the others wait in a collective: end them all.
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "ckpt-bench-mpi: rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return rc;
}
