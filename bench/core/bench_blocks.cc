// bench_blocks: what the block size of format v2's blocked checksums (FORMAT.md §7) costs,
// for choosing storage::kDefaultBlockBytes.
//
//   ckpt-bench-blocks [--dir DIR] [--repeat K] [--drop-caches] [--slice]
//     writes one 256 MiB float32 tensor [16384, 4096] (rows of 16 KiB) as one contiguous
//     chunk of a shard in DIR (default: a fresh directory under /tmp, removed at the end),
//     then for each block size 4 KiB..16 MiB:
//       hash     block-mode hashing throughput of the 256 MiB in memory, against v1 (GB/s)
//       idx/GB   the chunk's shard-index record, scaled to 1 GB of data
//       row, third, col, whole   ShardReader::Read with verification of: 4 rows at an
//                unaligned row (64 KiB), a third of the rows (85 MiB, what one of 3 ranks
//                reads of a 4-rank row split), a third of the columns (all rows), the chunk
//       warm: best of K (default 5); cold: median of K, the file's pages evicted first
//                (POSIX_FADV_DONTNEED; with --drop-caches, as root, `echo 3 >
//                /proc/sys/vm/drop_caches` instead)
//     and the same reads unverified, plus a raw pread of the row slices' bytes, as the
//     baselines. Times in ms. --slice: only the row-slice target (issue 9): a third of the
//     rows, cold, verified with the default block size against a raw pread of the same bytes,
//     K interleaved pairs, medians and their ratio.
//
// Measured (2-core shared VM, load average ~13, memory-bound at ~4 GB/s for a hash or a
// memcpy of 256 MiB; every figure +-30 % from run to run), `ckpt-bench-blocks --repeat 7`:
//   block    hash GB/s  idx/GB   row warm  third warm  col warm  whole warm   row cold
//   4 KiB      5.0     3.7 MiB   0.008 ms    48 ms     172 ms     153 ms      4 ms
//   64 KiB     4.6     240 KiB   0.014       42        176        115        0.5
//   256 KiB    5.7      61 KiB   0.025       37        150        155         10
//   1 MiB      5.1      16 KiB   0.132       36        154        120         13
//   16 MiB     5.1       2 KiB   8.1         62        164        113         63
//   unverified: row 1.8 ms (a 16 MiB read-ahead window), third 25, col 175, whole 87;
//   raw pread: row 0.003 ms, third 26 ms.
// Hashing and large reads do not depend on the block size; the index and the extra read
// of small runs do, in opposite directions: storage::kDefaultBlockBytes = 64 KiB.
//
// Threading: single-threaded but for the reader's own helper thread. Never part of CTest.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "storage/digest.h"
#include "storage/fs.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

constexpr int64_t kRows = 16384, kCols = 4096;
constexpr uint64_t kBytes = uint64_t{kRows} * kCols * 4;

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

bool g_drop = false;

