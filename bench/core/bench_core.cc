// bench_core: save and load the gpt2s workload (GPT-2 small + Adam state, ~1.49 GB float32;
// shapes as in shared/bench/workloads.py) with libckpt, against a raw baseline of the same
// bytes (one file, plain write + fsync / plain read), in one run:
//   raw write, raw read (cold)
//   ckpt Save 1 rank, Save 4 ranks (FSDP-like dim-0 shards), timed to durability
//   ckpt Load 1 rank, Load 4 ranks, Load 4-rank save into 1 rank, 1-rank save into 3 ranks
// Reads start from a cold page cache (drop_caches if allowed, else posix_fadvise DONTNEED).
// Every load lands in the workload's own buffers (zeroed first) and is verified by hash, so
// the process holds the workload once: peak RSS beyond it is libckpt's overhead.
//
// Usage: ckpt-bench-core --dir DIR [--repeat N] [--keep]
//   DIR on the disk to measure (~4.5 GB free); each phase runs N times (default 3), median shown.
#include <ckpt/ckpt.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/gpt2s.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr double kGB = 1e9;
constexpr double kMiB = 1024.0 * 1024.0;
// The raw baseline's write/read size. Calls of a whole tensor (up to 154 MB) measure 2-3x
// slower reads on a virtio disk than 8 MiB calls; the baseline should be the disk's best
// plain sequential speed, not a handicapped one.
constexpr std::size_t kRawBlock = std::size_t{8} << 20;

struct TensorBuf {
  std::string name;
  ckpt::DType dtype;
  ckpt::Shape shape;
  std::size_t bytes = 0;
  std::unique_ptr<uint8_t[]> data;
  uint64_t hash = 0;  // of the generated contents
};

