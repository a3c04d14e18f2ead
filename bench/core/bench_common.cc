// bench/core/bench_common.cc: the workloads, raw baselines, clocks and records that
// ckpt-bench-core and ckpt-bench-mpi share (bench_common.h).
#include "bench_common.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <xxhash.h>

#include "common/gpt2s.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

namespace ckpt_bench {

uint64_t XorShift(uint64_t& x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}

namespace {

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
  for (std::size_t i = 0; i < n; ++i)
    f[i] = (static_cast<float>(XorShift(x) >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.04f;
}

void WriteAll(int fd, const uint8_t* p, std::size_t n, const fs::path& path) {
  while (n > 0) {
    const ssize_t k = ::write(fd, p, std::min(kRawBlock, n));
    if (k < 0) {
      if (errno == EINTR) continue;
      Die("write " + path.string());
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

// After a readv/writev of `k` bytes from iov[i..]: i past the entries done, the next one
// shortened by what of it was done.
void Advance(std::vector<iovec>& iov, std::size_t& i, std::size_t k) {
  while (i < iov.size() && k >= iov[i].iov_len) k -= iov[i++].iov_len;
  if (k > 0) {
    iov[i].iov_base = static_cast<uint8_t*>(iov[i].iov_base) + k;
    iov[i].iov_len -= k;
  }
}

std::string g_cold_method;

}  // namespace

TensorBuf MakeTensor(std::string name, ckpt::DType dtype, ckpt::Shape shape, uint64_t seed) {
  TensorBuf t{std::move(name), dtype, std::move(shape), 0, nullptr, 0};
  t.bytes = static_cast<std::size_t>(ckpt::NumElements(t.shape)) * ckpt::DTypeSize(dtype);
  t.data.reset(new uint8_t[t.bytes]);
  Fill(t, seed);
  t.hash = XXH3_64bits(t.data.get(), t.bytes);
  return t;
}

void Add(Workload& w, std::string name, ckpt::DType dtype, ckpt::Shape shape) {
  w.push_back(MakeTensor(std::move(name), dtype, std::move(shape), w.size() + 1));
}

std::vector<TensorSpec> Gpt2sSpecs() {
  std::vector<TensorSpec> specs;
  const auto params = Gpt2sParams();
  for (const auto& [name, shape] : params) specs.push_back({name, ckpt::DType::kFloat32, shape});
  for (const auto& [name, shape] : params) {  // torch.optim.Adam state order
    const std::string st = "optimizer.state." + name + ".";
    specs.push_back({st + "step", ckpt::DType::kInt64, {}});
    specs.push_back({st + "exp_avg", ckpt::DType::kFloat32, shape});
    specs.push_back({st + "exp_avg_sq", ckpt::DType::kFloat32, shape});
  }
  return specs;
}

Workload MakeGpt2s() {
  Workload w;
  for (auto& spec : Gpt2sSpecs()) Add(w, std::move(spec.name), spec.dtype, std::move(spec.shape));
  return w;
}

std::pair<int64_t, int64_t> RowRange(int64_t n, int world, int rank) {
  const int64_t base = n / world, extra = n % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, base + (rank < extra ? 1 : 0)};
}

std::pair<const uint8_t*, std::size_t> ShardBytes(const TensorBuf& t, int world, int rank) {
  if (t.shape.empty()) return {t.data.get(), rank == 0 ? t.bytes : 0};
  auto [begin, count] = RowRange(t.shape[0], world, rank);
  const std::size_t row = t.bytes / static_cast<std::size_t>(t.shape[0]);
  return {t.data.get() + static_cast<std::size_t>(begin) * row, static_cast<std::size_t>(count) * row};
}

TensorBuf RowShard(const TensorBuf& t, int world, int rank) {
  ckpt::Shape shape = t.shape;
  const auto [p, n] = shape.empty() ? std::pair{t.data.get(), t.bytes} : ShardBytes(t, world, rank);
  if (!shape.empty()) shape[0] = RowRange(t.shape[0], world, rank).second;
  TensorBuf s{t.name, t.dtype, std::move(shape), n, std::make_unique<uint8_t[]>(n), 0};
  std::memcpy(s.data.get(), p, n);
  s.hash = XXH3_64bits(s.data.get(), s.bytes);
  return s;
}

ckpt::StateDict View(Workload& w, int world, int rank) {
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

uint64_t TotalBytes(const Workload& w) {
  uint64_t n = 0;
  for (const auto& t : w) n += t.bytes;
  return n;
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string ReadFirstLine(const std::string& path, const std::string& prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (prefix.empty() || line.rfind(prefix, 0) == 0) return line;
  return "";
}

double Load1() {
  const std::string l = ReadFirstLine("/proc/loadavg");
  return l.empty() ? -1 : std::atof(l.c_str());
}

int64_t VmHWMKiB() {
  std::string line = ReadFirstLine("/proc/self/status", "VmHWM:");
  return line.empty() ? -1 : std::stoll(line.substr(6));
}

void ResetPeakRss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what.c_str(), std::strerror(errno));
  std::exit(2);
}

void FsyncPath(const fs::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags | O_CLOEXEC);
  if (fd < 0) Die("open " + p.string());
  if (::fsync(fd) != 0) Die("fsync " + p.string());
  ::close(fd);
}

void MakeCold(const fs::path& dir) {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  if (f && (f << "3").flush()) {
    g_cold_method = "sync; echo 3 > /proc/sys/vm/drop_caches before every phase";
  } else {
    g_cold_method = "posix_fadvise(DONTNEED) on the bench files (drop_caches not permitted: not root); "
                    "writes may meet a full page cache";
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file()) continue;
      const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
      ::close(fd);
    }
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
}

const std::string& ColdMethod() { return g_cold_method; }

void ZeroAll(Workload& w) {
  for (auto& t : w) std::memset(t.data.get(), 0, t.bytes);
}

std::string FirstMismatch(const Workload& w) {
  for (const auto& t : w)
    if (XXH3_64bits(t.data.get(), t.bytes) != t.hash) return t.name;
  return "";
}

void VerifyAll(const Workload& w, const std::string& what) {
  const std::string bad = FirstMismatch(w);
  if (bad.empty()) return;
  std::fprintf(stderr, "%s: %s: tensor %s differs from what was saved\n", program_invocation_short_name,
               what.c_str(), bad.c_str());
  std::exit(1);
}

// ---- raw

void RawWriteFile(const Workload& w, const fs::path& path, bool writeback, int world, int rank) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) Die("open " + path.string());
  std::size_t written = 0, flushed = 0;
  std::vector<iovec> iov;
  std::size_t pending = 0;
  auto flush_iov = [&] {
    std::size_t i = 0;
    while (i < iov.size()) {
      const ssize_t k = ::writev(fd, iov.data() + i, static_cast<int>(std::min<std::size_t>(iov.size() - i, IOV_MAX)));
      if (k < 0) {
        if (errno == EINTR) continue;
        Die("writev " + path.string());
      }
      Advance(iov, i, static_cast<std::size_t>(k));
    }
    iov.clear();
    written += pending;
    pending = 0;
  };
  auto maybe_writeback = [&] {
    if (writeback && written - flushed >= kWritebackEvery) {
      ::sync_file_range(fd, static_cast<off_t>(flushed), static_cast<off_t>(written - flushed),
                        SYNC_FILE_RANGE_WRITE);
      flushed = written;
    }
  };
  for (const auto& t : w) {
    auto [p, n] = ShardBytes(t, world, rank);
    if (n >= kRawBlock) {
      flush_iov();
      for (std::size_t done = 0; done < n; done += kRawBlock) {
        const std::size_t len = std::min(kRawBlock, n - done);
        WriteAll(fd, p + done, len, path);
        written += len;
        maybe_writeback();
      }
      continue;
    }
    iov.push_back({const_cast<uint8_t*>(p), n});
    pending += n;
    if (pending >= kRawBlock || iov.size() >= IOV_MAX) {
      flush_iov();
      maybe_writeback();
    }
  }
  flush_iov();
  if (::fsync(fd) != 0) Die("fsync " + path.string());
  ::close(fd);
}

