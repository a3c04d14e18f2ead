// tests/conformance/conformance_driver.cc: one library reader over one checkpoint, for
// conformance.py (FORMAT.md's MUST rules, schemas/CONFORMANCE.md). Unlike hostile_load,
// nothing is swallowed: the first ckpt::Error is the answer.
//
//   conformance_driver load DIR     ckpt::Load (strict) of every entry metadata.json lists
//   conformance_driver reader DIR   CheckpointReader::Open, then ReadRegion of every tensor
//                                   whole, ReadChunk of each of its chunks, ReadBytes of
//                                   every bytes entry
//   conformance_driver write DIR    ckpt::Save of the base the cases break: float32 w [8, 4]
//                                   in two chunks, packed p0 [6] and p1 [10], big [20000] (a
//                                   dataset of its own), empty e [0, 4], 0-D s, int32 i [3, 4],
//                                   bytes blob, scalar step, json cfg; one shard
//   exit 0: read; 1: a ckpt::Error (printed); 2: usage; 3: Load left bytes unwritten;
//   anything else is a bug
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/ckpt.h"

namespace {

constexpr uint64_t kMaxBytes = uint64_t{1} << 30;  // what a conformance case may hold

std::size_t BytesOf(const ckpt::Box& box, ckpt::DType dtype) {
  const auto bytes = static_cast<uint64_t>(box.NumElements()) * ckpt::DTypeSize(dtype);
  if (bytes > kMaxBytes) throw ckpt::Error(ckpt::ErrorCode::kInvalidArgument, "conformance: a case too large");
  return static_cast<std::size_t>(bytes);
}

// Loads everything into buffers filled with `fill`; returns the buffers by key.
std::vector<std::pair<std::string, std::vector<uint8_t>>> LoadInto(const char* dir, uint8_t fill) {
  ckpt::StateDict target;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> buffers;
  ckpt::LoadOptions options;
  try {
    const ckpt::Metadata m = ckpt::ReadMetadata(dir, /*resolve=*/false);
    options.state_dict_type = m.state_dict_type;
    buffers.reserve(m.entries.size());
    for (const auto& [key, e] : m.entries) {
      switch (e.kind) {
        case ckpt::EntryKind::kTensor:
          buffers.emplace_back(key, std::vector<uint8_t>(BytesOf(ckpt::Box::Full(e.shape), e.dtype) + 1, fill));
          target.Add(key, ckpt::Tensor::Full(e.dtype, e.shape, buffers.back().second.data()));
          break;
        case ckpt::EntryKind::kScalar: target.Add(key, ckpt::Scalar{}); break;
        case ckpt::EntryKind::kBytes: target.Add(key, ckpt::Bytes{}); break;
        case ckpt::EntryKind::kJson: target.Add(key, ckpt::Json{}); break;
      }
    }
  } catch (const ckpt::Error&) {
    options.strict = false;  // Load parses metadata.json itself: it must refuse it too
  }
  ckpt::SingleComm comm;
  (void)ckpt::Load(dir, target, comm, options);
  return buffers;
}

// Load, twice, into buffers filled differently: a load that returns without writing every
// byte of a tensor (issue 32.3) leaves the two apart.
void LoadAll(const char* dir) {
  const auto zeros = LoadInto(dir, 0x00), ones = LoadInto(dir, 0xff);
  for (std::size_t i = 0; i < zeros.size() && i < ones.size(); ++i) {
    const auto& a = zeros[i].second;
    const auto& b = ones[i].second;
    if (!std::equal(a.begin(), a.end() - 1, b.begin())) {
      std::fprintf(stderr, "conformance: Load returned without writing all of tensor '%s'\n", zeros[i].first.c_str());
      std::exit(3);
    }
  }
}

void ReadAll(const char* dir) {
  const auto reader = ckpt::CheckpointReader::Open(dir);
  std::vector<uint8_t> buf;
  for (const auto& [key, e] : reader->metadata().entries) {
    if (e.kind == ckpt::EntryKind::kBytes) {
      (void)reader->ReadBytes(key);
      continue;
    }
    if (e.kind != ckpt::EntryKind::kTensor) continue;
    buf.assign(BytesOf(ckpt::Box::Full(e.shape), e.dtype) + 1, 0);
    reader->ReadRegion(key, ckpt::Box::Full(e.shape), buf.data());
    for (std::size_t i = 0; i < e.chunks.size(); ++i) {
      buf.assign(BytesOf(e.chunks[i].box, e.dtype) + 1, 0);
      reader->ReadChunk(key, i, buf.data());
    }
  }
}

void Write(const char* dir) {
  static std::vector<float> w(32), p0(6, 1.0f), p1(10, 2.0f), big(20000), s{42.0f};
  static std::vector<int32_t> i(12);
  for (std::size_t k = 0; k < w.size(); ++k) w[k] = static_cast<float>(k) * 0.5f - 3.0f;
  for (std::size_t k = 0; k < big.size(); ++k) big[k] = static_cast<float>(k);
  for (std::size_t k = 0; k < i.size(); ++k) i[k] = static_cast<int32_t>(k) - 4;
  ckpt::StateDict sd;
  sd.Add("w", ckpt::Tensor::Sharded(ckpt::DType::kFloat32, {8, 4},
                                    {ckpt::Chunk{ckpt::Box{{0, 0}, {4, 4}}, w.data()},
                                     ckpt::Chunk{ckpt::Box{{4, 0}, {4, 4}}, w.data() + 16}}));
  sd.Add("p0", ckpt::Tensor::Full(ckpt::DType::kFloat32, {6}, p0.data()));
  sd.Add("p1", ckpt::Tensor::Full(ckpt::DType::kFloat32, {10}, p1.data()));
  sd.Add("big", ckpt::Tensor::Full(ckpt::DType::kFloat32, {20000}, big.data()));
  sd.Add("e", ckpt::Tensor::Full(ckpt::DType::kFloat32, {0, 4}, w.data()));
  sd.Add("s", ckpt::Tensor::Full(ckpt::DType::kFloat32, {}, s.data()));
  sd.Add("i", ckpt::Tensor::Full(ckpt::DType::kInt32, {3, 4}, i.data()));
  sd.Add("blob", ckpt::Bytes{{1, 2, 3, 4, 5, 6, 7, 8}});
  sd.Add("step", ckpt::Scalar::Int(7));
  sd.Add("cfg", ckpt::Json{R"({"lr": 0.001})"});
  ckpt::SingleComm comm;
  ckpt::Save(dir, sd, comm);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "load") != 0 && std::strcmp(argv[1], "reader") != 0 &&
                    std::strcmp(argv[1], "write") != 0)) {
    std::fprintf(stderr, "usage: %s load|reader|write CHECKPOINT_DIR\n", argv[0]);
    return 2;
  }
  try {
    if (std::strcmp(argv[1], "write") == 0) {
      Write(argv[2]);
    } else if (std::strcmp(argv[1], "load") == 0) {
      LoadAll(argv[2]);
    } else {
      ReadAll(argv[2]);
    }
  } catch (const ckpt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
