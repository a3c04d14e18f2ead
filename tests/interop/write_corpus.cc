// write_corpus: writes a corpus of checkpoints through libckpt's public API, and beside each
// the expected full tensors as raw files plus a manifest, for check_corpus.py (h5py,
// jsonschema) to read back with no ckpt code.
//
// Usage: ckpt-interop-write-corpus [--golden] <out-dir>
//   --golden: the corpus sized to be committed (tests/golden/v1): zstd_w2's model.big is
//             300 x 70 (one HDF5 chunk) instead of 1201 x 520 (several, 2.5 MB).
//   <out-dir>/<case>/            the checkpoint
//   <out-dir>/<case>.expected/   manifest.json and <n>.raw (global tensor, row-major LE bytes)
//
// Single-threaded except inside ckpt::RunThreads, where each rank only reads shared data.
#include <ckpt/ckpt.h>

#include "interop_util.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using ckpt::Box;
using ckpt::DType;
using ckpt::Shape;
using ckpt_interop::ExtractBox;
using ckpt_interop::UnevenSplit;
using ckpt_interop::WriteFile;

namespace {

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t HashKey(const std::string& key) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// Exponent and mantissa widths of a binary floating dtype.
struct FloatFormat {
  int exp_bits, man_bits;
};

FloatFormat FormatOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return {11, 52};
    case DType::kFloat32: return {8, 23};
    case DType::kFloat16: return {5, 10};
    case DType::kBFloat16: return {8, 7};
    case DType::kFloat8E4M3FN: return {4, 3};
    case DType::kFloat8E5M2: return {5, 2};
    default: return {0, 0};
  }
}

// A finite value of moderate magnitude (|v| in about [2^-6, 2^6]), as raw bits.
uint64_t RandomFiniteBits(DType dtype, uint64_t r) {
  const FloatFormat f = FormatOf(dtype);
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const int span = std::min(6, bias - 1);
  const uint64_t exp = static_cast<uint64_t>(bias - span + static_cast<int>((r >> 8) % (2 * span + 1)));
  const uint64_t man = (r >> 20) & ((uint64_t{1} << f.man_bits) - 1);
  const uint64_t sign = r & 1;
  return (sign << (f.exp_bits + f.man_bits)) | (exp << f.man_bits) | man;
}

uint64_t NanBits(DType dtype) {
  const FloatFormat f = FormatOf(dtype);
  if (dtype == DType::kFloat8E4M3FN) return 0x7f;  // e4m3fn: the only NaN, no Inf
  return (((uint64_t{1} << f.exp_bits) - 1) << f.man_bits) | (uint64_t{1} << (f.man_bits - 1));
}

uint64_t InfBits(DType dtype) {
  const FloatFormat f = FormatOf(dtype);
  return ((uint64_t{1} << f.exp_bits) - 1) << f.man_bits;
}

enum class Fill { kNormal, kSpecials, kAllNan };

// Deterministic contents of a global tensor, little-endian.
std::vector<uint8_t> MakeData(const std::string& key, DType dtype, const Shape& shape, Fill fill) {
  const std::size_t item = ckpt::DTypeSize(dtype);
  const auto n = static_cast<std::size_t>(ckpt::NumElements(shape));
  std::vector<uint8_t> out(n * item);
  uint64_t state = HashKey(key);
  for (std::size_t i = 0; i < n; ++i) {
    uint64_t r = SplitMix(state);
    uint64_t bits = r;
    if (dtype == DType::kBool) {
      bits = r & 1;
    } else if (dtype == DType::kFloat8E8M0FNU) {  // 2^(b-127): any byte but 0xff (NaN); no Inf
      bits = (r >> 8) % 255;
      if (fill == Fill::kAllNan || (fill == Fill::kSpecials && i % 5 == 0)) bits = 0xff;
    } else if (dtype == DType::kFloat4E2M1FNx2) {  // every byte is two finite values
      bits = (r >> 8) & 0xff;
    } else if (ckpt::IsFloating(dtype)) {
      bits = RandomFiniteBits(dtype, r);
      if (fill == Fill::kAllNan) bits = NanBits(dtype);
      if (fill == Fill::kSpecials && i % 5 == 0) bits = NanBits(dtype);
      if (fill == Fill::kSpecials && i % 7 == 1 && dtype != DType::kFloat8E4M3FN)
        bits = InfBits(dtype) | ((i % 2) << (FormatOf(dtype).exp_bits + FormatOf(dtype).man_bits));
    }
    for (std::size_t b = 0; b < item; ++b) out[i * item + b] = static_cast<uint8_t>(bits >> (8 * b));
  }
  return out;
}