void RawReadFile(Workload& w, const fs::path& path, int world, int rank) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + path.string());
  std::vector<iovec> iov;
  std::size_t pending = 0;
  auto flush_iov = [&] {
    std::size_t i = 0;
    while (i < iov.size()) {
      const ssize_t k = ::readv(fd, iov.data() + i, static_cast<int>(std::min<std::size_t>(iov.size() - i, IOV_MAX)));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) Die("read " + path.string());
      Advance(iov, i, static_cast<std::size_t>(k));
    }
    iov.clear();
    pending = 0;
  };
  for (auto& t : w) {
    auto [cp, n] = ShardBytes(t, world, rank);
    uint8_t* p = const_cast<uint8_t*>(cp);
    if (n >= kRawBlock) {
      flush_iov();
      for (std::size_t done = 0; done < n;) {
        const ssize_t k = ::read(fd, p + done, std::min(kRawBlock, n - done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) Die("read " + path.string());
        done += static_cast<std::size_t>(k);
      }
      continue;
    }
    iov.push_back({p, n});
    pending += n;
    if (pending >= kRawBlock || iov.size() >= IOV_MAX) flush_iov();
  }
  flush_iov();
  ::close(fd);
}

void RawReadFileParallel(Workload& w, const fs::path& path, int world, int rank, int streams) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("open " + path.string());
  struct Piece {
    uint8_t* to;
    std::size_t n;
    off_t at;
  };
  std::vector<Piece> pieces;
  off_t at = 0;
  for (auto& t : w) {
    auto [cp, n] = ShardBytes(t, world, rank);
    for (std::size_t done = 0; done < n; done += kRawBlock) {
      const std::size_t k = std::min(kRawBlock, n - done);
      pieces.push_back({const_cast<uint8_t*>(cp) + done, k, at + static_cast<off_t>(done)});
    }
    at += static_cast<off_t>(n);
  }
  std::atomic<std::size_t> next{0};
  auto read = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      const Piece& q = pieces[i];
      for (std::size_t done = 0; done < q.n;) {
        const ssize_t k = ::pread(fd, q.to + done, q.n - done, q.at + static_cast<off_t>(done));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) Die("read " + path.string());
        done += static_cast<std::size_t>(k);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int s = 1; s < streams; ++s) threads.emplace_back(read);
  read();
  for (auto& t : threads) t.join();
  ::close(fd);
}