// Deterministic, hard-to-compress fill: small float32 values from a xorshift stream.
void Fill(TensorBuf& t, uint64_t seed) {
  if (t.dtype == ckpt::DType::kInt64) {
    const int64_t step = 1000;
    std::memcpy(t.data.get(), &step, sizeof step);
    return;
  }
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  auto* f = reinterpret_cast<float*>(t.data.get());
  const std::size_t n = t.bytes / 4;
  for (std::size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f[i] = (static_cast<float>(x >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.04f;
  }
}

std::vector<TensorBuf> MakeWorkload() {
  std::vector<TensorBuf> w;
  auto add = [&w](std::string name, ckpt::DType dtype, ckpt::Shape shape) {
    TensorBuf t{std::move(name), dtype, std::move(shape), 0, nullptr, 0};
    t.bytes = static_cast<std::size_t>(ckpt::NumElements(t.shape)) * ckpt::DTypeSize(dtype);
    t.data.reset(new uint8_t[t.bytes]);
    Fill(t, w.size() + 1);
    t.hash = XXH3_64bits(t.data.get(), t.bytes);
    w.push_back(std::move(t));
  };
  const auto params = ckpt_bench::Gpt2sParams();
  for (const auto& [name, shape] : params) add(name, ckpt::DType::kFloat32, shape);
  for (const auto& [name, shape] : params) {  // torch.optim.Adam state order
    const std::string st = "optimizer.state." + name + ".";
    add(st + "step", ckpt::DType::kInt64, {});
    add(st + "exp_avg", ckpt::DType::kFloat32, shape);
    add(st + "exp_avg_sq", ckpt::DType::kFloat32, shape);
  }
  return w;
}

// Rows [begin, begin + count) of dim 0 for `rank` of `world` (the first n % world get one more).
std::pair<int64_t, int64_t> RowRange(int64_t n, int world, int rank) {
  const int64_t base = n / world, extra = n % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, base + (rank < extra ? 1 : 0)};
}

// This rank's view of the workload: FSDP-like dim-0 shards, 0-D tensors replicated.
ckpt::StateDict View(std::vector<TensorBuf>& w, int world, int rank) {
  ckpt::StateDict state;
  for (TensorBuf& t : w) {
    if (world == 1 || t.shape.empty()) {
      state.Add(t.name, ckpt::Tensor::Full(t.dtype, t.shape, t.data.get()));
      continue;
    }
    auto [begin, count] = RowRange(t.shape[0], world, rank);
    const std::size_t row_bytes = t.bytes / static_cast<std::size_t>(t.shape[0]);
    state.Add(t.name, ckpt::Tensor::Slice(t.dtype, t.shape, 0, begin, count,
                                          t.data.get() + static_cast<std::size_t>(begin) * row_bytes));
  }
  return state;
}

uint64_t TotalBytes(const std::vector<TensorBuf>& w) {
  uint64_t n = 0;
  for (const auto& t : w) n += t.bytes;
  return n;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string ReadFirstLine(const std::string& path, const std::string& prefix = "") {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (prefix.empty() || line.rfind(prefix, 0) == 0) return line;
  return "";
}

int64_t VmHWMKiB() {
  std::string line = ReadFirstLine("/proc/self/status", "VmHWM:");
  return line.empty() ? -1 : std::stoll(line.substr(6));
}

// Resets the peak-RSS counter (Linux >= 4.0); false if not possible.
bool ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

void Die(const std::string& what) {
  std::fprintf(stderr, "bench_core: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(2);
}

void FsyncPath(const fs::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags | O_CLOEXEC);
  if (fd < 0) Die("open " + p.string());
  if (::fsync(fd) != 0) Die("fsync " + p.string());
  ::close(fd);
}

std::string g_cold_method;

// Lets the file system finish what earlier phases left (journal commits of deletions,
// writeback), so that each timed phase starts from the same quiet state.
void Settle() {
  ::sync();
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ::sync();
}

// Evicts `dir`'s files from the page cache: drop_caches when allowed, else fadvise.
void MakeCold(const fs::path& dir) {
  ::sync();
  {
    std::ofstream f("/proc/sys/vm/drop_caches");
    if (f) {
      f << "3";
      f.flush();
      if (f) {
        g_cold_method = "sync; echo 3 > /proc/sys/vm/drop_caches";
        return;
      }
    }
  }
  g_cold_method = "posix_fadvise(POSIX_FADV_DONTNEED) on every file (drop_caches not permitted)";
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void ZeroAll(std::vector<TensorBuf>& w) {
  for (auto& t : w) std::memset(t.data.get(), 0, t.bytes);
}

void VerifyAll(const std::vector<TensorBuf>& w, const std::string& what) {
  for (const auto& t : w) {
    if (XXH3_64bits(t.data.get(), t.bytes) != t.hash) {
      std::fprintf(stderr, "bench_core: %s: tensor %s differs from what was saved\n", what.c_str(),
                   t.name.c_str());
      std::exit(1);
    }
  }
}

// One measured phase: its times over the repetitions, and its peak RSS.
struct Phase {
  std::string name;
  bool is_write = false;
  std::vector<double> seconds;
  int64_t peak_rss_kib = -1;

  double Median() const {
    std::vector<double> v = seconds;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2);
  }
};

uint64_t g_total = 0;

void Sample(Phase& p, double seconds) {
  p.seconds.push_back(seconds);
  p.peak_rss_kib = std::max(p.peak_rss_kib, VmHWMKiB());
  std::printf("    %-34s %7.2f s  %6.2f GB/s\n", p.name.c_str(), seconds,
              static_cast<double>(g_total) / seconds / kGB);
  std::fflush(stdout);
}

double RawWrite(const std::vector<TensorBuf>& w, const fs::path& dir) {
  fs::create_directories(dir);
  const fs::path path = dir / "raw.bin";
  const double t0 = Now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Die("open " + path.string());
  for (const auto& t : w) {
    std::size_t done = 0;
    while (done < t.bytes) {
      const ssize_t n = ::write(fd, t.data.get() + done, std::min(kRawBlock, t.bytes - done));
      if (n < 0) {
        if (errno == EINTR) continue;
        Die("write " + path.string());
      }
      done += static_cast<std::size_t>(n);
    }
  }
  if (::fsync(fd) != 0) Die("fsync " + path.string());
  ::close(fd);
  FsyncPath(dir, O_RDONLY | O_DIRECTORY);
  return Now() - t0;
}

double RawRead(std::vector<TensorBuf>& w, const fs::path& dir) {
  const fs::path path = dir / "raw.bin";
  const double t0 = Now();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + path.string());
  for (auto& t : w) {
    std::size_t done = 0;
    while (done < t.bytes) {
      const ssize_t n = ::read(fd, t.data.get() + done, std::min(kRawBlock, t.bytes - done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) Die("read " + path.string());
      done += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  return Now() - t0;
}

double CkptSave(std::vector<TensorBuf>& w, const fs::path& dir, int world) {
  std::vector<ckpt::StateDict> views;
  for (int r = 0; r < world; ++r) views.push_back(View(w, world, r));
  const double t0 = Now();
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    ckpt::Save(dir, views[static_cast<std::size_t>(comm.rank())], comm);
  });
  return Now() - t0;
}

double CkptLoad(std::vector<TensorBuf>& w, const fs::path& dir, int world) {
  std::vector<ckpt::StateDict> views;
  for (int r = 0; r < world; ++r) views.push_back(View(w, world, r));
  const double t0 = Now();
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    ckpt::Load(dir, views[static_cast<std::size_t>(comm.rank())], comm);
  });
  return Now() - t0;
}

