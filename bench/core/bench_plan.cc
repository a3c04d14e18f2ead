// bench_plan: the cost of a save's coordination, apart from its I/O.
//
//   ckpt-bench-plan save --dir DIR [--tensors N] [--ranks R] [--repeat K] [--keep]
//     a ThreadComm save of N small tensors (default 20,000, R = 4 ranks): half of them
//     sharded by rows over the ranks, half replicated on every rank; median of K runs
//     (default 3); --keep leaves the last checkpoint at DIR.
//
//   ckpt-bench-plan plan [--ranks R1,R2,...] [--tensors N]
//     rank 0's part of planning a save for R simulated ranks (default 1024,4096,16384), each
//     describing N tensors (default 64: half sharded by rows, one chunk per rank; a quarter
//     sharded two chunks per rank; a quarter replicated) and a scalar: decoding the ranks'
//     descriptions and merging them, checking the plan, the replica requests, the writers
//     and the plan broadcast. No Comm, no files.
//
// Threading: single-threaded apart from the ranks of a save.
#include <ckpt/ckpt.h>
#include <malloc.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "layout/save_messages.h"
#include "layout/save_plan.h"

namespace fs = std::filesystem;

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// CPU seconds of the whole process so far (every thread): on a busy machine a steadier
// figure than wall time.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double PeakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

[[noreturn]] void Usage() {
  std::fprintf(stderr,
               "usage: ckpt-bench-plan plan [--ranks R1,R2,...] [--tensors N]\n"
               "       ckpt-bench-plan save --dir DIR [--tensors N] [--ranks R] [--repeat K] [--keep]\n");
  std::exit(2);
}

// Heap bytes in use (malloc's own count; not returned to the system either way).
double HeapMiB() { return static_cast<double>(mallinfo2().uordblks) / (1024.0 * 1024.0); }

// Rank r's description of the simulated model.
ckpt::layout::RankDescription Simulated(int r, int world, int tensors) {
  using ckpt::Box;
  ckpt::layout::RankDescription d;
  d.reserve(static_cast<std::size_t>(tensors) + 1);
  for (int t = 0; t < tensors; ++t) {
    ckpt::layout::EntryClaim& c = d.emplace_back();
    c.key = "model.layers." + std::to_string(t / 4) + ".w" + std::to_string(t % 4);
    c.dtype = ckpt::DType::kBFloat16;
    if (t % 4 < 2) {  // sharded by rows
      c.shape = {4LL * world, 1024};
      c.boxes = {Box{{4LL * r, 0}, {4, 1024}}};
    } else if (t % 4 == 2) {  // two chunks per rank
      c.shape = {2LL * world, 256};
      c.boxes = {Box{{2LL * r, 0}, {1, 256}}, Box{{2LL * r + 1, 0}, {1, 256}}};
    } else {  // replicated
      c.shape = {1024};
      c.boxes = {Box::Full(c.shape)};
    }
  }
  ckpt::layout::EntryClaim& step = d.emplace_back();
  step.key = "step";
  step.kind = ckpt::EntryKind::kScalar;
  step.dtype = ckpt::DType::kInt64;
  step.value = "1000";
  return d;
}

int RunPlan(const std::vector<int>& worlds, int tensors) {
  namespace layout = ckpt::layout;
  for (int world : worlds) {
    std::vector<layout::Message> messages;  // as Gather hands them to rank 0
    uint64_t message_bytes = 0;
    for (int r = 0; r < world; ++r) {
      messages.push_back(layout::EncodeDescription(Simulated(r, world, tensors)));
      message_bytes += messages.back().size();
    }
    const double heap0 = HeapMiB();
    auto t = std::chrono::steady_clock::now();
    layout::SavePlanner planner(world);
    for (int r = 0; r < world; ++r) {
      planner.Add(layout::DecodeDescription(messages[r], r));
      layout::Message().swap(messages[r]);
    }
    const double t_merge = Seconds(t);
    t = std::chrono::steady_clock::now();
    layout::SavePlan plan = planner.Finish();
    const double t_check = Seconds(t);
    // The plan's heap: what grew, plus the descriptions freed on the way.
    const double heap_plan = HeapMiB() - heap0 + static_cast<double>(message_bytes) / (1024.0 * 1024.0);
    t = std::chrono::steady_clock::now();
    const layout::Message requests = layout::EncodeRequests(layout::ReplicaRequests(plan));
    const double t_requests = Seconds(t);
    t = std::chrono::steady_clock::now();
    layout::AssignWriters(plan);
    const auto writes = layout::WritesByRank(plan);
    const layout::Message plan_message = layout::EncodePlan("/checkpoints/.step-1000.staging", static_cast<uint32_t>(plan.keys.size()), writes);
    const double t_writers = Seconds(t);
    t = std::chrono::steady_clock::now();
    bool any = false;
    const std::size_t mine = layout::DecodePlan(plan_message, world - 1, world).writes.size() +
                             layout::DecodeRequests(requests, world - 1, world, any).size();
    const double t_last = Seconds(t);
    std::size_t regions = 0;
    for (const auto& k : plan.keys) regions += k.RegionCount();
    std::printf("plan: %6d ranks x %d tensors: %zu regions; descriptions %.1f MiB in all; decode+merge %.3f s, "
                "check %.3f s, replica requests %.3f s (%.1f MiB), writers+plan %.3f s (%.1f MiB); last rank "
                "decodes its %zu items in %.4f s; plan heap %.0f MiB, peak RSS %.0f MiB\n",
                world, tensors, regions, static_cast<double>(message_bytes) / (1024.0 * 1024.0), t_merge, t_check,
                t_requests, static_cast<double>(requests.size()) / (1024.0 * 1024.0), t_writers,
                static_cast<double>(plan_message.size()) / (1024.0 * 1024.0), mine, t_last, heap_plan, PeakRssMiB());
  }
  return 0;
}

