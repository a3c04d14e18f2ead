// bench/tools/gen.cc: makes the checkpoints the tools benchmark runs on.
//   ckpt-bench-tools-gen gpt2s DIR [--world 4]   GPT-2 small + Adam state (the shapes of
//       shared/bench/workloads.py gpt2s: 592 tensors, 1,493,278,880 bytes), saved by
//       `world` thread ranks, every tensor split along dim 0 as FSDP would
//   ckpt-bench-tools-gen many DIR [--keys 100000] one file of that many 4-element tensors
//   ckpt-bench-tools-gen chunks DIR [--chunks 131072] [--chunk-bytes 16]  1,000 keys of
//       row chunks (16 bytes: 4 floats, by default) in 16 files, each key in one file: a
//       checkpoint of many chunks and little data, for the time and memory of ckpt-verify
//       --quick per chunk (bench/tools/bench.py --chunks). --chunk-bytes (a multiple of 4)
//       over 64 KiB makes chunks too big to be packed together.
// Values are deterministic pseudo-random floats (incompressible, like trained weights).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/ckpt.h"
#include "common/gpt2s.h"

namespace {

using Param = std::pair<std::string, ckpt::Shape>;
using ckpt_bench::Gpt2sParams;

void Fill(std::vector<float>& v, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    x = (static_cast<float>(s >> 40) / 16777216.0f - 0.5f) * 0.04f;
  }
}

uint64_t Hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  return h;
}

int Gpt2s(const std::string& dir, int world) {
  std::vector<Param> tensors;
  for (const auto& [name, shape] : Gpt2sParams()) tensors.emplace_back(name, shape);
  for (const auto& [name, shape] : Gpt2sParams()) {
    const std::string st = "optimizer.state." + name + ".";
    tensors.emplace_back(st + "step", ckpt::Shape{});
    tensors.emplace_back(st + "exp_avg", shape);
    tensors.emplace_back(st + "exp_avg_sq", shape);
  }
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    std::vector<std::vector<float>> data;
    std::vector<int64_t> steps(tensors.size(), 1000);
    data.reserve(tensors.size());
    ckpt::StateDict sd;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const auto& [name, shape] = tensors[i];
      if (shape.empty()) {
        data.emplace_back();
        sd.Add(name, ckpt::Tensor::Full(ckpt::DType::kInt64, shape, &steps[i]));
        continue;
      }
      const int64_t n = shape[0], base = n / world, extra = n % world, r = comm.rank();
      const int64_t begin = r * base + std::min(r, extra), rows = base + (r < extra ? 1 : 0);
      int64_t row = 1;
      for (std::size_t d = 1; d < shape.size(); ++d) row *= shape[d];
      data.emplace_back(static_cast<std::size_t>(rows * row));
      Fill(data.back(), Hash(name) + static_cast<uint64_t>(r));
      sd.Add(name, ckpt::Tensor::Slice(ckpt::DType::kFloat32, shape, 0, begin, rows, data.back().data()));
    }
    ckpt::SaveOptions o;
    o.overwrite = true;
    ckpt::Save(dir, sd, comm, o);
  });
  return 0;
}

int Many(const std::string& dir, int keys) {
  ckpt::CheckpointWriter::Options o;
  o.overwrite = true;
  auto w = ckpt::CheckpointWriter::Create(dir, o);
  std::vector<float> v(4);
  char name[32];
  for (int i = 0; i < keys; ++i) {
    Fill(v, static_cast<uint64_t>(i));
    std::snprintf(name, sizeof name, "small.%06d", i);
    w->WriteChunk(name, ckpt::DType::kFloat32, {4}, ckpt::Box::Full({4}), v.data());
  }
  w->Commit();
  return 0;
}

int Chunks(const std::string& dir, int64_t chunks, int64_t chunk_bytes) {
  constexpr int kKeys = 1000, kFiles = 16;
  const int64_t rows = std::max<int64_t>(1, chunks / kKeys);
  const int64_t cols = std::max<int64_t>(1, chunk_bytes / 4);
  ckpt::CheckpointWriter::Options o;
  o.overwrite = true;
  o.num_files = kFiles;
  o.world_size = kFiles;
  o.state_dict_type = ckpt::StateDictType::kSharded;
  auto w = ckpt::CheckpointWriter::Create(dir, o);
  std::vector<float> v(static_cast<std::size_t>(cols));
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = "layers." + std::to_string(k) + ".weight";
    for (int64_t r = 0; r < rows; ++r) {
      Fill(v, static_cast<uint64_t>(k * rows + r));
      w->WriteChunk(key, ckpt::DType::kFloat32, {rows, cols}, ckpt::Box{{r, 0}, {1, cols}}, v.data(), k % kFiles);
    }
  }
  w->Commit();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s gpt2s DIR [--world N] | many DIR [--keys N] | chunks DIR [--chunks N] [--chunk-bytes B]\n",
                 argv[0]);
    return 2;
  }
  const std::string what = argv[1], dir = argv[2];
  int64_t n = what == "gpt2s" ? 4 : what == "chunks" ? 131072 : 100000;
  if (argc >= 5) n = std::atoll(argv[4]);
  int64_t chunk_bytes = 16;
  if (argc >= 7 && std::strcmp(argv[5], "--chunk-bytes") == 0) chunk_bytes = std::atoll(argv[6]);
  try {
    if (what == "chunks") return Chunks(dir, n, chunk_bytes);
    return what == "gpt2s" ? Gpt2s(dir, static_cast<int>(n)) : Many(dir, static_cast<int>(n));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