uint64_t DirBytes(const fs::path& dir) {
  uint64_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) n += e.file_size();
  return n;
}

void PrintMachine(const fs::path& dir) {
  std::string cpu = ReadFirstLine("/proc/cpuinfo", "model name");
  if (auto p = cpu.find(':'); p != std::string::npos) cpu = cpu.substr(p + 2);
  std::string mem = ReadFirstLine("/proc/meminfo", "MemTotal:");
  double mem_gib = 0;
  if (!mem.empty()) mem_gib = std::stod(mem.substr(9)) / kMiB;
  struct utsname u {};
  ::uname(&u);
  // The filesystem holding `dir`: the longest mount point that prefixes it.
  std::ifstream mounts("/proc/self/mounts");
  std::string src, mnt, type, best_src, best_type, best_mnt, rest;
  const std::string abs = fs::absolute(dir).string();
  while (mounts >> src >> mnt >> type && std::getline(mounts, rest)) {
    if (abs.rfind(mnt, 0) == 0 && mnt.size() >= best_mnt.size()) {
      best_src = src;
      best_type = type;
      best_mnt = mnt;
    }
  }
  struct statvfs sv {};
  ::statvfs(dir.c_str(), &sv);
  std::string rotational;
  if (best_src.rfind("/dev/", 0) == 0) {
    std::string dev = best_src.substr(5);
    std::string r = ReadFirstLine("/sys/class/block/" + dev + "/queue/rotational");
    if (!r.empty()) rotational = r == "1" ? ", rotational" : ", non-rotational";
  }
  std::printf("machine: %s, %u cores, %.1f GiB RAM, kernel %s %s\n", cpu.c_str(),
              std::thread::hardware_concurrency(), mem_gib, u.sysname, u.release);
  std::printf("disk:    %s (%s%s) mounted at %s, %.0f GiB free; bench dir %s\n", best_src.c_str(),
              best_type.c_str(), rotational.c_str(), best_mnt.c_str(),
              static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize) / (kMiB * 1024.0),
              abs.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  fs::path base;
  bool keep = false;
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) {
      base = argv[++i];
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--keep") {
      keep = true;
    } else {
      std::fprintf(stderr, "usage: %s --dir DIR [--repeat N] [--keep]\n", argv[0]);
      return 2;
    }
  }
  if (base.empty()) {
    std::fprintf(stderr, "usage: %s --dir DIR [--repeat N] [--keep]\n", argv[0]);
    return 2;
  }
  fs::create_directories(base);
  const fs::path run = base / ("run-" + std::to_string(::getpid()));
  fs::remove_all(run);
  fs::create_directories(run);

  std::printf("ckpt %s bench/core: gpt2s (GPT-2 small + Adam state)\n", CKPT_VERSION_STRING);
  PrintMachine(run);
  const std::string load_start = ReadFirstLine("/proc/loadavg");
  const int64_t rss_before = VmHWMKiB();
  std::vector<TensorBuf> w = MakeWorkload();
  g_total = TotalBytes(w);
  std::printf("workload: %zu tensors, %llu bytes (%.3f GB, %.0f MiB) float32 + int64 steps\n", w.size(),
              static_cast<unsigned long long>(g_total), static_cast<double>(g_total) / kGB,
              static_cast<double>(g_total) / kMiB);
  const int64_t rss_workload = VmHWMKiB();
  const bool can_reset = ResetPeakRss();
  std::printf("peak RSS: workload resident %.0f MiB (process before it %.0f MiB); per-phase peak %s\n",
              static_cast<double>(rss_workload) / 1024.0, static_cast<double>(rss_before) / 1024.0,
              can_reset ? "(VmHWM reset before each phase)" : "(VmHWM cannot be reset: cumulative)");
  std::printf("load checks checksums (LoadOptions default); every load is verified against the source hash\n\n");

  const fs::path raw = run / "raw", d1 = run / "ckpt-w1", d4 = run / "ckpt-w4";
  std::vector<Phase> phases = {{"raw write (write + fsync)", true, {}, -1},
                               {"raw read (cold)", false, {}, -1},
                               {"ckpt save, 1 rank", true, {}, -1},
                               {"ckpt save, 4 ranks", true, {}, -1},
                               {"ckpt load, 1 rank", false, {}, -1},
                               {"ckpt load, 4 ranks", false, {}, -1},
                               {"ckpt load, 4-rank save -> 1 rank", false, {}, -1},
                               {"ckpt load, 1-rank save -> 3 ranks", false, {}, -1}};
  struct LoadCase {
    std::size_t phase;
    fs::path dir;
    int world;
  };
  const LoadCase loads[] = {{4, d1, 1}, {5, d4, 4}, {6, d4, 1}, {7, d1, 3}};
  // Phases interleave within each repetition, so a slow patch of a shared machine hits ckpt
  // and raw alike; the table reports medians.
  for (int rep = 0; rep < repeat; ++rep) {
    std::printf("  repetition %d of %d\n", rep + 1, repeat);
    for (const fs::path& d : {raw, d1, d4}) fs::remove_all(d);
    Settle();
    ResetPeakRss();
    Sample(phases[0], RawWrite(w, raw));
    ZeroAll(w);
    MakeCold(raw);
    Settle();
    ResetPeakRss();
    Sample(phases[1], RawRead(w, raw));
    VerifyAll(w, "raw read");
    fs::remove_all(raw);
    Settle();
    ResetPeakRss();
    Sample(phases[2], CkptSave(w, d1, 1));
    Settle();
    ResetPeakRss();
    Sample(phases[3], CkptSave(w, d4, 4));
    for (const LoadCase& l : loads) {
      ZeroAll(w);
      MakeCold(l.dir);
      Settle();
      ResetPeakRss();
      Sample(phases[l.phase], CkptLoad(w, l.dir, l.world));
      VerifyAll(w, phases[l.phase].name);
    }
  }
  const double raw_w = static_cast<double>(g_total) / phases[0].Median() / kGB;
  const double raw_r = static_cast<double>(g_total) / phases[1].Median() / kGB;
  std::printf("\nmedian of %d: %-24s %9s %9s %8s %13s %14s\n", repeat, "", "seconds", "GB/s", "vs raw",
              "range GB/s", "peak RSS MiB");
  double min_save = 1e9, min_load = 1e9;
  int64_t worst = 0;
  for (const Phase& p : phases) {
    const double gbps = static_cast<double>(g_total) / p.Median() / kGB;
    const double ratio = gbps / (p.is_write ? raw_w : raw_r);
    const auto [lo, hi] = std::minmax_element(p.seconds.begin(), p.seconds.end());
    std::printf("  %-36s %9.2f %9.2f %7.2fx %6.2f-%-6.2f %14.0f\n", p.name.c_str(), p.Median(), gbps,
                ratio, static_cast<double>(g_total) / *hi / kGB, static_cast<double>(g_total) / *lo / kGB,
                static_cast<double>(p.peak_rss_kib) / 1024.0);
    if (p.name.rfind("ckpt save", 0) == 0) min_save = std::min(min_save, ratio);
    if (p.name.rfind("ckpt load", 0) == 0) min_load = std::min(min_load, ratio);
    worst = std::max(worst, p.peak_rss_kib);
  }
  std::printf("\ncold reads: %s\n", g_cold_method.c_str());
  std::printf("load average: %s at start, %s at end\n", load_start.c_str(),
              ReadFirstLine("/proc/loadavg").c_str());
  std::printf("on disk: 1-rank save %.3f GB, 4-rank save %.3f GB (logical %.3f GB)\n",
              static_cast<double>(DirBytes(d1)) / kGB, static_cast<double>(DirBytes(d4)) / kGB,
              static_cast<double>(g_total) / kGB);
  std::printf("peak RSS over all phases %.0f MiB = workload %.0f MiB + %.0f MiB (target: + 256 MiB)\n",
              static_cast<double>(worst) / 1024.0, static_cast<double>(g_total) / kMiB,
              static_cast<double>(worst) / 1024.0 - static_cast<double>(g_total) / kMiB);
  std::printf("worst ratio to raw: save %.2fx (target >= 0.9x), load %.2fx (target >= 0.9x)\n", min_save,
              min_load);
  if (!keep) fs::remove_all(run);
  return 0;
}
