// bench_plan: the cost of a save's coordination, apart from its I/O.
//
//   ckpt-bench-plan save --dir DIR [--tensors N] [--ranks R] [--repeat K]
//     a ThreadComm save of N small tensors (default 20,000, R = 4 ranks): half of them
//     sharded by rows over the ranks, half replicated on every rank; median of K runs
//     (default 3). Most of its time is the ranks' messages, the plan and metadata.json.
//
// Threading: single-threaded apart from the ranks of a save.
#include <ckpt/ckpt.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
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
               "usage: ckpt-bench-plan save --dir DIR [--tensors N] [--ranks R] [--repeat K]\n");
  std::exit(2);
}

int RunSave(const fs::path& dir, int tensors, int ranks, int repeat) {
  constexpr int64_t kRowsPerRank = 4, kCols = 16;
  // One buffer per rank holding its rows of every sharded tensor, and one shared by the
  // replicated ones (replicas must agree).
  std::vector<std::vector<float>> rows(static_cast<std::size_t>(ranks),
                                       std::vector<float>(static_cast<std::size_t>(tensors / 2 + 1) * kRowsPerRank * kCols));
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < rows[r].size(); ++i) rows[r][i] = static_cast<float>(r * 31 + i % 97);
  }
  std::vector<float> replica(static_cast<std::size_t>(kCols), 0.5f);
  std::vector<double> times;
  for (int k = 0; k < repeat; ++k) {
    fs::remove_all(dir);
    const auto start = std::chrono::steady_clock::now();
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
  }
  fs::remove_all(dir);
  std::printf("save: %d ranks, %d tensors (half sharded, half replicated): median %.3f s of %d (min %.3f), peak RSS %.0f MiB\n",
              ranks, tensors, Median(times), repeat, *std::min_element(times.begin(), times.end()), PeakRssMiB());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) Usage();
  const std::string mode = argv[1];
  fs::path dir;
  int tensors = 20000, ranks = 4, repeat = 3;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage();
    const char* v = argv[++i];
    if (a == "--dir") {
      dir = v;
    } else if (a == "--tensors") {
      tensors = std::atoi(v);
    } else if (a == "--ranks") {
      ranks = std::atoi(v);
    } else if (a == "--repeat") {
      repeat = std::atoi(v);
    } else {
      Usage();
    }
  }
  if (tensors < 1 || ranks < 1 || repeat < 1) Usage();
  try {
    if (mode == "save" && !dir.empty()) return RunSave(dir, tensors, ranks, repeat);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-bench-plan: %s\n", e.what());
    return 1;
  }
  Usage();
}