// Which boxes of a tensor each rank holds.
using Layout = std::function<std::vector<Box>(int rank, int world, const Shape& shape)>;

Layout OnRank(int owner) {
  return [owner](int rank, int, const Shape& shape) {
    return rank == owner ? std::vector<Box>{Box::Full(shape)} : std::vector<Box>{};
  };
}

Layout Replicated() {
  return [](int, int, const Shape& shape) { return std::vector<Box>{Box::Full(shape)}; };
}

// Uneven split along `dim`; ranks whose range is empty hold nothing.
Layout SplitDim(int dim) {
  return [dim](int rank, int world, const Shape& shape) {
    auto [begin, count] = UnevenSplit(shape[static_cast<std::size_t>(dim)], world)[static_cast<std::size_t>(rank)];
    if (count == 0) return std::vector<Box>{};
    Box box = Box::Full(shape);
    box.offsets[static_cast<std::size_t>(dim)] = begin;
    box.sizes[static_cast<std::size_t>(dim)] = count;
    return std::vector<Box>{box};
  };
}

// 2 x (world/2) grid over dims 0 and 1, uneven both ways (a 2-D mesh: FSDP x TP).
Layout Grid2D() {
  return [](int rank, int world, const Shape& shape) {
    const int cols = world / 2;
    auto rows = UnevenSplit(shape[0], 2)[static_cast<std::size_t>(rank / cols)];
    auto colr = UnevenSplit(shape[1], cols)[static_cast<std::size_t>(rank % cols)];
    Box box = Box::Full(shape);
    box.offsets[0] = rows.first;
    box.sizes[0] = rows.second;
    box.offsets[1] = colr.first;
    box.sizes[1] = colr.second;
    return std::vector<Box>{box};
  };
}

// The torch.chunk / FSDP rule along `dim`: parts of ceil(n / world) elements, the last one
// shorter; ranks past the end hold nothing.
Layout StepDim(int dim) {
  return [dim](int rank, int world, const Shape& shape) {
    const int64_t n = shape[static_cast<std::size_t>(dim)];
    const int64_t step = (n + world - 1) / world;
    const int64_t begin = std::min<int64_t>(n, step * rank);
    const int64_t count = std::min<int64_t>(step, n - begin);
    if (count <= 0) return std::vector<Box>{};
    Box box = Box::Full(shape);
    box.offsets[static_cast<std::size_t>(dim)] = begin;
    box.sizes[static_cast<std::size_t>(dim)] = count;
    return std::vector<Box>{box};
  };
}

// 2 x (world/2) grid over dims 0 and 1 by the step rule both ways (FSDP x TP).
Layout StepGrid2D() {
  return [](int rank, int world, const Shape& shape) {
    const int cols = world / 2;
    Box box = Box::Full(shape);
    const int64_t parts[2] = {2, cols};
    const int64_t idx[2] = {rank / cols, rank % cols};
    for (std::size_t d = 0; d < 2; ++d) {
      const int64_t step = (shape[d] + parts[d] - 1) / parts[d];
      box.offsets[d] = std::min<int64_t>(shape[d], step * idx[d]);
      box.sizes[d] = std::min<int64_t>(step, shape[d] - box.offsets[d]);
    }
    if (box.NumElements() == 0) return std::vector<Box>{};
    return std::vector<Box>{box};
  };
}

// Rank r holds two separate pieces along dim 0 (rows interleaved in blocks of 2 by rank).
Layout Interleaved() {
  return [](int rank, int world, const Shape& shape) {
    std::vector<Box> boxes;
    for (int64_t begin = 2 * rank; begin < shape[0]; begin += 2 * world) {
      Box box = Box::Full(shape);
      box.offsets[0] = begin;
      box.sizes[0] = std::min<int64_t>(2, shape[0] - begin);
      boxes.push_back(box);
    }
    return boxes;
  };
}

