// bench_scale: metadata that grows with keys and files, not chunks (issue 9, part 2).
//
//   ckpt-bench-scale [--ranks 64,256,1024,16384] [--tensors 1000] [--irregular 5]
//                    [--inspect PATH] [--dir DIR] [--writer-chunks 40000,320000] [--writer-only]
//                    [--assemble-max N]
//
// For each simulated world of R ranks, every rank holding T tensors (FSDP-style: every
// tensor sharded over all ranks by the dim-0 step rule, some with a short last part; and
// `--irregular` percent of irregular ones: uneven explicit splits, replicated tensors whose
// writer AssignWriters picks, a 2-D grid over tp x fsdp), it runs what rank 0 runs at a
// save, without Comm (layout/save_plan.h): each description encoded and decoded as Gather
// would hand it over and merged one at a time, Finish, AssignWriters, WritesByRank, the
// plan message; then the metadata the save commits (Assemble with synthetic RankResults
// carrying checksums and stats, up to --assemble-max chunks; format v2: each rank's file and
// chunk count and per-key totals, at every size), and measures:
//   - rank 0's save-plan heap and time; the descriptions' and plan message's bytes
//   - metadata.json bytes, parse time and heap
//   - ckpt-inspect on a directory holding that metadata.json and empty stand-ins of the
//     shards (sparse files of the right size, not HDF5: a tool that opened one would fail):
//     the real tool as a subprocess (started by a spawner forked while this process is
//     small, so its peak RSS is its own), CPU and wall time and peak RSS, and, where strace
//     exists, that it opened no shard
//   - one rank's load plan (files and byte ranges) for an R -> R and an R -> R/2 load: from
//     the parsed metadata, ForEachCell per key, and (v2) the shard index texts of only the
//     files it reads, generated in memory as the writer writes them and checked against
//     files[i].index
//   - with --dir: CheckpointWriter's heap per chunk (two runs of different chunk counts
//     over the same 1,000 keys, real HDF5 shards under DIR; the heap fills to ~145 MiB by
//     40,000 chunks, HDF5's caches and free lists of 8 open files, and then stays flat, so
//     the default slope is taken from 40,000 to 320,000: from 20,000 it measured the filling,
//     568 B a chunk, against -122 B from 40,000); --writer-only: only this
// and prints each target of the issue as met / missed. Built against format v1 (main before
// v2) it measures the v1 baseline: v1 metadata, the explicit planner, no shard indexes read.
//
// Heap figures are malloc's bytes in use (mallinfo2), so they count what is live, not what
// the allocator keeps. Times are CPU seconds (of this thread; of the tool, user + system), with
// wall times beside the ones the targets judge. Single-threaded; never part of CTest.
#include <ckpt/ckpt.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "checkpoint/commit.h"
#include "format/names.h"
#include "layout/box.h"
#include "layout/save_messages.h"
#include "layout/save_plan.h"
#include "storage/shard_index.h"

#if __has_include("format/grid.h")
#include "format/grid.h"
#define CKPT_BENCH_V2 1
#else
#define CKPT_BENCH_V2 0
#endif

namespace fs = std::filesystem;
namespace layout = ckpt::layout;
using ckpt::Box;
using ckpt::Shape;

namespace {

// Times are this thread's CPU seconds: the machines this runs on are often shared, and a
// wall clock then measures the neighbours. Wall times are printed beside them where they differ.
struct Clock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<Clock>;
  static constexpr bool is_steady = true;
  static time_point now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return time_point(duration(static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec));
  }
};
using Wall = std::chrono::steady_clock;
template <typename C>
double Seconds(std::chrono::time_point<C> since) {
  return std::chrono::duration<double>(C::now() - since).count();
}
double MiB(double bytes) { return bytes / (1024.0 * 1024.0); }
double Heap() { return static_cast<double>(mallinfo2().uordblks); }

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: ckpt-bench-scale [--ranks R1,R2,...] [--tensors N] [--irregular PERCENT] [--inspect PATH]\n"
               "                        [--dir DIR] [--writer-chunks N1,N2] [--writer-only] [--assemble-max CHUNKS]\n");
  std::exit(2);
}

