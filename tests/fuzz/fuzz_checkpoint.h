// tests/fuzz/fuzz_checkpoint.h: what fuzz_load and fuzz_shard share: the small state they
// save once, and reading everything a checkpoint lists (ReadRegion and ReadChunk of every
// tensor, ReadBytes of every bytes entry, a non-strict Load of all of it), each failure a
// ckpt::Error that is swallowed. Entries that claim more than kMaxReadBytes are skipped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/comm.h"
#include "ckpt/error.h"
#include "ckpt/tensor.h"
#include "fuzz/fuzz_util.h"

namespace ckpt_fuzz {

// Tensors full, sharded, empty and 0-D, a scalar, bytes, JSON; the buffers hold the data.
inline ckpt::StateDict SampleState(std::vector<float>& w, std::vector<uint16_t>& b, std::vector<float>& zero_d) {
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

// Bytes of `box` of a tensor of `dtype`, or 0 when it claims more than we read.
inline std::size_t BoundedBytes(const ckpt::Box& box, ckpt::DType dtype) {
  const int64_t elements = box.NumElements();  // throws ckpt::Error on overflow
  const uint64_t item = ckpt::DTypeSize(dtype);
  if (elements < 0 || static_cast<uint64_t>(elements) > kMaxReadBytes / item) return 0;
  return static_cast<std::size_t>(static_cast<uint64_t>(elements) * item);
}

inline void ReadEverything(ckpt::CheckpointReader& reader) {
  std::vector<uint8_t> buf;
  for (const auto& [key, entry] : reader.metadata().entries) {
    try {
      if (entry.kind == ckpt::EntryKind::kBytes) {
        if (entry.size <= kMaxReadBytes) (void)reader.ReadBytes(key);
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
inline void LoadEverything(const std::filesystem::path& dir, const ckpt::Metadata& metadata) {
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
        if (entry.size <= kMaxReadBytes) target.Add(key, ckpt::Bytes{});
        break;
      case ckpt::EntryKind::kJson: target.Add(key, ckpt::Json{}); break;
    }
  }
  ckpt::SingleComm comm;
  ckpt::LoadOptions options;
  options.state_dict_type = metadata.state_dict_type;
  options.strict = false;
  options.io_threads = 1;
  (void)ckpt::Load(dir, target, comm, options);
}

}  // namespace ckpt_fuzz