struct TensorCase {
  std::string key;
  DType dtype;
  Shape shape;
  Layout layout;
  Fill fill = Fill::kNormal;
  bool replicated = false;
  std::vector<uint8_t> data;  // global
};

struct Case {
  std::string name;
  int world = 1;
  ckpt::StateDictType type = ckpt::StateDictType::kSharded;
  ckpt::Compression compression;
  std::vector<TensorCase> tensors;
  std::vector<std::pair<std::string, ckpt::Scalar>> scalars;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> blobs;
  std::vector<std::pair<std::string, std::string>> jsons;
  bool use_writer = false;  // CheckpointWriter instead of Save
  int num_files = 1;        // CheckpointWriter only
};

Case NewCase(std::string name, int world,
             ckpt::StateDictType type = ckpt::StateDictType::kSharded) {
  Case c;
  c.name = std::move(name);
  c.world = world;
  c.type = type;
  return c;
}

void AddTensor(Case& c, std::string key, DType dtype, Shape shape, Layout layout,
               Fill fill = Fill::kNormal, bool replicated = false) {
  TensorCase t{std::move(key), dtype, std::move(shape), std::move(layout), fill, replicated, {}};
  t.data = MakeData(t.key, t.dtype, t.shape, t.fill);
  c.tensors.push_back(std::move(t));
}

void AddNonTensors(Case& c) {
  c.scalars.emplace_back("optimizer.step", ckpt::Scalar::Int(1000));
  c.scalars.emplace_back("optimizer.lr", ckpt::Scalar::Float(0.00025));
  c.scalars.emplace_back("optimizer.beta1", ckpt::Scalar::Float(0.875, DType::kFloat32));
  c.scalars.emplace_back("loader.epoch", ckpt::Scalar::Int(-7, DType::kInt32));
  c.scalars.emplace_back("flags.resumed", ckpt::Scalar::Int(1, DType::kBool));
  std::vector<uint8_t> rng(4096);
  uint64_t s = 42;
  for (auto& b : rng) b = static_cast<uint8_t>(SplitMix(s));
  c.blobs.emplace_back("rng.state", rng);
  c.blobs.emplace_back("loader.position", std::vector<uint8_t>{1, 0, 0, 0, 9, 0, 0, 0});
  c.blobs.emplace_back("empty.blob", std::vector<uint8_t>{});
  c.jsons.emplace_back("config", R"({"lr": 0.001, "layers": [1, 2, {"x": null}], "name": "gpt\u00e9"})");
  c.jsons.emplace_back("note", R"("just a string")");
}

