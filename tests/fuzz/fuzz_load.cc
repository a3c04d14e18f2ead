// tests/fuzz/fuzz_load.cc: a hostile metadata.json over real shards.
//
// At startup a small valid checkpoint is saved once (ckpt::Save, SingleComm: tensors full,
// sharded, empty and 0-D, a scalar, bytes, JSON), and the shard of a zstd-compressed one is
// copied beside it as "zstd.h5", so metadata can point at compressed datasets too. Each
// input replaces metadata.json; then CheckpointReader::Open, ReadRegion and ReadChunk of
// every tensor, ReadBytes of every bytes entry, and a non-strict ckpt::Load of everything.
// Entries that claim more than kMaxReadBytes are skipped.
//
// Property: nothing crashes, hangs or leaks, and the only exception is ckpt::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/comm.h"
#include "ckpt/error.h"
#include "ckpt/tensor.h"
#include "fuzz/fuzz_util.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

ckpt::StateDict SampleState(std::vector<float>& w, std::vector<uint16_t>& b, std::vector<float>& zero_d) {
  w.resize(4 * 6);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.5f - 3.0f;
  b = {0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0};  // bf16 1..6
  zero_d = {42.0f};
  ckpt::StateDict state;
  state.Add("model.w", ckpt::Tensor::Full(ckpt::DType::kFloat32, {4, 6}, w.data()));
  state.Add("model.b", ckpt::Tensor::Sharded(ckpt::DType::kBFloat16, {6},
                                             {ckpt::Chunk{ckpt::Box{{0}, {2}}, b.data()},
                                              ckpt::Chunk{ckpt::Box{{2}, {4}}, b.data() + 2}}));
  state.Add("model.empty", ckpt::Tensor::Full(ckpt::DType::kFloat32, {0, 3}, w.data()));
  state.Add("model.scale", ckpt::Tensor::Full(ckpt::DType::kFloat32, {}, zero_d.data()));
  state.Add("step", ckpt::Scalar::Int(7));
  state.Add("rng", ckpt::Bytes{{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}});
  state.Add("config", ckpt::Json{R"({"lr": 0.001, "layers": [1, 2]})"});
  return state;
}

// The checkpoint directory every input is tried against; made on first use.
const fs::path& CheckpointDir() {
  static const ckpt_test::TempDir root("fuzz-load");
  static const fs::path dir = [] {
    std::vector<float> w, zero_d;
    std::vector<uint16_t> b;
    const ckpt::StateDict state = SampleState(w, b, zero_d);
    ckpt::SingleComm comm;
    const fs::path plain = root / "ckpt";
    ckpt::Save(plain, state, comm);
    ckpt::SaveOptions zstd;
    zstd.compression.codec = ckpt::Compression::Codec::kZstd;
    const fs::path compressed = root / "ckpt-zstd";
    ckpt::Save(compressed, state, comm, zstd);
    for (const auto& e : fs::directory_iterator(compressed)) {
      if (e.path().extension() == ".h5") fs::copy_file(e.path(), plain / "zstd.h5");
    }
    // Regenerating the seeds of corpus/load/: the metadata as saved.
    if (const char* out = std::getenv("CKPT_FUZZ_LOAD_SEED")) {
      fs::copy_file(plain / ckpt::kMetadataFileName, out, fs::copy_options::overwrite_existing);
      fs::copy_file(compressed / ckpt::kMetadataFileName, std::string(out) + ".zstd",
                    fs::copy_options::overwrite_existing);
    }
    return plain;
  }();
  return dir;
}

void WriteMetadata(const uint8_t* data, size_t size) {
  std::ofstream out(CheckpointDir() / ckpt::kMetadataFileName, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out.flush()) ckpt_fuzz::Fail("cannot write metadata.json");
}

// Bytes of `box` of a tensor of `dtype`, or 0 when it claims more than we read.
std::size_t BoundedBytes(const ckpt::Box& box, ckpt::DType dtype) {
  const int64_t elements = box.NumElements();  // throws ckpt::Error on overflow
  const uint64_t item = ckpt::DTypeSize(dtype);
  if (elements < 0 || static_cast<uint64_t>(elements) > ckpt_fuzz::kMaxReadBytes / item) return 0;
  return static_cast<std::size_t>(static_cast<uint64_t>(elements) * item);
}

void ReadEverything(ckpt::CheckpointReader& reader) {
  std::vector<uint8_t> buf;
  for (const auto& [key, entry] : reader.metadata().entries) {
    try {
      if (entry.kind == ckpt::EntryKind::kBytes) {
        if (entry.size <= ckpt_fuzz::kMaxReadBytes) (void)reader.ReadBytes(key);
        continue;
      }
      if (entry.kind != ckpt::EntryKind::kTensor) continue;
      const ckpt::Box full = ckpt::Box::Full(entry.shape);
      const std::size_t bytes = BoundedBytes(full, entry.dtype);
      if (bytes == 0 && full.NumElements() != 0) continue;
      buf.assign(bytes + 1, 0);
      reader.ReadRegion(key, full, buf.data());
      for (std::size_t i = 0; i < entry.chunks.size(); ++i) {
        const std::size_t chunk_bytes = BoundedBytes(entry.chunks[i].box, entry.dtype);
        if (chunk_bytes == 0 && entry.chunks[i].box.NumElements() != 0) continue;
        buf.assign(chunk_bytes + 1, 0);
        reader.ReadChunk(key, i, buf.data());
      }
    } catch (const ckpt::Error&) {
    }
  }
}

// A non-strict Load of every entry the metadata lists (tensors as full tensors).
void LoadEverything(const ckpt::Metadata& metadata) {
  std::vector<std::vector<uint8_t>> buffers;
  buffers.reserve(metadata.entries.size());
  ckpt::StateDict target;
  for (const auto& [key, entry] : metadata.entries) {
    switch (entry.kind) {
      case ckpt::EntryKind::kTensor: {
        const ckpt::Box full = ckpt::Box::Full(entry.shape);
        const std::size_t bytes = BoundedBytes(full, entry.dtype);
        if (bytes == 0 && full.NumElements() != 0) continue;
        buffers.emplace_back(bytes + 1, 0);
        target.Add(key, ckpt::Tensor::Full(entry.dtype, entry.shape, buffers.back().data()));
        break;
      }
      case ckpt::EntryKind::kScalar: target.Add(key, ckpt::Scalar{}); break;
      case ckpt::EntryKind::kBytes:
        if (entry.size <= ckpt_fuzz::kMaxReadBytes) target.Add(key, ckpt::Bytes{});
        break;
      case ckpt::EntryKind::kJson: target.Add(key, ckpt::Json{}); break;
    }
  }
  ckpt::SingleComm comm;
  ckpt::LoadOptions options;
  options.state_dict_type = metadata.state_dict_type;
  options.strict = false;
  options.io_threads = 1;
  (void)ckpt::Load(CheckpointDir(), target, comm, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WriteMetadata(data, size);
  std::unique_ptr<ckpt::CheckpointReader> reader;
  try {
    reader = ckpt::CheckpointReader::Open(CheckpointDir());
  } catch (const ckpt::Error&) {
    return 0;
  }
  ReadEverything(*reader);
  try {
    LoadEverything(reader->metadata());
  } catch (const ckpt::Error&) {
  }
  return 0;
}
