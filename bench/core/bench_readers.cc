// ckpt-bench-readers: how many readers a cold load wants on this machine's disk. Loads the
// gpt2s checkpoint cold, saved by 1 rank and by 4 (ranks as threads), with
// LoadOptions::io_threads = each of --readers, interleaved in an order shuffled every round
// with raw read(2) loads of the same bytes (one file; 4 files by 4 threads), and prints the
// medians [min-max] of wall and CPU seconds. What LoadOptions' default was chosen from.
// --direct lists LoadOptions::direct_io modes to run (auto, on, off); where one is not off,
// raw O_DIRECT loads of the same files (4 streams over one file; 4 files) run beside.
//
// Usage: ckpt-bench-readers --dir DIR [--rounds N (6)] [--readers 1,2,4] [--direct auto,off]
//                           [--settle S] [--touch GiB] [--json FILE] [--round-index I] [--keep]
//
// Every phase starts from a dropped page cache (MakeCold); then, where the host takes back
// this guest's free memory (free page reporting), it waits until the kernel has reported
// nothing for --settle seconds (default 1.5) and touches --touch GiB (default 3) of fresh
// memory and frees it, so the load's page cache meets pages the host has handed back
// rather than faulting them in from the host (see bench_common.h, HostReportedKiB). Never
// part of CTest.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "core/bench_common.h"