std::vector<Case> MakeCases(bool golden) {
  std::vector<Case> cases;
  const Shape shapes[] = {{}, {7}, {5, 3}, {3, 4, 5}, {2, 3, 4, 3}};

  {  // Every dtype at every rank 0..4, one rank, plus empty tensors and special values.
    Case c = NewCase("dtypes_w1", 1);
    for (DType dtype : ckpt::kAllDTypes) {
      for (const Shape& shape : shapes) {
        std::string key = "t." + std::string(ckpt::DTypeName(dtype)) + ".r" + std::to_string(shape.size());
        AddTensor(c, key, dtype, shape, OnRank(0));
      }
      AddTensor(c, "empty." + std::string(ckpt::DTypeName(dtype)), dtype, {4, 0, 3}, OnRank(0));
      if (ckpt::IsFloating(dtype)) {
        AddTensor(c, "special." + std::string(ckpt::DTypeName(dtype)), dtype, {6, 7}, OnRank(0),
                  Fill::kSpecials);
      }
    }
    AddTensor(c, "allnan.float16", DType::kFloat16, {9}, OnRank(0), Fill::kAllNan);
    AddTensor(c, "empty.1d", DType::kFloat32, {0}, OnRank(0));
    // Keys that need escaping in HDF5 names (FORMAT.md §5.2), and non-ASCII.
    AddTensor(c, "odd/key%name", DType::kFloat32, {3, 2}, OnRank(0));
    AddTensor(c, ".hidden.weight", DType::kInt16, {4}, OnRank(0));
    AddTensor(c, "emb.\xc3\xbcnicode", DType::kFloat64, {2, 2}, OnRank(0));
    AddNonTensors(c);
    cases.push_back(std::move(c));
  }
  {  // Three ranks, uneven splits along different dims, a replicated tensor.
    Case c = NewCase("sharded_w3", 3);
    AddTensor(c, "model.layers.0.attn.qkv.weight", DType::kFloat32, {10, 6}, SplitDim(0));
    AddTensor(c, "model.layers.0.mlp.w1", DType::kBFloat16, {6, 11}, SplitDim(1));
    AddTensor(c, "model.layers.0.conv", DType::kFloat16, {2, 3, 8, 5}, SplitDim(2));
    AddTensor(c, "model.small", DType::kInt64, {2, 4}, SplitDim(0));  // dim 0 < world: rank 0 empty
    AddTensor(c, "model.embed", DType::kFloat8E4M3FN, {13, 4}, Interleaved());
    AddTensor(c, "model.mask", DType::kBool, {9}, SplitDim(0));
    AddTensor(c, "model.layers.0.norm.weight", DType::kFloat32, {16}, Replicated(), Fill::kNormal, true);
    AddTensor(c, "model.scale", DType::kFloat64, {}, Replicated(), Fill::kNormal, true);
    AddTensor(c, "model.on_rank2", DType::kUInt8, {5, 5}, OnRank(2));
    AddNonTensors(c);
    cases.push_back(std::move(c));
  }
  {  // Four ranks as a 2x2 mesh; every rank holds a replicated bias.
    Case c = NewCase("sharded_w4", 4);
    AddTensor(c, "model.layers.1.attn.o.weight", DType::kFloat32, {9, 7}, Grid2D());
    AddTensor(c, "model.layers.1.attn.o.bias", DType::kFloat32, {7}, Replicated(), Fill::kNormal, true);
    AddTensor(c, "model.layers.1.mlp.w2", DType::kBFloat16, {5, 12, 3}, Grid2D());
    AddTensor(c, "model.layers.1.mlp.fp8", DType::kFloat8E5M2, {17, 2}, SplitDim(0));
    AddTensor(c, "model.layers.1.ints", DType::kInt8, {3, 3, 3, 3}, SplitDim(3));
    AddTensor(c, "model.layers.1.i32", DType::kInt32, {8, 2}, Interleaved());
    AddTensor(c, "model.layers.1.empty", DType::kFloat32, {0, 5}, OnRank(1));
    AddTensor(c, "optimizer.state.model.layers.1.attn.o.weight.exp_avg", DType::kFloat32, {9, 7}, Grid2D(),
              Fill::kSpecials);
    AddNonTensors(c);
    cases.push_back(std::move(c));
  }
  {  // Four ranks as a 2x2 mesh, regular splits (torch.chunk rule): what a grid layout with
     // steps and an affine file map describes (FORMAT.md §3.3); chunks of several blocks.
    Case c = NewCase("fsdp_w4", 4);
    AddTensor(c, "model.embed.weight", DType::kFloat32, {4099, 64}, StepDim(0));  // 1025 rows, 256 KiB
    AddTensor(c, "model.w", DType::kBFloat16, {10, 3}, StepDim(0));                 // 3, 3, 3, 1
    AddTensor(c, "model.tiny", DType::kInt32, {2, 5}, StepDim(0));                  // ranks 2, 3 empty
    AddTensor(c, "model.tp.weight", DType::kFloat32, {8, 6}, StepGrid2D());
    AddTensor(c, "model.tp.odd", DType::kFloat16, {7, 5}, StepGrid2D());            // 4+3 x 3+2
    AddTensor(c, "model.cols", DType::kInt64, {3, 9}, StepDim(1));                   // 3 columns each
    AddTensor(c, "optimizer.state.model.w.exp_avg", DType::kFloat32, {10, 3}, StepDim(0), Fill::kSpecials);
    AddNonTensors(c);
    cases.push_back(std::move(c));
  }
  {  // zstd-compressed, two ranks.
    Case c = NewCase("zstd_w2", 2);
    c.compression = ckpt::Compression{ckpt::Compression::Codec::kZstd, 5};
    AddTensor(c, "model.w", DType::kFloat32, {64, 33}, SplitDim(0));
    // Over 1 MiB per rank: several HDF5 chunks per dataset, the last one partial.
    AddTensor(c, "model.big", DType::kFloat32, golden ? Shape{300, 70} : Shape{1201, 520}, SplitDim(0));
    AddTensor(c, "model.b", DType::kBFloat16, {40}, SplitDim(0));
    AddTensor(c, "model.i", DType::kInt64, {3, 5, 7}, SplitDim(1));
    AddTensor(c, "model.r", DType::kFloat16, {12}, Replicated(), Fill::kNormal, true);
    AddTensor(c, "model.z", DType::kFloat32, {}, OnRank(1));
    AddTensor(c, "model.e", DType::kFloat32, {0, 3}, OnRank(0));
    AddNonTensors(c);
    cases.push_back(std::move(c));
  }
  {  // CheckpointWriter: a FULL export into 3 files, tensors cut into several chunks.
    Case c = NewCase("writer_full", 1, ckpt::StateDictType::kFull);
    c.use_writer = true;
    c.num_files = 3;
    AddTensor(c, "model.a", DType::kFloat32, {11, 4}, SplitDim(0));
    AddTensor(c, "model.b", DType::kBFloat16, {4, 9}, SplitDim(1));
    AddTensor(c, "model.c", DType::kInt32, {}, OnRank(0));
    AddTensor(c, "model.d", DType::kFloat8E4M3FN, {3, 2, 2}, OnRank(0));
    AddNonTensors(c);
    cases.push_back(std::move(c));
  }
  {  // LOCAL state-dict type, two ranks.
    Case c = NewCase("local_w2", 2, ckpt::StateDictType::kLocal);
    AddTensor(c, "flat_param.0", DType::kFloat32, {20}, SplitDim(0));
    AddTensor(c, "flat_param.1", DType::kBFloat16, {7, 3}, SplitDim(0));
    AddNonTensors(c);
    cases.push_back(std::move(c));
  }
  return cases;
}