void RawReadFileDirect(Workload& w, const fs::path& path, int world, int rank, int streams) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0) Die("open O_DIRECT " + path.string());
  struct Span {
    std::size_t at;  // in the file
    uint8_t* to;
    std::size_t n;
  };
  std::vector<Span> spans;  // the tensors' bytes, in file order
  std::size_t size = 0;
  for (auto& t : w) {
    auto [cp, n] = ShardBytes(t, world, rank);
    if (n) spans.push_back({size, const_cast<uint8_t*>(cp), n});
    size += n;
  }
  constexpr std::size_t kAlign = 4096;
  std::atomic<std::size_t> next{0};
  auto read = [&] {
    std::unique_ptr<uint8_t, decltype(&std::free)> scratch(static_cast<uint8_t*>(std::aligned_alloc(kAlign, kRawBlock)),
                                                           &std::free);
    for (std::size_t i; (i = next.fetch_add(1)) * kRawBlock < size;) {
      const std::size_t at = i * kRawBlock, want = std::min(kRawBlock, size - at);
      std::size_t got = 0;
      while (got < want) {  // the last piece ends at the end of the file, mid-unit: a short read
        const ssize_t k = ::pread(fd, scratch.get() + got, kRawBlock - got, static_cast<off_t>(at + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) Die("read O_DIRECT " + path.string());
        got += static_cast<std::size_t>(k);
      }
      auto it = std::upper_bound(spans.begin(), spans.end(), at, [](std::size_t a, const Span& s) { return a < s.at; });
      for (--it; it != spans.end() && it->at < at + want; ++it) {
        const std::size_t lo = std::max(at, it->at), hi = std::min(at + want, it->at + it->n);
        std::memcpy(it->to + (lo - it->at), scratch.get() + (lo - at), hi - lo);
      }
    }
  };
  std::vector<std::thread> threads;
  for (int s = 1; s < streams; ++s) threads.emplace_back(read);
  read();
  for (auto& t : threads) t.join();
  ::close(fd);
}

bool ParseRunArg(int argc, char** argv, int& i, RunArgs& args, void (*usage)(const char* argv0)) {
  const std::string a = argv[i];
  if (a == "--keep") {
    args.keep = true;
    return true;
  }
  if (a != "--dir" && a != "--rounds" && a != "--round-index" && a != "--json") return false;
  if (i + 1 >= argc) usage(argv[0]);
  const char* v = argv[++i];
  if (a == "--dir") args.dir = v;
  else if (a == "--rounds") args.rounds = std::max(1, std::atoi(v));
  else if (a == "--round-index") args.round = std::atoi(v);
  else args.json = v;
  return true;
}

std::string JsonEscape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

void Record(std::FILE* json, const PhaseRecord& r) {
  std::printf("  %-12s %-26s %-5s %7.3f s  %6.2f GB/s  cpu %6.3f s  load %.2f\n", r.table.c_str(), r.method.c_str(),
              r.op.c_str(), r.wall, static_cast<double>(r.bytes) / r.wall / kGB, r.cpu, r.load);
  std::fflush(stdout);
  if (!json) return;
  std::fprintf(json,
               "{\"source\": \"%s\", \"table\": \"%s\", \"method\": \"%s\", \"op\": \"%s\", \"round\": %d, "
               "\"wall\": %.6f, \"cpu\": %.6f, \"load\": %.2f, \"rss_mib\": %.1f, \"bytes\": %llu, \"commit\": \"%s\", "
               "\"host_mib\": %.0f}\n",
               JsonEscape(r.source).c_str(), JsonEscape(r.table).c_str(), JsonEscape(r.method).c_str(),
               JsonEscape(r.op).c_str(), r.round, r.wall, r.cpu, r.load, r.rss_mib,
               static_cast<unsigned long long>(r.bytes), JsonEscape(r.commit).c_str(), r.host_mib);
  std::fflush(json);
}

