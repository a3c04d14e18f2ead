// ckpt-bench-resave: the C++ API's row of bench/python/save_load.py, on the same bytes as
// the Python rows. Reads every tensor and scalar of the checkpoint SRC into memory (untimed),
// then --repeat times saves them with ckpt::Save (SingleComm) into a fresh DIR/cpp-<i> and
// loads DIR/cpp-0 back into the same buffers with ckpt::Load. Each timed phase starts from a
// dropped page cache when it can (root; --warm: never), as the Python rows do. Prints one JSON
// line per phase: {"method", "op", "wall" (best), "cpu" (user + sys of that run), "bytes"}.
//
//   ckpt-bench-resave SRC DIR [--repeat N] [--warm]
#include <ckpt/ckpt.h>

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

bool g_warm = false;

void DropCaches() {
  if (g_warm) return;
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (f) f << "3";
  std::this_thread::sleep_for(std::chrono::seconds(1));
}

struct Best {
  double wall = 1e300, cpu = 0;
};

void Time(Best& best, const std::function<void()>& prepare, const std::function<void()>& body) {
  prepare();
  DropCaches();
  const double c0 = CpuSeconds();
  const auto t0 = std::chrono::steady_clock::now();
  body();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (wall < best.wall) best = {wall, CpuSeconds() - c0};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: ckpt-bench-resave SRC DIR [--repeat N] [--warm]\n");
    return 2;
  }
  const fs::path src = argv[1], dir = argv[2];
  int repeat = 3;
  for (int i = 3; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--warm")) {
      g_warm = true;
    } else {
      std::fprintf(stderr, "ckpt-bench-resave: unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  try {
    const ckpt::Metadata md = ckpt::ReadMetadata(src);
    std::vector<std::vector<unsigned char>> buffers;
    ckpt::StateDict state;
    uint64_t bytes = 0;
    for (const auto& [key, e] : md.entries) {
      if (e.kind != ckpt::EntryKind::kTensor) continue;
      buffers.emplace_back(e.TensorBytes());
      state.Add(key, ckpt::Tensor::Full(e.dtype, e.shape, buffers.back().data()));
      bytes += e.TensorBytes();
    }
    ckpt::SingleComm comm;
    ckpt::LoadOptions all;
    all.strict = false;  // SRC's scalars and bytes are not in `state`
    ckpt::Load(src, state, comm, all);
    Best save, load;
    for (int i = 0; i < repeat; ++i) {
      const fs::path out = dir / ("cpp-" + std::to_string(i));
      Time(save, [&] { fs::remove_all(out); }, [&] { ckpt::Save(out, state, comm); });
    }
    for (int i = 0; i < repeat; ++i) Time(load, [] {}, [&] { ckpt::Load(dir / "cpp-0", state, comm); });
    for (int i = 0; i < repeat; ++i) fs::remove_all(dir / ("cpp-" + std::to_string(i)));
    std::printf("{\"method\": \"C++ ckpt::Save / Load\", \"op\": \"save\", \"wall\": %.6f, \"cpu\": %.6f, \"bytes\": %llu}\n",
                save.wall, save.cpu, static_cast<unsigned long long>(bytes));
    std::printf("{\"method\": \"C++ ckpt::Save / Load\", \"op\": \"load\", \"wall\": %.6f, \"cpu\": %.6f, \"bytes\": %llu}\n",
                load.wall, load.cpu, static_cast<unsigned long long>(bytes));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-bench-resave: %s\n", e.what());
    return 1;
  }
  return 0;
}