// The writer version of a layout: the boxes every "rank" would hold, in rank order.
std::vector<Box> AllBoxes(const TensorCase& t, int parts) {
  std::vector<Box> boxes;
  for (int r = 0; r < parts; ++r)
    for (const Box& b : t.layout(r, parts, t.shape)) boxes.push_back(b);
  return boxes;
}

void SaveCase(const Case& c, const fs::path& dir) {
  if (c.use_writer) {
    ckpt::CheckpointWriter::Options opt;
    opt.state_dict_type = c.type;
    opt.world_size = c.world;
    opt.num_files = c.num_files;
    opt.compression = c.compression;
    opt.user_metadata = R"({"case": ")" + c.name + R"(", "writer": "CheckpointWriter"})";
    auto writer = ckpt::CheckpointWriter::Create(dir, opt);
    int file = 0;
    for (const TensorCase& t : c.tensors) {
      for (const Box& box : AllBoxes(t, 3)) {
        auto piece = ExtractBox(t.data, t.shape, box, ckpt::DTypeSize(t.dtype));
        writer->WriteChunk(t.key, t.dtype, t.shape, box, piece.data(), file);
        file = (file + 1) % c.num_files;
      }
    }
    for (const auto& [key, s] : c.scalars) writer->WriteScalar(key, s);
    for (const auto& [key, blob] : c.blobs) {
      writer->WriteBytes(key, blob, file);
      file = (file + 1) % c.num_files;
    }
    for (const auto& [key, text] : c.jsons) writer->WriteJson(key, text);
    writer->Commit();
    return;
  }
  ckpt::SaveOptions opt;
  opt.state_dict_type = c.type;
  opt.compression = c.compression;
  opt.user_metadata = R"({"case": ")" + c.name + R"(", "world": )" + std::to_string(c.world) + "}";
  if (c.world == 4) opt.mesh = R"({"shape": [2, 2], "dims": ["dp", "tp"]})";
  ckpt::RunThreads(c.world, [&](ckpt::Comm& comm) {
    const int rank = comm.rank();
    std::vector<std::vector<uint8_t>> buffers;  // this rank's pieces; live until Save returns
    buffers.reserve(256);
    ckpt::StateDict state;
    for (const TensorCase& t : c.tensors) {
      std::vector<ckpt::Chunk> chunks;
      for (const Box& box : t.layout(rank, c.world, t.shape)) {
        buffers.push_back(ExtractBox(t.data, t.shape, box, ckpt::DTypeSize(t.dtype)));
        chunks.push_back(ckpt::Chunk{box, buffers.back().data()});
      }
      state.Add(t.key, ckpt::Tensor::Sharded(t.dtype, t.shape, std::move(chunks)));
    }
    for (const auto& [key, s] : c.scalars) state.Add(key, s);
    for (const auto& [key, blob] : c.blobs) state.Add(key, ckpt::Bytes{blob});
    for (const auto& [key, text] : c.jsons) state.Add(key, ckpt::Json{text});
    ckpt::Save(dir, state, comm, opt);
  });
}