int RunSave(const fs::path& dir, int tensors, int ranks, int repeat, bool keep) {
  constexpr int64_t kRowsPerRank = 4, kCols = 16;
  // One buffer per rank holding its rows of every sharded tensor, and one shared by the
  // replicated ones (replicas must agree).
  std::vector<std::vector<float>> rows(static_cast<std::size_t>(ranks),
                                       std::vector<float>(static_cast<std::size_t>(tensors / 2 + 1) * kRowsPerRank * kCols));
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < rows[r].size(); ++i) rows[r][i] = static_cast<float>(r * 31 + i % 97);
  }
  std::vector<float> replica(static_cast<std::size_t>(kCols), 0.5f);
  std::vector<double> times, cpu;
  for (int k = 0; k < repeat; ++k) {
    fs::remove_all(dir);
    const auto start = std::chrono::steady_clock::now();
    const double cpu0 = CpuSeconds();
    ckpt::RunThreads(ranks, [&](ckpt::Comm& comm) {
      ckpt::StateDict sd;
      for (int t = 0; t < tensors; ++t) {
        const std::string key = "model.layers." + std::to_string(t / 8) + ".p" + std::to_string(t % 8);
        if (t % 2 == 0) {
          float* mine = rows[comm.rank()].data() + static_cast<std::size_t>(t / 2) * kRowsPerRank * kCols;
          sd.Add(key, ckpt::Tensor::Slice(ckpt::DType::kFloat32, {kRowsPerRank * ranks, kCols}, 0,
                                          kRowsPerRank * comm.rank(), kRowsPerRank, mine));
        } else {
          sd.Add(key, ckpt::Tensor::Full(ckpt::DType::kFloat32, {kCols}, replica.data()));
        }
      }
      ckpt::Save(dir, sd, comm);
    });
    times.push_back(Seconds(start));
    cpu.push_back(CpuSeconds() - cpu0);
  }
  if (!keep) fs::remove_all(dir);
  std::printf("save: %d ranks, %d tensors (half sharded, half replicated): median %.3f s wall, %.3f s CPU of %d runs "
              "(min %.3f s wall), peak RSS %.0f MiB\n",
              ranks, tensors, Median(times), Median(cpu), repeat, *std::min_element(times.begin(), times.end()),
              PeakRssMiB());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Usage();
  const std::string mode = argv[1];
  fs::path dir;
  int tensors = 20000, ranks = 4, repeat = 3;
  std::vector<int> worlds{1024, 4096, 16384};
  bool tensors_given = false, keep = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--keep") {
      keep = true;
      continue;
    }
    if (i + 1 >= argc) Usage();
    const char* v = argv[++i];
    if (a == "--dir") {
      dir = v;
    } else if (a == "--tensors") {
      tensors = std::atoi(v);
      tensors_given = true;
    } else if (a == "--ranks") {
      ranks = std::atoi(v);
      worlds.clear();
      for (const char* p = v; *p;) {
        char* end = nullptr;
        worlds.push_back(static_cast<int>(std::strtol(p, &end, 10)));
        if (end == p || worlds.back() < 1) Usage();
        p = *end == ',' ? end + 1 : end;
      }
    } else if (a == "--repeat") {
      repeat = std::atoi(v);
    } else {
      Usage();
    }
  }
  if (tensors < 1 || ranks < 1 || repeat < 1) Usage();
  try {
    if (mode == "save" && !dir.empty()) return RunSave(dir, tensors, ranks, repeat, keep);
    if (mode == "plan") return RunPlan(worlds, tensors_given ? tensors : 64);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-bench-plan: %s\n", e.what());
    return 1;
  }
  Usage();
}