std::vector<int64_t> ParseList(const char* v) {
  std::vector<int64_t> out;
  for (const char* p = v; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoll(p, &end, 10));
    if (end == p || out.back() < 1) Usage();
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

// ---- the simulated model -------------------------------------------------------------

enum class Kind { kRegular, kUneven, kReplicated, kGrid };

struct Model {
  int world = 0;
  int tensors = 0;
  int irregular_every = 20;  // tensor t is irregular when t % every == every - 1
  int tp = 1;                // the grid's first dimension

  Kind KindOf(int t) const {
    if (irregular_every == 0 || t % irregular_every != irregular_every - 1) return Kind::kRegular;
    switch ((t / irregular_every) % 3) {
      case 0: return Kind::kUneven;
      case 1: return Kind::kReplicated;
      default: return Kind::kGrid;
    }
  }
  // The tensor a key names (the model's keys are "model.layers.<t / 10>.<name t % 10>.weight").
  int TensorOf(const std::string& key) const {
    const int layer = std::atoi(key.c_str() + 13);
    for (int i = 0; i < 10; ++i) {
      if (Key(layer * 10 + i) == key) return layer * 10 + i;
    }
    return -1;
  }
  std::string Key(int t) const {
    static const char* kNames[] = {"attn.q", "attn.k", "attn.v", "attn.o", "mlp.w1", "mlp.w2", "mlp.w3", "norm1", "norm2", "moe.gate"};
    return "model.layers." + std::to_string(t / 10) + "." + kNames[t % 10] + ".weight";
  }
  static int64_t Step(int t) { return 2 + t % 3; }
  // Uneven split: rank r holds 2 + r % 3 rows, starting at UnevenOffset(r).
  static int64_t UnevenOffset(int64_t r) { return 9 * (r / 3) + (r % 3 >= 1 ? 2 : 0) + (r % 3 >= 2 ? 3 : 0); }
  Shape ShapeOf(int t) const {
    switch (KindOf(t)) {
      case Kind::kRegular: return {Step(t) * world - (t % 2 ? Step(t) - 1 : 0), 64};  // odd t: a short last part
      case Kind::kUneven: return {UnevenOffset(world), 32};
      case Kind::kReplicated: return {512};
      case Kind::kGrid: return {4LL * tp, 8LL * (world / tp)};
    }
    return {};
  }
  // The box rank r holds of tensor t.
  Box BoxOf(int t, int r) const {
    const Shape s = ShapeOf(t);
    switch (KindOf(t)) {
      case Kind::kRegular: {
        const int64_t step = Step(t);
        return Box{{r * step, 0}, {std::min(step, s[0] - r * step), s[1]}};
      }
      case Kind::kUneven: return Box{{UnevenOffset(r), 0}, {2 + r % 3, s[1]}};
      case Kind::kReplicated: return Box::Full(s);
      case Kind::kGrid: return Box{{4LL * (r % tp), 8LL * (r / tp)}, {4, 8}};
    }
    return {};
  }

  layout::RankDescription Describe(int r) const {
    layout::RankDescription d;
    d.reserve(static_cast<std::size_t>(tensors) + 2);
    for (int t = 0; t < tensors; ++t) {
      layout::EntryClaim& c = d.emplace_back();
      c.key = Key(t);
      c.dtype = ckpt::DType::kBFloat16;
      c.shape = ShapeOf(t);
      c.boxes = {BoxOf(t, r)};
    }
    layout::EntryClaim& step = d.emplace_back();
    step.key = "step";
    step.kind = ckpt::EntryKind::kScalar;
    step.dtype = ckpt::DType::kInt64;
    step.value = "1000";
    layout::EntryClaim& cfg = d.emplace_back();
    cfg.key = "config";
    cfg.kind = ckpt::EntryKind::kJson;
    cfg.value = "{\"model\":\"sim\",\"layers\":" + std::to_string(tensors / 10) + "}";
    return d;
  }

  // The region rank q of a load into `world2` ranks asks for: the dim-0 step rule of that
  // world (sharded tensors), the whole tensor (replicated ones).
  std::optional<Box> Wanted(int t, int q, int world2) const {
    const Shape s = ShapeOf(t);
    if (KindOf(t) == Kind::kReplicated) return Box::Full(s);
    const int64_t step = (s[0] + world2 - 1) / world2;
    if (q * step >= s[0]) return std::nullopt;
    Box b = Box::Full(s);
    b.offsets[0] = q * step;
    b.sizes[0] = std::min(step, s[0] - q * step);
    return b;
  }
};

// ---- the plan's regions, either planner ----------------------------------------------

std::size_t RegionCount(const layout::SaveKey& k) {
#if CKPT_BENCH_V2
  return k.RegionCount();
#else
  return k.regions.size();
#endif
}

Box RegionBox(const layout::SaveKey& k, std::size_t g) {
#if CKPT_BENCH_V2
  return k.Region(g).box;
#else
  return k.regions[g].box;
#endif
}

// A synthetic chunk record: what the writer of region g of key k reports.
ckpt::ChunkMeta SyntheticChunk(const layout::SaveKey& k, uint32_t key_index, uint32_t g, const Box& box,
                               const std::string& file, uint64_t offset) {
  ckpt::ChunkMeta c;
  const bool whole = box.sizes == k.shape;
  c.box = box;
  c.file = file;
  c.dataset = ckpt::names::DatasetName(k.key, box.offsets, whole);
  const uint64_t h = (static_cast<uint64_t>(key_index) * 0x9E3779B97F4A7C15ULL) ^ (g * 0xC2B2AE3D27D4EB4FULL);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  c.checksum = std::string(ckpt::names::kChecksumPrefix) + hex;
  c.stored_bytes = static_cast<uint64_t>(box.NumElements()) * ckpt::DTypeSize(k.dtype);
#if CKPT_BENCH_V2
  c.block_bytes = uint64_t{1} << 20;
  c.blocks = hex;  // these chunks are under one block
  c.offset = offset;
#else
  (void)offset;
#endif
  const double v = static_cast<double>(g % 97) * 0.01;
  c.stats = ckpt::ChunkStats{-v, v + 1.0, 0.5 * v, 1.0 + v, 0, 0, box.NumElements()};
  return c;
}

// ---- measurements --------------------------------------------------------------------

struct PlanFigures {
  double merge_s = 0, finish_s = 0, writers_s = 0;
  double heap_merge = 0, heap_plan = 0, heap_writes = 0;
  double descriptions = 0, plan_message = 0, requests = 0;
  std::size_t keys = 0, regions = 0, explicit_regions = 0, regular_keys = 0, irregular_chunks = 0;
};

struct LoadFigures {
  double plan_s = 0, index_parse_s = 0;
  std::size_t files = 0, ranges = 0, chunks = 0;
  uint64_t bytes = 0, index_bytes = 0;
};

struct Tool {
  double wall_s = -1, cpu_s = -1, rss_mib = -1;
  int rc = -1;
  int shards_opened = -1;  // -1: not checked (no strace)
};

// Tools run from a spawner process forked at start-up, while this one is still small: a
// child forked from the benchmark itself would count the benchmark's pages (a fork copies
// its page tables, and exec keeps the old high-water mark in the child's ru_maxrss).
struct Spawner {
  int to = -1, from = -1;
};
Spawner g_spawner;

struct SpawnReply {
  int rc = -1;
  long maxrss_kib = 0;
  double cpu_s = 0;
};

// The spawner: reads NUL-separated argv lists ending in an empty one, runs each with
// stdout/stderr to /dev/null, answers with its exit status, peak RSS and CPU time.
[[noreturn]] void SpawnerLoop(int in, int out) {
  std::string buf;
  char c;
  std::vector<std::string> argv;
  while (read(in, &c, 1) == 1) {
    if (c != '\0') {
      buf += c;
      continue;
    }
    if (!buf.empty()) {
      argv.push_back(buf);
      buf.clear();
      continue;
    }
    std::vector<char*> args;
    for (std::string& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      execv(args[0], args.data());
      _exit(127);
    }
    int status = 0;
    rusage u{};
    wait4(pid, &status, 0, &u);
    SpawnReply r;
    r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.maxrss_kib = u.ru_maxrss;
    r.cpu_s = static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
              1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
    if (write(out, &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(1);
    argv.clear();
  }
  _exit(0);
}

void StartSpawner() {
  int a[2], b[2];
  if (pipe(a) != 0 || pipe(b) != 0) return;
  const pid_t pid = fork();
  if (pid == 0) {
    close(a[1]);
    close(b[0]);
    SpawnerLoop(a[0], b[1]);
  }
  close(a[0]);
  close(b[1]);
  g_spawner = Spawner{a[1], b[0]};
}

// Runs `argv` through the spawner: wall time, the tool's CPU time and peak RSS.
Tool RunTool(const std::vector<std::string>& argv) {
  Tool t;
  if (g_spawner.to < 0) return t;
  std::string msg;
  for (const std::string& a : argv) msg += a + '\0';
  msg += '\0';
  const auto start = Wall::now();
  SpawnReply r;
  if (write(g_spawner.to, msg.data(), msg.size()) != static_cast<ssize_t>(msg.size()) ||
      read(g_spawner.from, &r, sizeof r) != static_cast<ssize_t>(sizeof r)) {
    return t;
  }
  t.wall_s = Seconds(start);
  t.cpu_s = r.cpu_s;
  t.rss_mib = static_cast<double>(r.maxrss_kib) / 1024.0;
  t.rc = r.rc;
  return t;
}

std::string FindStrace() {
  for (const char* p : {"/usr/bin/strace", "/bin/strace"}) {
    if (access(p, X_OK) == 0) return p;
  }
  return "";
}

Tool Inspect(const std::string& inspect, const fs::path& dir) {
  Tool t = RunTool({inspect, dir.string()});
  const std::string strace = FindStrace();
  if (!strace.empty()) {
    const fs::path log = dir.parent_path() / "inspect.strace";
    RunTool({strace, "-f", "-qq", "-e", "trace=open,openat,openat2", "-o", log.string(), inspect, dir.string()});
    std::ifstream in(log);
    std::string line;
    t.shards_opened = 0;
    while (std::getline(in, line)) {
      if (line.find("shard-") != std::string::npos) ++t.shards_opened;
    }
    fs::remove(log);
  }
  return t;
}

const char* Verdict(bool met) { return met ? "met" : "MISSED"; }

int RunWorld(const Model& model, const std::string& inspect, const fs::path& scratch, int64_t assemble_max,
             bool judge) {
  const int world = model.world;
  std::printf("\n== %d ranks x %d tensors (%d irregular)%s\n", world, model.tensors,
              model.irregular_every ? model.tensors / model.irregular_every : 0, CKPT_BENCH_V2 ? "" : " [format v1]");
  // 1. rank 0's save plan.
  PlanFigures pf;
  const double heap0 = Heap();
  auto t = Clock::now();
  layout::SavePlanner planner(world);
  for (int r = 0; r < world; ++r) {
    layout::Message m = layout::EncodeDescription(model.Describe(r));
    pf.descriptions += static_cast<double>(m.size());
    const auto clock = Clock::now();
    planner.Add(layout::DecodeDescription(m, r));
    pf.merge_s += Seconds(clock);
  }
  pf.heap_merge = Heap() - heap0;
  t = Clock::now();
  layout::SavePlan plan = planner.Finish();
  pf.finish_s = Seconds(t);
  pf.heap_plan = Heap() - heap0;
  {
    const layout::Message requests = layout::EncodeRequests(layout::ReplicaRequests(plan));
    pf.requests = static_cast<double>(requests.size());
  }
  t = Clock::now();
  layout::AssignWriters(plan);
  const double heap_before_writes = Heap();
  std::vector<std::vector<layout::Write>> writes = layout::WritesByRank(plan);
  pf.writers_s = Seconds(t);
  pf.heap_writes = Heap() - heap_before_writes;
#if CKPT_BENCH_V2
  pf.plan_message = static_cast<double>(
      layout::EncodePlan("/ckpt/.step-1000.staging", static_cast<uint32_t>(plan.keys.size()), writes).size());
#else
  pf.plan_message = static_cast<double>(layout::EncodePlan("/ckpt/.step-1000.staging", writes).size());
#endif
  pf.keys = plan.keys.size();
  std::size_t chunks = 0;
  for (const layout::SaveKey& k : plan.keys) {
    const std::size_t n = RegionCount(k);
    pf.regions += n;
    if (k.kind == ckpt::EntryKind::kTensor) chunks += n;
    if (k.kind == ckpt::EntryKind::kTensor && model.KindOf(model.TensorOf(k.key)) != Kind::kRegular) {
      pf.irregular_chunks += n;
    }
#if CKPT_BENCH_V2
    if (k.regular()) {
      ++pf.regular_keys;
      continue;
    }
#endif
    pf.explicit_regions += k.regions.size();
  }
  std::printf("save plan (rank 0): %zu keys, %zu regions (%zu in explicit keys, %zu keys kept as runs); "
              "decode+merge %.2f s, finish %.2f s, writers+WritesByRank %.2f s\n",
              pf.keys, pf.regions, pf.explicit_regions, pf.regular_keys, pf.merge_s, pf.finish_s, pf.writers_s);
  std::printf("  plan heap %.1f MiB (while merging %.1f MiB) = %.0f B per chunk, %.0f B per (keys + ranks); "
              "WritesByRank %.1f MiB; descriptions gathered %.1f MiB; plan message %.1f MiB; replica requests %.2f MiB\n",
              MiB(pf.heap_plan), MiB(pf.heap_merge), pf.heap_plan / static_cast<double>(chunks),
              pf.heap_plan / static_cast<double>(pf.keys + static_cast<std::size_t>(world)), MiB(pf.heap_writes),
              MiB(pf.descriptions), MiB(pf.plan_message), MiB(pf.requests));

#if CKPT_BENCH_V2
  // 1b. The same plan by the save's fast path (checkpoint/save.cc, step 1): rank 0's key
  // table broadcast, a byte per key reduced, only the entries off the fast path gathered;
  // the plan message without the fast path's writes.
  {
    const layout::RankDescription d0 = model.Describe(0);
    const layout::KeyTable table = layout::MakeKeyTable(d0, world);
    const layout::Message table_message = layout::EncodeKeyTable(table);
    std::vector<uint8_t> fast(table.size(), 1);
    double rank_s = 0, gathered = 0, described = 0;  // rank_s: the ranks' own work, summed
    for (int r = 0; r < world; ++r) {
      layout::RankDescription mine = model.Describe(r);
      described += static_cast<double>(mine.size());
      const auto clock = Clock::now();
      const std::vector<uint8_t> flags = layout::FastEntries(layout::DecodeKeyTable(table_message, world), mine, r);
      rank_s += Seconds(clock);
      for (std::size_t k = 0; k < fast.size(); ++k) fast[k] = std::min(fast[k], flags[k]);
    }
    const double heap1 = Heap();
    t = Clock::now();
    layout::SavePlanner fast_planner(world);
    fast_planner.Add(layout::RankDescription(d0));
    fast_planner.AddFastParts(fast);
    std::size_t slow_entries = 0;
    double others_s = 0;
    for (int r = 1; r < world; ++r) {
      std::vector<uint32_t> entries;
      const auto before = Clock::now();
      layout::RankDescription mine = model.Describe(r);
      const auto clock = Clock::now();
      others_s += Seconds(before);  // the simulated ranks' work, not rank 0's
      const layout::RankDescription claims = layout::SlowClaims(table, fast, std::move(mine), entries);
      layout::Message m = layout::EncodeDescription(claims, entries);
      const double own = Seconds(clock);
      rank_s += own;
      others_s += own;
      gathered += static_cast<double>(m.size());
      slow_entries += claims.size();
      fast_planner.Add(layout::DecodeDescription(m, r, entries), std::move(entries));
    }
    layout::SavePlan fast_plan = fast_planner.Finish();
    layout::AssignWriters(fast_plan);
    const std::vector<uint64_t> counts = layout::WriteCounts(fast_plan);
    const layout::Message fast_message = layout::EncodePlan(
        "/ckpt/.step-1000.staging", static_cast<uint32_t>(fast_plan.keys.size()), layout::WritesByRank(fast_plan, fast));
    const double fast_s = Seconds(t) - others_s;
    const double heap_fast = Heap() - heap1;
    // The same plan, region for region (while that is quick), and the same writes per rank.
    bool same = fast_plan.keys.size() == plan.keys.size();
    for (std::size_t k = 0; same && k < plan.keys.size(); ++k) {
      const layout::SaveKey& a = plan.keys[k];
      const layout::SaveKey& b = fast_plan.keys[k];
      same = a.key == b.key && a.step == b.step && a.RegionCount() == b.RegionCount() && a.runs.size() == b.runs.size();
      for (std::size_t g = 0; same && g < a.RegionCount() && chunks <= static_cast<std::size_t>(assemble_max); ++g) {
        const layout::SaveRegion x = a.Region(g), y = b.Region(g);
        same = x.box == y.box && x.writer == y.writer && x.bytes == y.bytes;
      }
    }
    for (int r = 0; same && r < world; ++r) same = counts[r] == writes[r].size();
    std::size_t fast_keys = 0;
    for (uint8_t f : fast) fast_keys += f;
    const double others = std::max(1, world - 1);
    std::printf("fast path: %zu of %zu keys on it; key table %.1f KiB (broadcast), AllReduce %zu B; "
                "%zu of %.0f entries described\n",
                fast_keys, fast.size(), static_cast<double>(table_message.size()) / 1024.0, fast.size(), slow_entries,
                described - static_cast<double>(d0.size()));
    std::printf("  rank 0 gathers %.2f MiB (%.0f B per rank; was %.1f MiB, %.0f B per rank), sends a plan message of "
                "%.2f MiB (was %.1f MiB); plan heap %.1f MiB (was %.1f MiB); rank 0's fast planner+writers %.2f s; "
                "each rank's own work %.2f ms; same plan and write counts: %s\n",
                MiB(gathered), gathered / others, MiB(pf.descriptions), pf.descriptions / world,
                MiB(static_cast<double>(fast_message.size())), MiB(pf.plan_message), MiB(heap_fast),
                MiB(pf.heap_plan + pf.heap_writes), fast_s, 1e3 * rank_s / world, same ? "yes" : "NO");
    std::printf("  at 16384 ranks x %d tensors from these per-rank sizes: gathered %.1f MiB (was %.1f MiB), "
                "plan message %.1f MiB (was %.1f MiB)\n",
                model.tensors, MiB(gathered / others * 16383), MiB(pf.descriptions / world * 16383),
                MiB(static_cast<double>(fast_message.size()) / world * 16384), MiB(pf.plan_message / world * 16384));
    if (!same) {
      std::fprintf(stderr, "ckpt-bench-scale: the fast path planned differently\n");
      return 1;
    }
  }
#endif

  // 2. What each rank wrote, and the metadata rank 0 commits.
  std::vector<std::string> file_of(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) file_of[r] = ckpt::internal::ShardFileName(r, world);
  ckpt::Metadata m;
  m.world_size = world;
  m.state_dict_type = ckpt::StateDictType::kSharded;
  m.library_version = "bench";
  m.created = "2026-12-01T00:00:00Z";
  // Rank r's chunk records, in the order it writes them (its shard index).
  auto records = [&](int r, const std::function<void(uint32_t, uint32_t, const ckpt::ChunkMeta&)>& fn) {
    uint64_t offset = 4096;
    for (const layout::Write& w : writes[r]) {
      const layout::SaveKey& k = plan.keys[w.key];
      const Box box = RegionBox(k, w.region);
      const ckpt::ChunkMeta c = SyntheticChunk(k, w.key, w.region, box, file_of[r], offset);
      offset += c.stored_bytes;
      fn(w.key, w.region, c);
    }
    return offset;
  };
  std::vector<uint64_t> file_bytes(static_cast<std::size_t>(world), 0);
#if CKPT_BENCH_V2
  auto index_text = [&](int r) {
    ckpt::storage::ShardIndexBuilder b;
    records(r, [&](uint32_t key, uint32_t, const ckpt::ChunkMeta& c) {
      const layout::SaveKey& k = plan.keys[key];
      b.Add(ckpt::storage::ShardIndexEntry{k.key, false, k.dtype, k.shape, c});
    });
    return b.Finish();
  };
  std::vector<std::string> index_digest(static_cast<std::size_t>(world));
  double index_total = 0;
  t = Clock::now();
  for (int r = 0; r < world; ++r) {
    if (writes[r].empty()) continue;
    const std::string text = index_text(r);
    index_total += static_cast<double>(text.size());
    index_digest[r] = ckpt::storage::IndexDigest(text);
  }
  std::printf("shard indexes: %.1f MiB of index text in all (%.0f B per chunk), generated and hashed in %.1f s\n",
              MiB(index_total), index_total / static_cast<double>(chunks), Seconds(t));
#endif
  std::string text;
#if CKPT_BENCH_V2
  {
    // The save's own path (checkpoint/save.cc): each rank reports its file, index digest and
    // chunk count, and adds its chunks to per-key totals that the ranks reduce (here: added
    // in rank order in one process); rank 0 then assembles each key's layout from the plan.
    (void)assemble_max;
    const double h0 = Heap();
    t = Clock::now();
    std::vector<layout::RankResult> results(static_cast<std::size_t>(world));
    std::vector<layout::KeyTotals> totals(plan.keys.size());
    for (int r = 0; r < world; ++r) {
      if (writes[r].empty()) continue;
      results[r].file = file_of[r];
      results[r].chunks = writes[r].size();
      file_bytes[r] = records(r, [&](uint32_t key, uint32_t, const ckpt::ChunkMeta& c) { totals[key].Add(c); });
      results[r].bytes = file_bytes[r];
      results[r].index = index_digest[r];
    }
    layout::Assemble(plan, writes, results, totals, {}, m);
    const double heap = Heap() - h0;
    text = ckpt::SerializeMetadata(m);
    std::printf("Assemble (the save's path: per-rank results, per-key totals): %.1f MiB of heap (%.1f B per chunk), "
                "%.2f s with serialising\n",
                MiB(heap), heap / static_cast<double>(chunks), Seconds(t));
  }
#else
  double assemble_s = -1, assemble_heap = -1;
  if (static_cast<int64_t>(chunks) <= assemble_max) {
    // The save's own path: every rank's RankResult, Assemble, SerializeMetadata.
    const double h0 = Heap();
    t = Clock::now();
    std::vector<layout::RankResult> results(static_cast<std::size_t>(world));
    for (int r = 0; r < world; ++r) {
      if (writes[r].empty()) continue;
      results[r].file = file_of[r];
      results[r].chunks.reserve(writes[r].size());
      file_bytes[r] = records(r, [&](uint32_t, uint32_t, const ckpt::ChunkMeta& c) { results[r].chunks.push_back(c); });
      results[r].bytes = file_bytes[r];
    }
    const double results_heap = Heap() - h0;
    layout::Assemble(plan, writes, std::move(results), m);
    assemble_heap = Heap() - h0;
    text = ckpt::SerializeMetadata(m);
    assemble_s = Seconds(t);
    std::printf("Assemble (the save's path): RankResults %.1f MiB (%.0f B per chunk), metadata after Assemble %.1f MiB; "
                "results+Assemble+serialise %.2f s\n",
                MiB(results_heap), results_heap / static_cast<double>(chunks), MiB(assemble_heap), assemble_s);
  } else {
    std::printf("Assemble (the save's path): skipped, %zu chunks > --assemble-max %lld\n", chunks,
                static_cast<long long>(assemble_max));
  }
#endif
  m = ckpt::Metadata();
  if (text.empty()) return 0;  // v1 above --assemble-max: nothing to measure further
  // 3. metadata.json: bytes, parse.
  const double h0 = Heap();
  t = Clock::now();
  const auto wall = Wall::now();
  ckpt::Metadata parsed = ckpt::ParseMetadata(text);
  const double parse_s = Seconds(t), parse_wall = Seconds(wall);
  const double parse_heap = Heap() - h0;
  std::printf("metadata.json: %.1f MiB (%.0f B per chunk, %.0f B per key); parsed in %.3f s CPU (%.3f s wall) into "
              "%.1f MiB of heap\n",
              MiB(static_cast<double>(text.size())), static_cast<double>(text.size()) / static_cast<double>(chunks),
              static_cast<double>(text.size()) / static_cast<double>(pf.keys), parse_s, parse_wall, MiB(parse_heap));

  // 4. ckpt-inspect on the metadata and stand-ins of the shards.
  Tool ins;
  if (!inspect.empty()) {
    const fs::path dir = scratch / ("scale-" + std::to_string(world));
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / ckpt::names::kMetadataFile, std::ios::binary) << text;
    for (const ckpt::FileMeta& f : parsed.files) {
      const int fd = open((dir / f.name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(f.bytes)) != 0) {
        std::fprintf(stderr, "ckpt-bench-scale: cannot create %s\n", (dir / f.name).c_str());
        return 1;
      }
      close(fd);
    }
    ins = Inspect(inspect, dir);
    std::printf("ckpt-inspect (%zu stand-in shards, not HDF5): exit %d, %.3f s CPU (%.3f s wall), peak RSS %.0f MiB, "
                "shards opened: %s\n",
                parsed.files.size(), ins.rc, ins.cpu_s, ins.wall_s, ins.rss_mib,
                ins.shards_opened < 0 ? "not checked (no strace)" : std::to_string(ins.shards_opened).c_str());
    fs::remove_all(dir);
  }

  // 5. One rank's load plan, R -> R and R -> R/2.
  std::unordered_map<std::string, int> tensor_of;  // key -> t
  for (int tt = 0; tt < model.tensors; ++tt) tensor_of.emplace(model.Key(tt), tt);
  std::vector<LoadFigures> loads;
  for (int world2 : {world, std::max(1, world / 2)}) {
    const int q = world2 / 2 + (world2 > 2 ? 1 : 0);
    LoadFigures lf;
    double generate_s = 0;
    t = Clock::now();
#if CKPT_BENCH_V2
    // Per file position: (entry, chunk box, wanted region).
    struct Need {
      const std::string* key;
      Box box, want;
      std::size_t item;
    };
    std::map<int32_t, std::vector<Need>> needs;
    for (const auto& [key, e] : parsed.entries) {
      if (e.kind != ckpt::EntryKind::kTensor) continue;
      const std::optional<Box> want = model.Wanted(tensor_of.at(key), q, world2);
      if (!want) continue;
      ckpt::grid::ForEachCell(e.layout, e.shape, *want, [&](const Box& box, int32_t file) {
        needs[file].push_back(Need{&key, box, *want, ckpt::DTypeSize(e.dtype)});
      });
    }
    for (const auto& [file, list] : needs) {
      const ckpt::FileMeta& f = parsed.files[static_cast<std::size_t>(file)];
      const auto g0 = Clock::now();
      const std::string index = index_text(f.rank);  // what reading the attribute returns
      generate_s += Seconds(g0);
      const auto p0 = Clock::now();
      if (ckpt::storage::IndexDigest(index) != f.index) {
        std::fprintf(stderr, "ckpt-bench-scale: index digest of %s differs\n", f.name.c_str());
        return 1;
      }
      const ckpt::storage::ShardIndex idx = ckpt::storage::ParseShardIndex(index, f.name);
      lf.index_parse_s += Seconds(p0);
      lf.index_bytes += index.size();
      std::unordered_map<std::string_view, std::vector<const ckpt::storage::ShardIndexEntry*>> by_key;
      for (const ckpt::storage::ShardIndexEntry& rec : idx.entries) by_key[rec.key].push_back(&rec);
      for (const Need& n : list) {
        const ckpt::storage::ShardIndexEntry* rec = nullptr;
        for (const auto* c : by_key[*n.key]) {
          if (c->chunk.box == n.box) rec = c;
        }
        if (!rec || !rec->chunk.offset) {
          std::fprintf(stderr, "ckpt-bench-scale: %s holds no chunk %s of %s\n", f.name.c_str(), n.box.ToString().c_str(),
                       n.key->c_str());
          return 1;
        }
        const Box inter = *layout::Intersect(n.box, n.want);
        ++lf.chunks;
        layout::ForEachRun(n.box, n.want, inter, [&](const layout::Run& run) {
          ++lf.ranges;
          lf.bytes += static_cast<uint64_t>(run.count) * n.item;
        });
      }
    }
    lf.files = needs.size();
#else
    std::set<std::string> files;
    for (const auto& [key, e] : parsed.entries) {
      if (e.kind != ckpt::EntryKind::kTensor) continue;
      const std::optional<Box> want = model.Wanted(tensor_of.at(key), q, world2);
      if (!want) continue;
      for (const ckpt::ChunkMeta& c : e.chunks) {
        const std::optional<Box> inter = layout::Intersect(c.box, *want);
        if (!inter) continue;
        files.insert(c.file);
        ++lf.chunks;
        lf.ranges += static_cast<std::size_t>(layout::CountRuns(c.box, *want, *inter));
        lf.bytes += static_cast<uint64_t>(inter->NumElements()) * ckpt::DTypeSize(e.dtype);
      }
    }
    lf.files = files.size();
#endif
    lf.plan_s = Seconds(t) - generate_s;
    std::printf("load plan, rank %d of %d -> %d: %zu files, %zu chunks, %zu byte ranges, %.1f MiB; %.3f s after the "
                "parse (%.3f s of it parsing %.1f MiB of shard index), %.3f s with it\n",
                q, world, world2, lf.files, lf.chunks, lf.ranges, MiB(static_cast<double>(lf.bytes)), lf.plan_s,
                lf.index_parse_s, MiB(static_cast<double>(lf.index_bytes)), lf.plan_s + parse_s);
    loads.push_back(lf);
  }

  rusage self{};
  getrusage(RUSAGE_SELF, &self);
  std::printf("(this benchmark's peak RSS so far: %.0f MiB)\n", static_cast<double>(self.ru_maxrss) / 1024.0);
  if (judge) {
    std::printf("\ntargets at %d ranks x %d tensors:\n", world, model.tensors);
    const double md_mb = static_cast<double>(text.size()) / 1e6;
    std::printf("  metadata.json <= 64 MB: %.1f MB  %s\n", md_mb, Verdict(md_mb <= 64));
    std::printf("  parsed in <= 0.5 s: %.3f s CPU (%.3f s wall)  %s\n", parse_s, parse_wall, Verdict(parse_s <= 0.5));
    for (std::size_t i = 0; i < loads.size(); ++i) {
      std::printf("  load plan (%s) <= 0.2 s after the parse: %.3f s  %s\n", i == 0 ? "R -> R" : "R -> R/2",
                  loads[i].plan_s, Verdict(loads[i].plan_s <= 0.2));
    }
    if (!inspect.empty()) {
      std::printf("  ckpt-inspect <= 0.5 s: %.3f s CPU (%.3f s wall)  %s\n", ins.cpu_s, ins.wall_s,
                  Verdict(ins.cpu_s <= 0.5 && ins.rc == 0));
      std::printf("  ckpt-inspect <= 200 MiB: %.0f MiB  %s\n", ins.rss_mib, Verdict(ins.rss_mib <= 200));
      std::printf("  ckpt-inspect opens no shard: %s  %s\n",
                  ins.shards_opened < 0 ? "not checked" : (std::to_string(ins.shards_opened) + " opened").c_str(),
                  ins.shards_opened < 0 ? "unknown" : Verdict(ins.shards_opened == 0));
    }
    // O(keys + ranks): at most 1 KiB per key and per rank, plus 256 B per chunk of the
    // irregular tensors (explicit lists by design; each is O(ranks) here).
    const double bound = 1024.0 * static_cast<double>(pf.keys + static_cast<std::size_t>(world)) +
                         256.0 * static_cast<double>(pf.irregular_chunks);
    std::printf("  rank 0's save-plan heap O(keys + ranks) (<= 1 KiB x (keys + ranks) + 256 B x %zu chunks of irregular "
                "tensors = %.1f MiB): %.1f MiB  %s\n",
                pf.irregular_chunks, MiB(bound), MiB(pf.heap_plan), Verdict(pf.heap_plan <= bound));
  }
  return 0;
}

// CheckpointWriter's heap per chunk: `chunks` chunks of 16 bf16 over 1,000 keys in 8 files.
void RunWriter(const fs::path& scratch, const std::vector<int64_t>& counts) {
  constexpr int kKeys = 1000, kFiles = 8;
  std::vector<uint16_t> data(16, 0x3f80);
  std::vector<std::pair<int64_t, double>> points;
  for (int64_t n : counts) {
    const fs::path dir = scratch / "scale-writer";
    fs::remove_all(dir);
    const int64_t per_key = std::max<int64_t>(1, n / kKeys);
    ckpt::CheckpointWriter::Options o;
    o.num_files = kFiles;
    o.world_size = kFiles;
    o.state_dict_type = ckpt::StateDictType::kSharded;
    const auto t = Clock::now();
    const double h0 = Heap();
    double before_commit = 0;
    {
      auto w = ckpt::CheckpointWriter::Create(dir, o);
      for (int k = 0; k < kKeys; ++k) {
        const std::string key = "model.layers." + std::to_string(k / 10) + ".p" + std::to_string(k % 10);
        for (int64_t c = 0; c < per_key; ++c) {
          w->WriteChunk(key, ckpt::DType::kBFloat16, {per_key, 16}, Box{{c, 0}, {1, 16}}, data.data(),
                        static_cast<int>(c % kFiles));
        }
      }
      before_commit = Heap() - h0;
      w->Commit();
    }
    const int64_t total = per_key * kKeys;
    points.emplace_back(total, before_commit);
    std::printf("CheckpointWriter: %lld chunks over %d keys in %d files: heap before Commit %.1f MiB (%.0f B per chunk), "
                "%.1f s\n",
                static_cast<long long>(total), kKeys, kFiles, MiB(before_commit), before_commit / static_cast<double>(total),
                Seconds(t));
    fs::remove_all(dir);
  }
  if (points.size() >= 2) {
    const auto& [n1, h1] = points.front();
    const auto& [n2, h2] = points.back();
    const double slope = (h2 - h1) / static_cast<double>(n2 - n1);
    std::printf("  CheckpointWriter memory O(keys), not O(chunks) (<= 16 B per extra chunk): %.0f B per extra chunk  %s\n",
                slope, Verdict(slope <= 16));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> worlds{64, 256, 1024, 16384}, writer_counts{40000, 320000};
  int tensors = 1000, irregular = 5;
  int64_t assemble_max = 4'500'000;
  std::string inspect;
  fs::path dir;
  bool writer_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--writer-only") {
      writer_only = true;
      continue;
    }
    if (i + 1 >= argc) Usage();
    const char* v = argv[++i];
    if (a == "--ranks") {
      worlds = ParseList(v);
    } else if (a == "--tensors") {
      tensors = std::atoi(v);
    } else if (a == "--irregular") {
      irregular = std::atoi(v);
    } else if (a == "--inspect") {
      inspect = v;
    } else if (a == "--dir") {
      dir = v;
    } else if (a == "--writer-chunks") {
      writer_counts = ParseList(v);
    } else if (a == "--assemble-max") {
      assemble_max = std::atoll(v);
    } else {
      Usage();
    }
  }
  if (tensors < 1 || irregular < 0 || irregular > 100) Usage();
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress as it comes, into a file too
  if (!inspect.empty()) StartSpawner();
  const fs::path scratch = dir.empty() ? fs::temp_directory_path() / "ckpt-bench-scale" : dir;
  try {
    for (int64_t w : writer_only ? std::vector<int64_t>{} : worlds) {
      Model model;
      model.world = static_cast<int>(w);
      model.tensors = tensors;
      model.irregular_every = irregular == 0 ? 0 : std::max(1, 100 / irregular);
      model.tp = w % 8 == 0 ? 8 : 1;
      if (RunWorld(model, inspect, scratch, assemble_max, w == worlds.back()) != 0) return 1;
      malloc_trim(0);
    }
    if (!dir.empty()) RunWriter(dir, writer_counts);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-bench-scale: %s\n", e.what());
    return 1;
  }
  return 0;
}
