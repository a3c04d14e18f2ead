// tests/fault/flip_driver.cc: the sample checkpoints of the flip sweep and the fault repros
// (flip_sweep.py, repros.py), and a strict resharded Load of them that prints what it loaded.
//
//   ckpt-flip-driver write KIND DIR
//       Saves checkpoint KIND from its own number of in-process ranks (ThreadComm):
//         fsdp2, fsdp4   tensors split along dim 0 (the FSDP / torch.chunk rule), 2 or 4 ranks
//         tp2x2          4 ranks as a 2x2 mesh: matrices split by rows (dp) and columns (tp)
//         zstd           as fsdp2, zstd-compressed, with compressible values
//         misc           2 ranks: scalars, JSON, bytes, and 600 small tensors (a shard index
//                        over 64 KiB, stored by HDF5 as a dense attribute)
//   ckpt-flip-driver load KIND DIR WORLD rows|cols
//       Loads every entry KIND wrote (strict, default LoadOptions) into WORLD ranks, each
//       rank holding its part of each tensor split along dim 0 (rows) or the last dim (cols),
//       and prints one line per entry and rank: "key rank hash" (FNV-1a of the bytes loaded;
//       the value itself for scalars and JSON), sorted. Exit 0: loaded; 1: a ckpt::Error,
//       printed as "error: ..." on stderr; 2: usage.
//
// Only the public API (ckpt/checkpoint.h), so the same source builds against any libckpt.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/comm.h"
#include "ckpt/error.h"
#include "ckpt/tensor.h"

