// bench/core/bench_common.h: what ckpt-bench-core (threads) and ckpt-bench-mpi (processes)
// share, so both measure the same bytes the same way: the generated workloads and their dim-0
// shards, the raw write(2)/read(2) baselines, the cold page cache, the clocks and the phase
// records (one printed line and one JSON line each, which bench/report.py reads).
//
// Threading: the raw file functions may run on several threads at once (each on its own
// file); MakeCold, the records and the globals behind them belong to one thread.
#pragma once

#include <ckpt/ckpt.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ckpt_bench {

namespace fs = std::filesystem;

inline constexpr double kGB = 1e9;
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr std::size_t kRawBlock = std::size_t{8} << 20;       // write/read call size
inline constexpr std::size_t kWritebackEvery = std::size_t{64} << 20;  // raw-c-wb's sync_file_range step

struct TensorBuf {
  std::string name;
  ckpt::DType dtype;
  ckpt::Shape shape;
  std::size_t bytes = 0;
  std::unique_ptr<uint8_t[]> data;
  uint64_t hash = 0;  // of the generated contents
};
using Workload = std::vector<TensorBuf>;

uint64_t XorShift(uint64_t& x);

// A tensor filled with the deterministic, hard-to-compress contents of seed `seed` (small
// float32 values from a xorshift stream; an int64 tensor holds the step 1000).
TensorBuf MakeTensor(std::string name, ckpt::DType dtype, ckpt::Shape shape, uint64_t seed);
// Appends MakeTensor(...) with seed w.size() + 1.
void Add(Workload& w, std::string name, ckpt::DType dtype, ckpt::Shape shape);

// The gpt2s workload: GPT-2 small's parameters then their Adam state (step, exp_avg,
// exp_avg_sq), 592 tensors, ~1.49 GB.
struct TensorSpec {
  std::string name;
  ckpt::DType dtype;
  ckpt::Shape shape;
};
std::vector<TensorSpec> Gpt2sSpecs();
Workload MakeGpt2s();

// Bytes of rank `rank`'s dim-0 shard of `t` (0-D tensors: rank 0 holds them).
std::pair<const uint8_t*, std::size_t> ShardBytes(const TensorBuf& t, int world, int rank);
// Rank `rank`'s dim-0 shard of `t` as a tensor of its own: its rows only (shape[0] = their
// count), its own hash; a 0-D tensor whole.
TensorBuf RowShard(const TensorBuf& t, int world, int rank);
uint64_t TotalBytes(const Workload& w);
// Rank `rank`'s view of `w` as a state dict over its buffers: FSDP-like dim-0 shards (ckpt::BalancedSplit),
// 0-D tensors replicated; world 1 holds every tensor whole.
ckpt::StateDict View(Workload& w, int world, int rank);

double Now();
double CpuSeconds();  // user + sys of this process, every thread
std::string ReadFirstLine(const std::string& path, const std::string& prefix = "");
double Load1();       // the 1-minute load average
int64_t VmHWMKiB();   // peak RSS since the last ResetPeakRss
void ResetPeakRss();

// Prints "<program>: what: strerror(errno)" and exits 2.
[[noreturn]] void Die(const std::string& what);
void FsyncPath(const fs::path& p, int flags);

// Empties the page cache (drop_caches when allowed, else fadvise on the files under `dir`),
// then pauses a second so the journal and writeback of what came before are done.
void MakeCold(const fs::path& dir);
// How the last MakeCold emptied the cache, in words.
const std::string& ColdMethod();

void ZeroAll(Workload& w);
// The name of the first tensor whose contents differ from what was generated; "" if none.
std::string FirstMismatch(const Workload& w);
// Exits 1 with a message naming `what` and the tensor if any tensor differs.
void VerifyAll(const Workload& w, const std::string& what);

// Writes rank `rank`'s shard bytes of every tensor to `path` in 8 MiB calls, then fsync; with
// `writeback`, starts write-back of each 64 MiB written. Many small tensors are gathered
// into writev calls of up to 8 MiB (one write per tensor would measure syscalls, not the disk).
void RawWriteFile(const Workload& w, const fs::path& path, bool writeback, int world, int rank);
// Reads what RawWriteFile wrote back into the same shard bytes.
void RawReadFile(Workload& w, const fs::path& path, int world, int rank);
// The same bytes read by `streams` threads at once, each pread(2)ing the next 8 MiB piece
// (in file order) into its buffer: a read is in flight while another's bytes are copied
// out, as ckpt's reader keeps one in flight while it hashes.
void RawReadFileParallel(Workload& w, const fs::path& path, int world, int rank, int streams);
// A raw read of the same file with O_DIRECT (no page cache): `streams` threads read 8 MiB
// pieces into aligned buffers and copy them into the tensors (theirs are not aligned).
void RawReadFileDirect(Workload& w, const fs::path& path, int world, int rank, int streams);

// The options both benchmarks take: --dir DIR, --rounds N, --round-index I (the first
// round's number in the records), --json FILE (append records to it), --keep (leave the files).
struct RunArgs {
  fs::path dir;
  std::string json;
  int rounds = 1, round = 0;
  bool keep = false;
};
// Takes argv[i] (and its value: i moves past it) if it is one of RunArgs' options; false for
// any other. An option missing its value calls `usage`, which must not return.
bool ParseRunArg(int argc, char** argv, int& i, RunArgs& args, void (*usage)(const char* argv0));

std::string JsonEscape(const std::string& s);

// One measured phase: printed as a line and, when `json` is open, appended as a JSON line.
struct PhaseRecord {
  std::string source;  // "bench_core", "bench_mpi"
  std::string table, method, op;
  int round = 0;
  double wall = 0, cpu = 0, load = 0, rss_mib = -1;
  uint64_t bytes = 0;
  std::string commit;
  // MiB of free memory this guest handed back to its host (free page reporting) from the
  // phase's cache drop to its end; -1 where the kernel does not report.
  double host_mib = -1;
};
void Record(std::FILE* json, const PhaseRecord& r);

// KiB of free memory the kernel has reported to its hypervisor since boot (virtio-balloon
// free page reporting, which lets the host take the pages back); -1 where it does not.
long long HostReportedKiB();

// Prints the machine and the bench dir's disk; with `json`, a JSON line of them too.
void PrintMachine(const fs::path& dir, std::FILE* json, const std::string& source, const std::string& commit,
                  int round);

}  // namespace ckpt_bench
