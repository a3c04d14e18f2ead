// bench_core: one round of ckpt against the best raw way to write and read the same bytes,
// and against the HDF5 C API, on two workloads (issue 10):
//   gpt2s       GPT-2 small + Adam state, 592 tensors, ~1.49 GB float32 (bench/common/gpt2s.h)
//   many-small  20,000 1-D float32 tensors, sizes log-uniform in [16, 16384] elements (~190 MB)
//
// Every timed phase starts from an empty page cache (sync; echo 3 > /proc/sys/vm/drop_caches,
// and a 1 s pause), so no phase meets a cache that the previous one filled: a write that has
// to reclaim a full cache spends its time in the kernel, not on the disk. Saves are timed to
// fsync (files and directory). Loads land in the workload's own buffers (touched, zeroed first)
// and are verified by hash. Each phase records wall seconds, CPU seconds of the process (user
// + sys, every thread), the 1-minute load average at its start and its peak RSS. The gpt2s
// tables save with every method first, then load in an order shuffled each round (--round-index
// counts rounds, and seeds the order), so no method always loads after the same one.
//
// The raw baselines:
//   raw-c      write(2) of the tensors' buffers in 8 MiB calls into one file, fsync
//   raw-c-wb   the same, starting write-back every 64 MiB (sync_file_range WRITE), fsync:
//              the best raw save here (the disk works while the writer still writes)
//   raw-c load read(2) of that file in 8 MiB calls into the buffers
//   raw-c-2r   load: the same file read by two threads, each pread(2)ing the next 8 MiB
//              piece, so a read is in flight while the other's bytes are copied out (ckpt's
//              reader keeps one in flight while it hashes); the targets take the faster
//   raw, 4 files: 4 threads, each raw-c-wb of its dim-0 shard into its own file
//   tmpfs rows: the same writes into /dev/shm (no disk: the CPU path alone)
//
// Usage: ckpt-bench-core --dir DIR [--rounds N] [--round-index I] [--json FILE] [--only T,..]
//                        [--methods M,..] [--keep]
//   Each round runs every phase once, interleaved; bench/run.sh runs one round per process,
//   alternating with the Python peers (bench/peers/peers.py), and bench/report.py prints the
//   medians. --json appends one JSON line per measured phase; --only runs only the named
//   tables (gpt2s, gpt2s-4, tmpfs, many-small; e.g. for a profiler), --methods only the named
//   rows of them (raw-c, raw-c-wb, h5c, ckpt, "ckpt, 4 threads", ...).
#include <ckpt/ckpt.h>

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include "bench_common.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ckpt_bench {
namespace {

Workload MakeManySmall() {
  Workload w;
  uint64_t x = 0x5eed;
  const double lo = std::log(16.0), hi = std::log(16384.0);
  for (int i = 0; i < 20000; ++i) {
    const double u = static_cast<double>(XorShift(x) >> 11) / 9007199254740992.0;
    char name[32];
    std::snprintf(name, sizeof name, "small.%05d", i);
    Add(w, name, ckpt::DType::kFloat32, {static_cast<int64_t>(std::llround(std::exp(lo + u * (hi - lo))))});
  }
  return w;
}

// Column shards for a load at `world` ranks by dimension 1 (what a TP reshard reads: every
// row of each 2-D tensor, a third of its columns): per-rank buffers, filled by the load and
// checked against the workload. 1-D tensors stay split by rows; every rank holds the 0-D ones.
struct ColumnShards {
  struct Part {
    std::size_t tensor;
    int64_t begin, count;  // along dim 1 (dim 0 for 1-D)
    std::vector<uint8_t> data;
  };
  int world;
  std::vector<std::vector<Part>> parts;  // [rank]
  std::vector<std::vector<uint8_t>> scratch;  // [rank]: the raw baseline's read buffer