void WriteExpected(const Case& c, const fs::path& dir) {
  fs::create_directories(dir);
  nlohmann::json m;
  m["case"] = c.name;
  m["world_size"] = c.world;
  m["state_dict_type"] = std::string(ckpt::StateDictTypeName(c.type));
  m["compressed"] = c.compression.codec != ckpt::Compression::Codec::kNone;
  m["compression_level"] = c.compression.level;
  m["writer"] = c.use_writer ? "CheckpointWriter" : "Save";
  m["tensors"] = nlohmann::json::array();
  int n = 0;
  for (const TensorCase& t : c.tensors) {
    const std::string raw = std::to_string(n++) + ".raw";
    WriteFile(dir / raw, t.data.data(), t.data.size());
    m["tensors"].push_back({{"key", t.key}, {"dtype", std::string(ckpt::DTypeName(t.dtype))},
                            {"shape", t.shape}, {"raw", raw}, {"replicated", t.replicated}});
  }
  m["scalars"] = nlohmann::json::array();
  for (const auto& [key, s] : c.scalars) {
    nlohmann::json v = std::holds_alternative<double>(s.value) ? nlohmann::json(s.AsDouble())
                                                               : nlohmann::json(s.AsInt());
    m["scalars"].push_back({{"key", key}, {"dtype", std::string(ckpt::DTypeName(s.dtype))}, {"value", v}});
  }
  m["bytes"] = nlohmann::json::array();
  for (const auto& [key, blob] : c.blobs) {
    const std::string raw = std::to_string(n++) + ".raw";
    WriteFile(dir / raw, blob.data(), blob.size());
    m["bytes"].push_back({{"key", key}, {"raw", raw}});
  }
  m["json"] = nlohmann::json::array();
  for (const auto& [key, text] : c.jsons)
    m["json"].push_back({{"key", key}, {"value", nlohmann::json::parse(text)}});
  const std::string text = m.dump(1) + "\n";
  WriteFile(dir / "manifest.json", text.data(), text.size());
}

}  // namespace

int main(int argc, char** argv) {
  const bool golden = argc == 3 && std::string(argv[1]) == "--golden";
  if (argc != 2 && !golden) {
    std::fprintf(stderr, "usage: %s [--golden] <out-dir>\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[argc - 1];
  int failures = 0;
  try {
    fs::create_directories(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_corpus: %s\n", e.what());
    return 2;
  }
  nlohmann::json index = nlohmann::json::array();
  for (const Case& c : MakeCases(golden)) {
    try {
      WriteExpected(c, out / (c.name + ".expected"));
      SaveCase(c, out / c.name);
      index.push_back(c.name);
      std::printf("wrote %s (%d rank%s)\n", c.name.c_str(), c.world, c.world == 1 ? "" : "s");
    } catch (const std::exception& e) {
      // Keep going: the other cases still tell the checker something.
      std::fprintf(stderr, "write_corpus: case %s failed: %s\n", c.name.c_str(), e.what());
      ++failures;
    }
  }
  const std::string text = index.dump() + "\n";
  try {
    WriteFile(out / "corpus.json", text.data(), text.size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "write_corpus: %s\n", e.what());
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