namespace ckpt_bench {
namespace {

// Waits until free page reporting has been quiet for `settle` seconds (at most 20 s), then
// touches `touch` bytes of fresh memory and frees them.
void QuietMemory(double settle, std::size_t touch) {
  if (HostReportedKiB() < 0) return;
  long long last = HostReportedKiB();
  const double start = Now();
  for (double since = Now(); Now() - since < settle && Now() - start < 20;) {
    ::usleep(100000);
    if (const long long k = HostReportedKiB(); k != last) last = k, since = Now();
  }
  if (touch == 0) return;
  void* m = ::mmap(nullptr, touch, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return;
  auto* p = static_cast<volatile char*>(m);
  for (std::size_t i = 0; i < touch; i += 4096) p[i] = 1;
  ::munmap(m, touch);
}

struct Variant {
  std::string name;
  int world = 1;  // ranks of the load (and of the checkpoint it reads)
  int readers = 0;  // io_threads; 0: a raw load
  ckpt::LoadOptions::DirectIo direct = ckpt::LoadOptions::DirectIo::kOff;  // ckpt's; raw: O_DIRECT unless kOff
};

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s --dir DIR [--rounds N] [--readers 1,2,4] [--direct auto,off] [--settle S] [--touch GiB] [--json FILE] "
               "[--round-index I] [--keep]\n",
               argv0);
  std::exit(2);
}

int Main(int argc, char** argv) {
  RunArgs args;
  args.rounds = 6;
  std::string readers = "1,2,4", direct = "auto,off";
  double settle = 1.5, touch_gib = 3;
  for (int i = 1; i < argc; ++i) {
    if (ParseRunArg(argc, argv, i, args, Usage)) continue;
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(argv[0]);
    const char* v = argv[++i];
    if (a == "--readers") readers = v;
    else if (a == "--direct") direct = v;
    else if (a == "--settle") settle = std::atof(v);
    else if (a == "--touch") touch_gib = std::atof(v);
    else Usage(argv[0]);
  }
  if (args.dir.empty()) Usage(argv[0]);
  using DirectIo = ckpt::LoadOptions::DirectIo;
  std::vector<std::pair<std::string, DirectIo>> modes;
  std::stringstream mode_list(direct);
  for (std::string item; std::getline(mode_list, item, ',');) {
    if (item == "auto") modes.emplace_back(", direct_io auto", DirectIo::kAuto);
    else if (item == "on") modes.emplace_back(", direct_io on", DirectIo::kOn);
    else if (item == "off") modes.emplace_back("", DirectIo::kOff);  // the default: buffered
    else Usage(argv[0]);
  }
  std::vector<Variant> variants = {{"raw-c, 1 file", 1, 0}, {"raw-c, 4 files", 4, 0}};
  if (std::any_of(modes.begin(), modes.end(), [](const auto& m) { return m.second != DirectIo::kOff; })) {
    variants.push_back({"raw O_DIRECT, 1 file, 4 streams", 1, 0, DirectIo::kOn});
    variants.push_back({"raw O_DIRECT, 4 files", 4, 0, DirectIo::kOn});
  }
  std::stringstream list(readers);
  for (std::string item; std::getline(list, item, ',');) {
    const int n = std::atoi(item.c_str());
    if (n < 1) Usage(argv[0]);
    for (const auto& [suffix, mode] : modes)
      for (int world : {1, 4})
        variants.push_back({"ckpt " + std::to_string(world) + (world == 1 ? " rank, " : " ranks, ") + item +
                                (n == 1 ? " reader" : " readers") + suffix,
                            world, n, mode});
  }
  std::string commit;
  if (const char* c = std::getenv("CKPT_BENCH_COMMIT")) commit = c;
  std::FILE* json = nullptr;
  if (!args.json.empty() && !(json = std::fopen(args.json.c_str(), "a"))) Die("open " + args.json);
  const fs::path run = args.dir / ("readers-" + std::to_string(::getpid()));
  fs::remove_all(run);
  fs::create_directories(run);
  std::printf("ckpt %s bench/core readers, commit %s\n", CKPT_VERSION_STRING, commit.empty() ? "?" : commit.c_str());
  PrintMachine(run, json, "bench_readers", commit, args.round);

  Workload g = MakeGpt2s();
  const uint64_t bytes = TotalBytes(g);
  for (int world : {1, 4}) {  // the files every round reads: untimed
    const fs::path raw = run / ("raw" + std::to_string(world)), c = run / ("c" + std::to_string(world));
    fs::create_directories(raw);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] { RawWriteFile(g, raw / ("raw-" + std::to_string(r) + ".bin"), true, world, r); });
    for (auto& t : threads) t.join();
    std::vector<ckpt::StateDict> views;
    for (int r = 0; r < world; ++r) views.push_back(View(g, world, r));
    ckpt::RunThreads(world, [&](ckpt::Comm& comm) { ckpt::Save(c, views[static_cast<std::size_t>(comm.rank())], comm); });
  }

  std::map<std::string, std::vector<std::pair<double, double>>> results;
  std::map<std::string, double> direct_share;  // of ckpt's bytes read, those read with O_DIRECT (last round)
  for (int round = args.round; round < args.round + args.rounds; ++round) {
    std::vector<Variant> order = variants;
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(round)));
    for (const Variant& v : order) {
      ZeroAll(g);
      const long long host0 = HostReportedKiB();
      MakeCold(run);
      QuietMemory(settle, static_cast<std::size_t>(touch_gib * (1 << 30)));
      const double load = Load1(), c0 = CpuSeconds(), t0 = Now();
      if (v.readers == 0) {
        std::vector<std::thread> threads;
        for (int r = 0; r < v.world; ++r)
          threads.emplace_back([&, r] {
            const fs::path file = run / ("raw" + std::to_string(v.world)) / ("raw-" + std::to_string(r) + ".bin");
            if (v.direct == DirectIo::kOff) RawReadFile(g, file, v.world, r);
            else RawReadFileDirect(g, file, v.world, r, v.world == 1 ? 4 : 1);
          });
        for (auto& t : threads) t.join();
      } else {
        std::vector<ckpt::StateDict> views;
        for (int r = 0; r < v.world; ++r) views.push_back(View(g, v.world, r));
        ckpt::LoadOptions options;
        options.io_threads = v.readers;
        options.direct_io = v.direct;
        std::atomic<uint64_t> read{0}, read_direct{0};
        ckpt::RunThreads(v.world, [&](ckpt::Comm& comm) {
          const ckpt::LoadReport r =
              ckpt::Load(run / ("c" + std::to_string(v.world)), views[static_cast<std::size_t>(comm.rank())], comm, options);
          read += r.bytes_read;
          read_direct += r.bytes_read_direct;
        });
        direct_share[v.name] = read ? static_cast<double>(read_direct) / static_cast<double>(read) : 0;
      }
      const double wall = Now() - t0, cpu = CpuSeconds() - c0;
      VerifyAll(g, v.name);
      const long long host1 = HostReportedKiB();
      results[v.name].push_back({wall, cpu});
      Record(json, {"bench_readers", "readers", v.name, "load", round, wall, cpu, load, -1, bytes, commit,
                    host0 < 0 || host1 < 0 ? -1.0 : static_cast<double>(host1 - host0) / 1024.0});
    }
  }
  std::printf("\n| cold load of gpt2s (%.2f GB), %d rounds | wall s, median [min-max] | CPU s | read with O_DIRECT |\n|---|---|---|---|\n",
              static_cast<double>(bytes) / kGB, args.rounds);
  for (const Variant& v : variants) {
    auto& xs = results[v.name];
    std::vector<double> wall, cpu;
    for (auto [w, c] : xs) wall.push_back(w), cpu.push_back(c);
    std::sort(wall.begin(), wall.end());
    std::sort(cpu.begin(), cpu.end());
    const std::string share = v.readers == 0 ? (v.direct == DirectIo::kOff ? "no" : "all")
                                             : std::to_string(static_cast<int>(100 * direct_share[v.name] + 0.5)) + "%";
    std::printf("| %s | %.2f [%.2f-%.2f] | %.2f | %s |\n", v.name.c_str(), wall[wall.size() / 2], wall.front(),
                wall.back(), cpu[cpu.size() / 2], share.c_str());
  }
  if (!args.keep) fs::remove_all(run);
  if (json) std::fclose(json);
  return 0;
}

}  // namespace
}  // namespace ckpt_bench

int main(int argc, char** argv) { return ckpt_bench::Main(argc, argv); }