  ColumnShards(const Workload& w, int world_) : world(world_), parts(static_cast<std::size_t>(world_)) {
    for (std::size_t i = 0; i < w.size(); ++i) {
      const TensorBuf& t = w[i];
      for (int r = 0; r < world; ++r) {
        if (t.shape.empty()) {
          parts[static_cast<std::size_t>(r)].push_back({i, 0, 1, std::vector<uint8_t>(t.bytes)});
          continue;
        }
        const int dim = t.shape.size() >= 2 ? 1 : 0;
        auto [begin, count] = ckpt::BalancedSplit(t.shape[static_cast<std::size_t>(dim)], world, r);
        if (count == 0) continue;
        const std::size_t bytes = t.bytes / static_cast<std::size_t>(t.shape[static_cast<std::size_t>(dim)]) *
                                  static_cast<std::size_t>(count);
        parts[static_cast<std::size_t>(r)].push_back({i, begin, count, std::vector<uint8_t>(bytes)});
      }
    }
  }
  void Zero() {
    for (auto& rank : parts)
      for (auto& p : rank) std::memset(p.data.data(), 0, p.data.size());
  }
  // Touched read buffers of `bytes` for the raw baseline (made before its timing starts).
  void Scratch(std::size_t bytes) {
    scratch.resize(static_cast<std::size_t>(world));
    for (auto& b : scratch) {
      b.resize(bytes);
      std::memset(b.data(), 1, b.size());
    }
  }
  ckpt::StateDict View(Workload& w, int rank) {
    ckpt::StateDict state;
    for (auto& p : parts[static_cast<std::size_t>(rank)]) {
      const TensorBuf& t = w[p.tensor];
      if (t.shape.empty()) {
        state.Add(t.name, ckpt::Tensor::Full(t.dtype, t.shape, p.data.data()));
        continue;
      }
      state.Add(t.name, ckpt::Tensor::Slice(t.dtype, t.shape, t.shape.size() >= 2 ? 1 : 0, p.begin, p.count,
                                            p.data.data()));
    }
    return state;
  }
  // Every part equals the workload's columns (or rows) it stands for.
  void Check(const Workload& w, const std::string& what) const {
    for (const auto& rank : parts)
      for (const auto& p : rank) {
        const TensorBuf& t = w[p.tensor];
        bool same = true;
        if (t.shape.size() >= 2) {
          const std::size_t cols = static_cast<std::size_t>(t.shape[1]);
          const std::size_t inner = t.bytes / static_cast<std::size_t>(t.shape[0]) / cols;  // bytes per column
          const std::size_t run = static_cast<std::size_t>(p.count) * inner;
          for (int64_t row = 0; row < t.shape[0] && same; ++row)
            same = std::memcmp(p.data.data() + static_cast<std::size_t>(row) * run,
                               t.data.get() + static_cast<std::size_t>(row) * cols * inner +
                                   static_cast<std::size_t>(p.begin) * inner,
                               run) == 0;
        } else {
          const std::size_t off = t.shape.empty() ? 0 : t.bytes / static_cast<std::size_t>(t.shape[0]) *
                                                            static_cast<std::size_t>(p.begin);
          same = std::memcmp(p.data.data(), t.data.get() + off, p.data.size()) == 0;
        }
        if (!same) {
          std::fprintf(stderr, "bench_core: %s: tensor %s differs from what was saved\n", what.c_str(),
                       t.name.c_str());
          std::exit(1);
        }
      }
  }
};

void RawSave(const Workload& w, const fs::path& dir, bool writeback, int files) {
  fs::create_directories(dir);
  std::vector<std::thread> threads;
  for (int r = 0; r < files; ++r)
    threads.emplace_back([&, r] {
      RawWriteFile(w, dir / ("raw-" + std::to_string(r) + ".bin"), writeback, files, r);
    });
  for (auto& t : threads) t.join();
  FsyncPath(dir, O_RDONLY | O_DIRECTORY);
}

void RawLoad(Workload& w, const fs::path& dir, int files) {
  std::vector<std::thread> threads;
  for (int r = 0; r < files; ++r)
    threads.emplace_back([&, r] { RawReadFile(w, dir / ("raw-" + std::to_string(r) + ".bin"), files, r); });
  for (auto& t : threads) t.join();
}

// The raw baseline of a load by columns: reader `c` of `cols.world` reads each of the
// `files` raw files whole (its columns lie in every row, so every byte must be fetched) and
// copies its columns out of them, as a raw program resharding by columns would.
void RawColumnsLoad(Workload& w, const fs::path& dir, int files, ColumnShards& cols) {
  std::vector<std::thread> threads;
  for (int c = 0; c < cols.world; ++c) {
    threads.emplace_back([&, c] {
      std::vector<ColumnShards::Part*> part(w.size(), nullptr);
      for (auto& q : cols.parts[static_cast<std::size_t>(c)]) part[q.tensor] = &q;
      std::vector<uint8_t>& buf = cols.scratch.at(static_cast<std::size_t>(c));
      for (int r = 0; r < files; ++r) {
        const fs::path path = dir / ("raw-" + std::to_string(r) + ".bin");
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) Die("open " + path.string());
        const std::size_t size = static_cast<std::size_t>(fs::file_size(path));
        if (size > buf.size()) Die("raw column load: scratch smaller than " + path.string());
        for (std::size_t done = 0; done < size;) {
          const ssize_t k = ::pread(fd, buf.data() + done, std::min(kRawBlock, size - done),
                                    static_cast<off_t>(done));
          if (k <= 0) Die("read " + path.string());
          done += static_cast<std::size_t>(k);
        }
        ::close(fd);
        std::size_t at = 0;
        for (std::size_t i = 0; i < w.size(); ++i) {
          const TensorBuf& t = w[i];
          const std::size_t n = ShardBytes(t, files, r).second;
          const uint8_t* src = buf.data() + at;
          at += n;
          ColumnShards::Part* q = part[i];
          if (!q || n == 0) continue;
          if (t.shape.empty()) {
            std::memcpy(q->data.data(), src, n);
            continue;
          }
          const auto [row0, rows] = ckpt::BalancedSplit(t.shape[0], files, r);
          const std::size_t row_bytes = t.bytes / static_cast<std::size_t>(t.shape[0]);
          if (t.shape.size() == 1) {  // the part is a row range too: copy the overlap
            const int64_t lo = std::max(row0, q->begin), hi = std::min(row0 + rows, q->begin + q->count);
            if (lo < hi)
              std::memcpy(q->data.data() + static_cast<std::size_t>(lo - q->begin) * row_bytes,
                          src + static_cast<std::size_t>(lo - row0) * row_bytes,
                          static_cast<std::size_t>(hi - lo) * row_bytes);
            continue;
          }
          const std::size_t inner = row_bytes / static_cast<std::size_t>(t.shape[1]);
          const std::size_t run = static_cast<std::size_t>(q->count) * inner;
          for (int64_t row = 0; row < rows; ++row)
            std::memcpy(q->data.data() + static_cast<std::size_t>(row0 + row) * run,
                        src + static_cast<std::size_t>(row) * row_bytes + static_cast<std::size_t>(q->begin) * inner,
                        run);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
}

// ---- HDF5 C API: one contiguous dataset per tensor, the plain way (the floor for HDF5)

void H5Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "bench_core: HDF5: %s failed\n", what.c_str());
    std::exit(2);
  }
}

hid_t H5Type(ckpt::DType d) { return d == ckpt::DType::kInt64 ? H5T_NATIVE_INT64 : H5T_NATIVE_FLOAT; }

void H5Save(const Workload& w, const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path path = dir / "h5c.h5";
  const hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
  H5Check(f >= 0, "H5Fcreate " + path.string());
  for (const auto& t : w) {
    std::vector<hsize_t> dims(t.shape.begin(), t.shape.end());
    const hid_t space = dims.empty() ? H5Screate(H5S_SCALAR) : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t ds = H5Dcreate2(f, t.name.c_str(), H5Type(t.dtype), space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Check(ds >= 0, "H5Dcreate2 " + t.name);
    H5Check(H5Dwrite(ds, H5Type(t.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data.get()) >= 0, "H5Dwrite");
    H5Dclose(ds);
    H5Sclose(space);
  }
  H5Fclose(f);
  H5Pclose(fapl);
  FsyncPath(path, O_RDONLY);
  FsyncPath(dir, O_RDONLY | O_DIRECTORY);
}

void H5Load(Workload& w, const fs::path& dir) {
  const hid_t f = H5Fopen((dir / "h5c.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  H5Check(f >= 0, "H5Fopen");
  for (auto& t : w) {
    const hid_t ds = H5Dopen2(f, t.name.c_str(), H5P_DEFAULT);
    H5Check(ds >= 0, "H5Dopen2 " + t.name);
    H5Check(H5Dread(ds, H5Type(t.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.data.get()) >= 0, "H5Dread");
    H5Dclose(ds);
  }
  H5Fclose(f);
}

// ---- ckpt

// `pack_bytes`: SaveOptions::pack_bytes (0: every chunk its own dataset, as before packs).
void CkptSave(Workload& w, const fs::path& dir, int world, uint64_t pack_bytes = ckpt::SaveOptions{}.pack_bytes) {
  std::vector<ckpt::StateDict> views;
  for (int r = 0; r < world; ++r) views.push_back(View(w, world, r));
  ckpt::SaveOptions options;
  options.pack_bytes = pack_bytes;
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    ckpt::Save(dir, views[static_cast<std::size_t>(comm.rank())], comm, options);
  });
}

void CkptLoad(Workload& w, const fs::path& dir, int world,
              ckpt::LoadOptions::DirectIo direct = ckpt::LoadOptions{}.direct_io) {
  std::vector<ckpt::StateDict> views;
  for (int r = 0; r < world; ++r) views.push_back(View(w, world, r));
  ckpt::LoadOptions options;
  options.direct_io = direct;
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    ckpt::Load(dir, views[static_cast<std::size_t>(comm.rank())], comm, options);
  });
}

// ---- measurement

std::FILE* g_json = nullptr;
int g_round = 0;
std::string g_commit;
std::string g_only;     // comma-separated tables to run; empty: all
std::string g_methods;  // comma-separated methods to run (e.g. "ckpt,h5c"); empty: all

bool Listed(const std::string& list, const std::string& name) {
  return list.empty() || ("," + list + ",").find("," + name + ",") != std::string::npos;
}

bool Wanted(const std::string& table, const std::string& method) {
  return Listed(g_only, table) && Listed(g_methods, method);
}

// Runs one timed phase: `prepare` (untimed), a cold page cache, then `body` timed.
void Phase(const std::string& table, const std::string& method, const std::string& op, uint64_t bytes,
           const fs::path& cold_dir, const std::function<void()>& prepare, const std::function<void()>& body,
           const std::function<void()>& check = {}) {
  if (!Wanted(table, method)) return;
  if (prepare) prepare();
  const long long host0 = HostReportedKiB();
  MakeCold(cold_dir);
  const double load = Load1();
  ResetPeakRss();
  const double c0 = CpuSeconds(), t0 = Now();
  body();
  const double wall = Now() - t0, cpu = CpuSeconds() - c0;
  const double rss = static_cast<double>(VmHWMKiB()) / 1024.0;
  if (check) check();
  const long long host1 = HostReportedKiB();
  Record(g_json, {"bench_core", table, method, op, g_round, wall, cpu, load, rss, bytes, g_commit,
                  host0 < 0 || host1 < 0 ? -1.0 : static_cast<double>(host1 - host0) / 1024.0});
}

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr, "usage: %s --dir DIR [--rounds N] [--round-index I] [--json FILE] [--tmpfs DIR] [--only T,..] [--methods M,..] [--keep]\n",
               argv0);
  std::exit(2);
}

int Main(int argc, char** argv) {
  fs::path tmpfs = "/dev/shm";
  RunArgs args;
  for (int i = 1; i < argc; ++i) {
    if (ParseRunArg(argc, argv, i, args, Usage)) continue;
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(argv[0]);
    const char* v = argv[++i];
    if (a == "--tmpfs") tmpfs = v;
    else if (a == "--only") g_only = v;
    else if (a == "--methods") g_methods = v;
    else Usage(argv[0]);
  }
  const fs::path& base = args.dir;
  const std::string& json = args.json;
  const int rounds = args.rounds;
  g_round = args.round;
  if (base.empty()) Usage(argv[0]);
  if (const char* c = std::getenv("CKPT_BENCH_COMMIT")) g_commit = c;
  if (!json.empty() && !(g_json = std::fopen(json.c_str(), "a"))) Die("open " + json);
  fs::create_directories(base);
  const fs::path run = base / ("run-" + std::to_string(::getpid()));
  fs::remove_all(run);
  fs::create_directories(run);
  const bool have_tmpfs = !tmpfs.empty() && fs::is_directory(tmpfs);
  const fs::path shm = tmpfs / ("ckpt-bench-" + std::to_string(::getpid()));

  std::printf("ckpt %s bench/core, commit %s\n", CKPT_VERSION_STRING, g_commit.empty() ? "?" : g_commit.c_str());
  PrintMachine(run, g_json, "bench_core", g_commit, g_round);
  Workload g = MakeGpt2s(), m = MakeManySmall();
  ColumnShards cols(g, 3);
  const uint64_t gb = TotalBytes(g), mb = TotalBytes(m);
  std::printf("gpt2s: %zu tensors, %llu bytes; many-small: %zu tensors, %llu bytes\n", g.size(),
              static_cast<unsigned long long>(gb), m.size(), static_cast<unsigned long long>(mb));

  for (int r = 0; r < rounds; ++r, ++g_round) {
    std::printf("round %d (load average %.2f)\n", g_round, Load1());
    const fs::path d = run / "r";
    auto clean = [&] { fs::remove_all(d); };
    auto zero = [](Workload& w) { return [&w] { ZeroAll(w); }; };
    auto verify = [](Workload& w, std::string what) { return [&w, what] { VerifyAll(w, what); }; };
    // Untimed: whichever phase comes first in a round, after the previous round's loads,
    // wrote at a third of the disk's speed on this VM, sys time equal to wall time, raw and
    // ckpt alike (copying into the page cache, copy_folio_from_iter_atomic, ran slow: on this
    // Firecracker VM the balloon takes back freed memory, and touching it again faults on
    // the host). A raw write of the same bytes takes that hit here instead.
    // The previous round's files go first, and the untimed write takes the hit that follows.
    clean();
    MakeCold(run);
    RawSave(g, d / "warm", true, 1);
    // Saves, then loads of what they wrote, each method in its own directory (no save pays
    // for deleting another's files), the loads of a group in an order shuffled every round. A
    // cold load's time on this VM depends on what ran just before it: raw-c took 0.44-0.47 s
    // as the first load after the saves and 0.96-1.14 s after other loads; raw-c-2r 0.99 s
    // right after a ckpt load and 0.65 s after a raw one (interleaved rounds in one process).
    // In a fixed order that fell on the same methods every round (ckpt 1 -> 3 after ckpt's
    // load, 4 -> 1 after the 4-rank load), and a rotated order keeps each one's predecessor.
    // Shuffled, it falls on each method in some rounds, and the medians compare the methods.
    auto shuffled = [](std::vector<std::function<void()>> loads) {
      std::mt19937 rng(static_cast<uint32_t>(g_round) * 2654435761u + 1);
      std::shuffle(loads.begin(), loads.end(), rng);
      for (auto& load : loads) load();
    };
    const fs::path raw1 = d / "raw-c", rawwb = d / "raw-c-wb", h5 = d / "h5c", c1 = d / "c1";
    const fs::path raw4 = d / "raw-4", c4 = d / "c4";
    // gpt2s, 1 process. raw-c-wb's file is the one the raw loads read.
    Phase("gpt2s", "raw-c", "save", gb, run, {}, [&] { RawSave(g, raw1, false, 1); });
    Phase("gpt2s", "raw-c-wb", "save", gb, run, {}, [&] { RawSave(g, rawwb, true, 1); });
    Phase("gpt2s", "h5c", "save", gb, run, {}, [&] { H5Save(g, h5); });
    Phase("gpt2s", "ckpt", "save", gb, run, {}, [&] { CkptSave(g, c1, 1); });
    shuffled({
        [&] { Phase("gpt2s", "raw-c", "load", gb, run, zero(g), [&] { RawLoad(g, rawwb, 1); }, verify(g, "raw load")); },
        [&] {
          Phase("gpt2s", "raw-c-2r", "load", gb, run, zero(g),
                [&] { RawReadFileParallel(g, rawwb / "raw-0.bin", 1, 0, 2); }, verify(g, "raw load, 2 reads in flight"));
        },
        [&] { Phase("gpt2s", "h5c", "load", gb, run, zero(g), [&] { H5Load(g, h5); }, verify(g, "h5c load")); },
        [&] { Phase("gpt2s", "ckpt", "load", gb, run, zero(g), [&] { CkptLoad(g, c1, 1); }, verify(g, "ckpt load")); },
        [&] {
          Phase("gpt2s", "ckpt 1 -> 3 ranks", "load", gb, run, zero(g), [&] { CkptLoad(g, c1, 3); },
                verify(g, "ckpt load 1->3"));
        },
        // Without the page cache: raw's O_DIRECT read (4 streams of 8 MiB pieces, copied out
        // of aligned buffers: the tensors' are not), and ckpt's LoadOptions::direct_io.
        [&] {
          Phase("gpt2s", "raw O_DIRECT, 4 streams", "load", gb, run, zero(g),
                [&] { RawReadFileDirect(g, rawwb / "raw-0.bin", 1, 0, 4); }, verify(g, "raw O_DIRECT load"));
        },
        [&] {
          Phase("gpt2s", "ckpt, direct_io auto", "load", gb, run, zero(g),
                [&] { CkptLoad(g, c1, 1, ckpt::LoadOptions::DirectIo::kAuto); }, verify(g, "ckpt direct load"));
        },
    });
    // gpt2s, 4 ranks.
    Phase("gpt2s-4", "raw-c-wb, 4 files", "save", gb, run, {}, [&] { RawSave(g, raw4, true, 4); });
    Phase("gpt2s-4", "ckpt, 4 threads", "save", gb, run, {}, [&] { CkptSave(g, c4, 4); });
    shuffled({
        [&] {
          Phase("gpt2s-4", "raw-c-wb, 4 files", "load", gb, run, zero(g), [&] { RawLoad(g, raw4, 4); },
                verify(g, "raw 4 load"));
        },
        [&] {
          Phase("gpt2s-4", "raw 4 files -> 3 readers by columns", "load", gb, run,
                [&] {
                  cols.Zero();
                  cols.Scratch(static_cast<std::size_t>(gb / 4 + (std::size_t{64} << 20)));
                },
                [&] { RawColumnsLoad(g, raw4, 4, cols); }, [&] { cols.Check(g, "raw load 4->3 by columns"); });
        },
        [&] {
          Phase("gpt2s-4", "ckpt, 4 threads", "load", gb, run, zero(g), [&] { CkptLoad(g, c4, 4); },
                verify(g, "ckpt 4 load"));
        },
        [&] {
          Phase("gpt2s-4", "ckpt 4 -> 1 rank", "load", gb, run, zero(g), [&] { CkptLoad(g, c4, 1); },
                verify(g, "ckpt load 4->1"));
        },
        [&] {
          Phase("gpt2s-4", "ckpt 4 -> 3 ranks by columns", "load", gb, run, [&] { cols.Zero(); },
                [&] {
                  ckpt::RunThreads(3, [&](ckpt::Comm& comm) {
                    ckpt::StateDict view = cols.View(g, comm.rank());
                    ckpt::Load(c4, view, comm);
                  });
                },
                [&] { cols.Check(g, "ckpt load 4->3 by columns"); });
        },
    });
    // The gpt2s files go, and an untimed write takes the hit again before the groups below
    // (whose saves each delete the previous one's files, as they always did).
    clean();
    MakeCold(run);
    RawSave(m, d / "warm", true, 1);
    // tmpfs: the CPU path alone.
    if (have_tmpfs) {
      auto shm_clean = [&] { fs::remove_all(shm); };
      Phase("tmpfs", "raw-c", "save", gb, run, shm_clean, [&] { RawSave(g, shm, false, 1); });
      Phase("tmpfs", "ckpt", "save", gb, run, shm_clean, [&] { CkptSave(g, shm / "c1", 1); });
      Phase("tmpfs", "ckpt, 4 threads", "save", gb, run, shm_clean, [&] { CkptSave(g, shm / "c4", 4); });
      fs::remove_all(shm);
    }
    // many small tensors.
    Phase("many-small", "raw-c-wb", "save", mb, run, clean, [&] { RawSave(m, d, true, 1); });
    Phase("many-small", "raw-c-wb", "load", mb, run, zero(m), [&] { RawLoad(m, d, 1); }, verify(m, "raw load"));
    Phase("many-small", "h5c", "save", mb, run, clean, [&] { H5Save(m, d); });
    Phase("many-small", "h5c", "load", mb, run, zero(m), [&] { H5Load(m, d); }, verify(m, "h5c load"));
    Phase("many-small", "ckpt", "save", mb, run, clean, [&] { CkptSave(m, d / "c1", 1); });
    Phase("many-small", "ckpt", "load", mb, run, zero(m), [&] { CkptLoad(m, d / "c1", 1); },
          verify(m, "ckpt load"));
    Phase("many-small", "ckpt, 4 threads", "save", mb, run, clean, [&] { CkptSave(m, d / "c4", 4); });
    Phase("many-small", "ckpt, 4 threads", "load", mb, run, zero(m), [&] { CkptLoad(m, d / "c4", 4); },
          verify(m, "ckpt 4 load"));
    // The same saves without packs (FORMAT.md §5.7): one dataset a tensor.
    Phase("many-small", "ckpt, unpacked", "save", mb, run, clean, [&] { CkptSave(m, d / "c1u", 1, 0); });
    Phase("many-small", "ckpt, 4 threads, unpacked", "save", mb, run, clean, [&] { CkptSave(m, d / "c4u", 4, 0); });
    Phase("many-small", "ckpt, 4 threads, unpacked", "load", mb, run, zero(m), [&] { CkptLoad(m, d / "c4u", 4); },
          verify(m, "ckpt 4 unpacked load"));
    clean();
  }
  std::printf("page cache: %s\n", ColdMethod().c_str());
  if (g_json) {
    std::fprintf(g_json, "{\"source\": \"bench_core\", \"cold\": \"%s\", \"round\": %d}\n",
                 JsonEscape(ColdMethod()).c_str(), g_round - 1);
    std::fclose(g_json);
  }
  if (!args.keep) fs::remove_all(run);
  return 0;
}

}  // namespace
}  // namespace ckpt_bench

int main(int argc, char** argv) { return ckpt_bench::Main(argc, argv); }