void Evict(const fs::path& file) {
  if (g_drop) {
    ::sync();
    std::ofstream("/proc/sys/vm/drop_caches") << "3\n";
    return;
  }
  const int fd = ::open(file.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Best warm time of fn, or the median of `repeat` cold ones, in ms.
double Time(const std::function<void()>& fn, int repeat, bool cold, const fs::path& file) {
  if (cold) {
    std::vector<double> t;
    for (int i = 0; i < repeat; ++i) {
      Evict(file);
      const auto t0 = std::chrono::steady_clock::now();
      fn();
      t.push_back(1e3 * Seconds(t0));
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  fn();  // warm the cache
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, 1e3 * Seconds(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir;
  int repeat = 5;
  bool slice_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else if (a == "--repeat" && i + 1 < argc) repeat = std::max(1, std::atoi(argv[++i]));
    else if (a == "--drop-caches") g_drop = true;
    else if (a == "--slice") slice_only = true;
    else {
      std::fprintf(stderr, "usage: ckpt-bench-blocks [--dir DIR] [--repeat K] [--drop-caches] [--slice]\n");
      return 2;
    }
  }
  if (g_drop && ::geteuid() != 0) {
    std::fprintf(stderr, "ckpt-bench-blocks: --drop-caches needs root\n");
    return 2;
  }
  const bool own_dir = dir.empty();
  if (own_dir) dir = fs::temp_directory_path() / ("ckpt-bench-blocks-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string name = "shard-00000-of-00001.h5";

  std::vector<float> data(static_cast<std::size_t>(kRows * kCols));
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i % 65521) * 0.25f;
  const Box full = Box::Full({kRows, kCols});
  ChunkMeta written;
  {
    storage::ShardWriter w(dir, name, {});
    written = w.WriteChunk("w", DType::kFloat32, {kRows, kCols}, full, data.data());
    w.Finish();
  }
  const fs::path file = dir / name;
  const Box row{{1001, 0}, {4, kCols}};
  const Box third{{kRows / 3 + 1, 0}, {kRows / 3, kCols}};
  const Box col{{0, kCols / 3}, {kRows, kCols / 3}};
  std::vector<float> out(data.size());

  // v1 hashing, the reference for block mode.
  auto hash = [&](uint64_t b) {
    storage::Digest d(DType::kFloat32, false, b);
    d.Update(data.data(), kBytes);
    return d.Checksum();
  };
  double v1_best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    hash(0);
    v1_best = std::min(v1_best, Seconds(t0));
  }
  const storage::Fd fd = storage::OpenRegularFile(file);
  auto pread_of = [&](const Box& b) {
    const uint64_t at = static_cast<uint64_t>(b.offsets[0]) * kCols * 4;
    storage::ReadExact(fd.get(), out.data(), static_cast<std::size_t>(b.NumElements()) * 4, *written.offset + at, file);
  };
  std::printf("256 MiB float32 [%lld, %lld], one contiguous chunk; v1 hashing %.1f GB/s; times in ms (warm: best of %d)\n",
              static_cast<long long>(kRows), static_cast<long long>(kCols), kBytes / v1_best / 1e9, repeat);
  if (slice_only) {
    // The row-slice target (issue 9): a third of the rows, cold, verified with the default
    // block size against a raw pread of the same bytes, the two interleaved round by round.
    ChunkMeta c = written;
    storage::ShardReader r(dir, name);
    std::vector<double> raw, verified;
    for (int i = 0; i < repeat; ++i) {
      for (const bool v : {i % 2 == 0, i % 2 != 0}) {
        Evict(file);
        const auto t0 = std::chrono::steady_clock::now();
        if (v) r.Read("w", DType::kFloat32, c, third, out.data(), third, true);
        else pread_of(third);
        (v ? verified : raw).push_back(1e3 * Seconds(t0));
      }
    }
    std::sort(raw.begin(), raw.end());
    std::sort(verified.begin(), verified.end());
    const double mr = raw[raw.size() / 2], mv = verified[verified.size() / 2];
    std::printf("third of the rows (%.0f MiB), cold, median of %d: verified %.1f ms, raw pread %.1f ms: %.2fx raw\n",
                static_cast<double>(third.NumElements()) * 4 / (1 << 20), repeat, mv, mr, mr / mv);
    if (own_dir) fs::remove_all(dir);
    return 0;
  }
  std::printf("baseline (unverified / raw pread):\n");
  for (const bool cold : {false, true}) {
    storage::ShardReader r(dir, name);
    ChunkMeta plain = written;
    plain.block_bytes = 0;  // read by the dataset's offset, unverified
    auto rd = [&](const Box& b) {
      return [&, b] { r.Read("w", DType::kFloat32, plain, b, out.data(), b, false); };
    };
    std::printf("  %-5s row %8.3f (pread %8.3f)  third %8.3f (pread %8.3f)  col %8.3f  whole %8.3f\n",
                cold ? "cold" : "warm", Time(rd(row), repeat, cold, file),
                Time([&] { pread_of(row); }, repeat, cold, file), Time(rd(third), repeat, cold, file),
                Time([&] { pread_of(third); }, repeat, cold, file), Time(rd(col), repeat, cold, file),
                Time(rd(full), repeat, cold, file));
  }
  std::printf("\n%9s %9s %9s | %8s %8s %8s %8s | %8s %8s %8s %8s\n", "block", "hash GB/s", "idx/GB", "row", "third",
              "col", "whole", "row", "third", "col", "whole");
  std::printf("%9s %9s %9s | %35s | %35s\n", "", "", "", "warm (verified)", "cold (verified)");
  for (uint64_t b = 4096; b <= (uint64_t{16} << 20); b *= 2) {
    double best = 1e30;
    for (int i = 0; i < repeat; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      hash(b);
      best = std::min(best, Seconds(t0));
    }
    // The chunk as a v2 reader sees it with blocks of b (same bytes, same place).
    ChunkMeta c = written;
    storage::Digest d(DType::kFloat32, false, b);
    d.Update(data.data(), kBytes);
    c.block_bytes = b;
    c.blocks = d.Blocks();
    c.checksum = d.Checksum();
    storage::ShardIndexBuilder ib;
    storage::ShardIndexEntry e;
    e.key = "w";
    e.dtype = DType::kFloat32;
    e.shape = {kRows, kCols};
    e.chunk = c;
    e.chunk.file.clear();
    ib.Add(e);
    const double idx_per_gb = static_cast<double>(ib.Finish().size()) * (1e9 / static_cast<double>(kBytes));
    char idx[32];
    if (idx_per_gb >= 1 << 20) std::snprintf(idx, sizeof idx, "%.1f MiB", idx_per_gb / (1 << 20));
    else std::snprintf(idx, sizeof idx, "%.0f KiB", idx_per_gb / 1024);
    double t[2][4];
    for (const bool cold : {false, true}) {
      storage::ShardReader r(dir, name);
      int k = 0;
      for (const Box* region : {&row, &third, &col, &full}) {
        t[cold][k++] = Time([&] { r.Read("w", DType::kFloat32, c, *region, out.data(), *region, true); }, repeat,
                            cold, file);
      }
    }
    char label[16];
    if (b >= 1 << 20) std::snprintf(label, sizeof label, "%llu MiB", static_cast<unsigned long long>(b >> 20));
    else std::snprintf(label, sizeof label, "%llu KiB", static_cast<unsigned long long>(b >> 10));
    std::printf("%9s %9.1f %9s | %8.3f %8.3f %8.3f %8.3f | %8.3f %8.3f %8.3f %8.3f\n", label, kBytes / best / 1e9, idx,
                t[0][0], t[0][1], t[0][2], t[0][3], t[1][0], t[1][1], t[1][2], t[1][3]);
    std::fflush(stdout);
  }
  if (own_dir) fs::remove_all(dir);
  return 0;
}
