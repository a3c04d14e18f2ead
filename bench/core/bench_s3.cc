// ckpt-bench-s3: ckpt's side of the object-storage benchmark (issue 30 §5), one phase per
// process so that its CPU and memory are its own. bench/s3.sh runs it with the gateway
// started and the AWS_* variables set, between the boto3 and DCP phases of bench/s3/s3bench.py.
//
//   ckpt-bench-s3 save URL --ranks N [--part-mib P] [--concurrency C] [--max-gb G]
//   ckpt-bench-s3 load URL --ranks M [--max-gb G]
//
// save: the gpt2s workload (bench/common/gpt2s.h, 592 tensors, 1.49 GB; --max-gb keeps the
// first tensors up to G GB) as dim-0 shards of N ranks (threads, ThreadComm) to URL.
// load: the same tensors, zeroed, loaded by M ranks (M may differ from the N of the save: a
// reshard), then checked against what was generated (untimed). Prints one JSON line: op,
// ranks, wall s, cpu s (user + sys, every thread), peak RSS MiB, bytes (the tensors' bytes).
#include <ckpt/ckpt.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"

using namespace ckpt_bench;

namespace {

[[noreturn]] void Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s save|load s3://bucket/prefix --ranks N [--part-mib P] [--concurrency C] [--max-gb G]\n",
               argv0);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) Usage(argv[0]);
  const std::string op = argv[1], url = argv[2];
  int ranks = 1;
  uint64_t part_mib = ckpt::ObjectStoreOptions{}.part_bytes >> 20;
  int concurrency = ckpt::ObjectStoreOptions{}.upload_concurrency;
  double max_gb = 0;
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) Usage(argv[0]);
    if (a == "--ranks") {
      ranks = std::atoi(argv[++i]);
    } else if (a == "--part-mib") {
      part_mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--concurrency") {
      concurrency = std::atoi(argv[++i]);
    } else if (a == "--max-gb") {
      max_gb = std::atof(argv[++i]);
    } else {
      Usage(argv[0]);
    }
  }
  if ((op != "save" && op != "load") || ranks < 1) Usage(argv[0]);

  Workload w = MakeGpt2s();
  if (max_gb > 0) {  // the first tensors up to max_gb
    uint64_t total = 0;
    std::size_t keep = 0;
    while (keep < w.size() && total + w[keep].bytes <= static_cast<uint64_t>(max_gb * kGB)) total += w[keep++].bytes;
    w.resize(keep);
  }
  std::vector<ckpt::StateDict> views;
  for (int r = 0; r < ranks; ++r) views.push_back(View(w, ranks, r));
  ckpt::ObjectStoreOptions s3;
  s3.part_bytes = part_mib << 20;
  s3.upload_concurrency = concurrency;
  if (op == "load") ZeroAll(w);

  ResetPeakRss();
  const double cpu0 = CpuSeconds(), t0 = Now();
  if (op == "save") {
    ckpt::SaveOptions options;
    options.s3 = s3;
    ckpt::RunThreads(ranks, [&](ckpt::Comm& comm) {
      ckpt::Save(url, views[static_cast<std::size_t>(comm.rank())], comm, options);
    });
  } else {
    ckpt::LoadOptions options;
    options.s3 = s3;
    ckpt::RunThreads(ranks, [&](ckpt::Comm& comm) {
      ckpt::Load(url, views[static_cast<std::size_t>(comm.rank())], comm, options);
    });
  }
  const double wall = Now() - t0, cpu = CpuSeconds() - cpu0;
  const int64_t rss = VmHWMKiB();
  if (op == "load") VerifyAll(w, "ckpt load from " + url);
  std::printf("{\"op\": \"%s\", \"ranks\": %d, \"wall\": %.4f, \"cpu\": %.4f, \"rss_mib\": %.1f, \"bytes\": %llu, "
              "\"tensors\": %zu}\n",
              op.c_str(), ranks, wall, cpu, static_cast<double>(rss) / 1024.0,
              static_cast<unsigned long long>(TotalBytes(w)), w.size());
  return 0;
}