long long HostReportedKiB() {
  std::ifstream f("/sys/module/page_reporting/parameters/reported_kib");
  long long kib = -1;
  if (!(f >> kib)) return -1;
  return kib;
}

namespace {

// GB/s of writing one byte per page of `n` fresh anonymous bytes (the page faults, zeroing
// and whatever the hypervisor does for a page it took back).
double TouchRate(std::size_t n) {
  void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 0;
  auto* p = static_cast<volatile char*>(m);
  const double t0 = Now();
  for (std::size_t i = 0; i < n; i += 4096) p[i] = 1;
  const double t = Now() - t0;
  ::munmap(m, n);
  return static_cast<double>(n) / t / kGB;
}

// Whether the host takes back this guest's free memory, and what a page costs then. On a VM
// with free page reporting (Firecracker's balloon, for one), the kernel hands freed pages to
// the host, and the next use of a page the host has taken faults in the host. On the 2-core
// VM of docs/benchmarks.md, touching 6 GiB of memory free for a while ran at 0.72-0.88 GB/s, and
// at 3.0-3.8 GB/s when touched again at once: a cold phase whose page cache needs more
// pages than the phase before it freed pays those faults, in its copies into the cache.
// The probe touches 4 GiB (1 GiB where less is available), frees it, and touches it again.
std::string MemoryFacts() {
  const long long kib = HostReportedKiB();
  if (kib < 0) return "no free page reporting (the host does not take back free memory)";
  std::size_t probe = std::size_t{4} << 30;
  const std::string avail = ReadFirstLine("/proc/meminfo", "MemAvailable:");
  if (!avail.empty() && std::stod(avail.substr(13)) * 1024 < 3.0 * static_cast<double>(probe)) probe = std::size_t{1} << 30;
  const double first = TouchRate(probe), again = TouchRate(probe);
  char s[400];
  std::snprintf(s, sizeof s,
                "free page reporting on: the host takes back freed memory (%.0f GiB since boot); touching %zu GiB "
                "of free memory: %.2f GB/s, again at once: %.2f GB/s",
                static_cast<double>(kib) / (1024.0 * 1024.0), probe >> 30, first, again);
  return s;
}

}  // namespace

void PrintMachine(const fs::path& dir, std::FILE* json, const std::string& source, const std::string& commit,
                  int round) {
  std::string cpu = ReadFirstLine("/proc/cpuinfo", "model name");
  if (auto p = cpu.find(':'); p != std::string::npos) cpu = cpu.substr(p + 2);
  std::string mem = ReadFirstLine("/proc/meminfo", "MemTotal:");
  double mem_gib = 0;
  if (!mem.empty()) mem_gib = std::stod(mem.substr(9)) / kMiB;
  struct utsname u {};
  ::uname(&u);
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
    std::string r = ReadFirstLine("/sys/class/block/" + best_src.substr(5) + "/queue/rotational");
    if (!r.empty()) rotational = r == "1" ? ", rotational" : ", non-rotational";
  }
  std::printf("machine: %s, %u cores, %.1f GiB RAM, kernel %s %s\n", cpu.c_str(),
              std::thread::hardware_concurrency(), mem_gib, u.sysname, u.release);
  std::printf("disk:    %s (%s%s) mounted at %s, %.0f GiB free; bench dir %s\n", best_src.c_str(),
              best_type.c_str(), rotational.c_str(), best_mnt.c_str(),
              static_cast<double>(sv.f_bavail) * static_cast<double>(sv.f_frsize) / (kMiB * 1024.0),
              abs.c_str());
  const std::string memory = MemoryFacts();
  std::printf("memory:  %s\n", memory.c_str());
  if (json) {
    std::fprintf(json,
                 "{\"source\": \"%s\", \"machine\": \"%s, %u cores, %.1f GiB RAM, %s %s\", \"disk\": \"%s (%s%s) "
                 "at %s\", \"memory\": \"%s\", \"commit\": \"%s\", \"round\": %d}\n",
                 JsonEscape(source).c_str(), JsonEscape(cpu).c_str(), std::thread::hardware_concurrency(), mem_gib, u.sysname, u.release,
                 best_src.c_str(), best_type.c_str(), rotational.c_str(), best_mnt.c_str(),
                 JsonEscape(memory).c_str(), JsonEscape(commit).c_str(), round);
    std::fflush(json);
  }
}

}  // namespace ckpt_bench