namespace {

uint64_t Fnv(const void* data, std::size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct TensorSpec {
  std::string key;
  ckpt::DType dtype;
  ckpt::Shape shape;
};

struct Sample {
  int world = 2;
  bool tp = false;  // 2x2 mesh: rank = dp * 2 + tp
  bool zstd = false;
  bool misc = false;
  std::vector<TensorSpec> tensors;
};

bool MakeSample(const std::string& kind, Sample& s) {
  using ckpt::DType;
  s.tensors = {{"model.embed", DType::kFloat32, {64, 48}},
               {"model.layers.0.w", DType::kFloat32, {96, 40}},
               {"model.layers.0.b", DType::kBFloat16, {30}},
               {"model.layers.1.w", DType::kFloat16, {50, 24}},
               {"model.norm", DType::kFloat32, {7}},
               {"optimizer.state.model.layers.0.w.exp_avg", DType::kFloat32, {96, 40}},
               {"optimizer.state.model.embed.step", DType::kInt64, {5}}};
  if (kind == "fsdp2") {
    s.world = 2;
  } else if (kind == "fsdp4") {
    s.world = 4;
  } else if (kind == "tp2x2") {
    s.world = 4;
    s.tp = true;
  } else if (kind == "zstd") {
    s.world = 2;
    s.zstd = true;
  } else if (kind == "misc") {
    s.world = 2;
    s.misc = true;
    s.tensors.resize(2);
    for (int i = 0; i < 600; ++i)
      s.tensors.push_back({"model.blocks." + std::to_string(i) + ".bias", DType::kFloat32, {6}});
  } else {
    return false;
  }
  return true;
}

// The whole tensor's bytes, deterministic in its key.
std::vector<uint8_t> Values(const TensorSpec& t, bool compressible) {
  const std::size_t item = ckpt::DTypeSize(t.dtype);
  const auto n = static_cast<std::size_t>(ckpt::NumElements(t.shape));
  std::vector<uint8_t> out(n * item);
  std::mt19937_64 rng(Fnv(t.key.data(), t.key.size()));
  for (std::size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    const double v = compressible ? static_cast<double>(r % 8) / 4.0 - 1.0
                                  : static_cast<double>(r >> 11) / 9007199254740992.0 * 2.0 - 1.0;
    uint8_t* p = out.data() + i * item;
    switch (t.dtype) {
      case ckpt::DType::kFloat32: {
        const auto f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case ckpt::DType::kBFloat16: {
        const auto f = static_cast<float>(v);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        const auto h = static_cast<uint16_t>(u >> 16);
        std::memcpy(p, &h, 2);
        break;
      }
      case ckpt::DType::kFloat16: {
        // Finite halves only: sign, exponent 1..29, any mantissa.
        const auto h = static_cast<uint16_t>(((r >> 20) & 0x8000u) | ((1 + (r >> 32) % 29) << 10) | (r & 0x3ffu));
        std::memcpy(p, &h, 2);
        break;
      }
      default: {
        const auto k = static_cast<int64_t>(r % 1000);
        std::memcpy(p, &k, 8);
        break;
      }
    }
  }
  return out;
}

// Parts of `extent` over `parts` ranks by the torch.chunk rule: [begin, begin + count).
std::pair<int64_t, int64_t> Part(int64_t extent, int parts, int index) {
  const int64_t step = (extent + parts - 1) / parts;
  const int64_t begin = std::min<int64_t>(extent, step * index);
  return {begin, std::min<int64_t>(extent, begin + step) - begin};
}

// The box rank `rank` of `world` holds of a tensor of `shape`: split along `dim`, or (tp2x2)
// along dim 0 by rank / 2 and along the last dim by rank % 2.
ckpt::Box RankBox(const ckpt::Shape& shape, int world, int rank, int dim, bool mesh) {
  ckpt::Box box = ckpt::Box::Full(shape);
  if (shape.empty()) return box;
  if (mesh) {
    const auto [b0, c0] = Part(shape[0], 2, rank / 2);
    box.offsets[0] = b0;
    box.sizes[0] = c0;
    if (shape.size() > 1) {
      const auto [b1, c1] = Part(shape.back(), 2, rank % 2);
      box.offsets.back() = b1;
      box.sizes.back() = c1;
    }
    return box;
  }
  const auto d = static_cast<std::size_t>(std::min<int>(dim, static_cast<int>(shape.size()) - 1));
  const auto [b, c] = Part(shape[d], world, rank);
  box.offsets[d] = b;
  box.sizes[d] = c;
  return box;
}

// Copies `box` of the row-major tensor `full` of `shape` into `out` (row-major over box.sizes).
void CopyBox(const std::vector<uint8_t>& full, const ckpt::Shape& shape, std::size_t item,
             const ckpt::Box& box, std::vector<uint8_t>& out) {
  out.assign(static_cast<std::size_t>(box.NumElements()) * item, 0);
  if (out.empty()) return;
  const std::size_t nd = shape.size();
  const std::size_t row = nd == 0 ? item : static_cast<std::size_t>(box.sizes[nd - 1]) * item;
  std::vector<int64_t> idx(nd, 0);  // index over box.sizes of all dims but the last
  for (std::size_t o = 0; o < out.size(); o += row) {
    std::size_t src = 0;
    for (std::size_t d = 0; d < nd; ++d) {
      const int64_t i = (d + 1 == nd ? 0 : idx[d]) + box.offsets[d];
      src = src * static_cast<std::size_t>(shape[d]) + static_cast<std::size_t>(i);
    }
    std::memcpy(out.data() + o, full.data() + src * item, row);
    for (std::size_t d = nd >= 1 ? nd - 1 : 0; d-- > 0;) {
      if (++idx[d] < box.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

const char* kJsonConfig = R"({"lr": 0.001, "layers": [1, 2], "name": "flip"})";

std::vector<uint8_t> RngBytes() {
  std::vector<uint8_t> b(40);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 37 + 11);
  return b;
}

int Write(const Sample& s, const std::string& dir) {
  std::vector<std::vector<uint8_t>> full;
  for (const auto& t : s.tensors) full.push_back(Values(t, s.zstd));
  ckpt::SaveOptions options;
  if (s.zstd) options.compression.codec = ckpt::Compression::Codec::kZstd;
  if (s.tp) options.mesh = R"({"shape": [2, 2], "names": ["dp", "tp"]})";
  ckpt::RunThreads(s.world, [&](ckpt::Comm& comm) {
    std::vector<std::vector<uint8_t>> parts(s.tensors.size());
    ckpt::StateDict state;
    for (std::size_t i = 0; i < s.tensors.size(); ++i) {
      const auto& t = s.tensors[i];
      const ckpt::Box box = RankBox(t.shape, s.world, comm.rank(), 0, s.tp);
      CopyBox(full[i], t.shape, ckpt::DTypeSize(t.dtype), box, parts[i]);
      state.Add(t.key, ckpt::Tensor::Sharded(t.dtype, t.shape, {ckpt::Chunk{box, parts[i].data()}}));
    }
    state.Add("step", ckpt::Scalar::Int(1));
    if (s.misc) {
      state.Add("lr", ckpt::Scalar::Float(0.00025));
      state.Add("config", ckpt::Json{kJsonConfig});
      state.Add("rng", ckpt::Bytes{RngBytes()});
    }
    ckpt::Save(dir, state, comm, options);
  });
  return 0;
}

int Load(const Sample& s, const std::string& dir, int world, int dim) {
  std::mutex mu;
  std::vector<std::string> lines;
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    const int rank = comm.rank();
    std::vector<std::vector<uint8_t>> parts(s.tensors.size());
    ckpt::StateDict state;
    for (std::size_t i = 0; i < s.tensors.size(); ++i) {
      const auto& t = s.tensors[i];
      const ckpt::Box box = RankBox(t.shape, world, rank, dim, false);
      parts[i].assign(static_cast<std::size_t>(box.NumElements()) * ckpt::DTypeSize(t.dtype), 0xee);
      state.Add(t.key, ckpt::Tensor::Sharded(t.dtype, t.shape, {ckpt::Chunk{box, parts[i].data()}}));
    }
    state.Add("step", ckpt::Scalar{});
    if (s.misc) {
      state.Add("lr", ckpt::Scalar{});
      state.Add("config", ckpt::Json{});
      state.Add("rng", ckpt::Bytes{});
    }
    ckpt::LoadOptions options;
    options.io_threads = 1;
    (void)ckpt::Load(dir, state, comm, options);
    std::vector<std::string> mine;
    char buf[64];
    for (std::size_t i = 0; i < s.tensors.size(); ++i) {
      std::snprintf(buf, sizeof buf, " %d %016llx", rank,
                    static_cast<unsigned long long>(Fnv(parts[i].data(), parts[i].size())));
      mine.push_back(s.tensors[i].key + buf);
    }
    for (const auto& [key, entry] : state) {
      if (const auto* v = std::get_if<ckpt::Scalar>(&entry)) {
        std::snprintf(buf, sizeof buf, " %d ", rank);
        char value[40];
        if (std::holds_alternative<int64_t>(v->value))
          std::snprintf(value, sizeof value, "%lld", static_cast<long long>(v->AsInt()));
        else
          std::snprintf(value, sizeof value, "%.17g", v->AsDouble());
        mine.push_back(key + buf + value + " " + std::string(ckpt::DTypeName(v->dtype)));
      } else if (const auto* j = std::get_if<ckpt::Json>(&entry)) {
        mine.push_back(key + " " + std::to_string(rank) + " " + j->text);
      } else if (const auto* b = std::get_if<ckpt::Bytes>(&entry)) {
        std::snprintf(buf, sizeof buf, " %d %016llx", rank,
                      static_cast<unsigned long long>(Fnv(b->data.data(), b->data.size())));
        mine.push_back(key + buf);
      }
    }
    const std::lock_guard lock(mu);
    lines.insert(lines.end(), mine.begin(), mine.end());
  });
  std::sort(lines.begin(), lines.end());
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  return 0;
}

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s write fsdp2|fsdp4|tp2x2|zstd|misc DIR\n"
               "       %s load KIND DIR WORLD rows|cols\n",
               argv0, argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return Usage(argv[0]);
  const std::string verb = argv[1];
  Sample sample;
  if (!MakeSample(argv[2], sample)) return Usage(argv[0]);
  try {
    if (verb == "write" && argc == 4) return Write(sample, argv[3]);
    if (verb == "load" && argc == 6) {
      const int world = std::atoi(argv[4]);
      const std::string split = argv[5];
      if (world < 1 || world > 64 || (split != "rows" && split != "cols")) return Usage(argv[0]);
      return Load(sample, argv[3], world, split == "rows" ? 0 : 31);
    }
  } catch (const ckpt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return Usage(argv[0]);
}
