// tests/fuzz/fuzz_safetensors.cc: bytes -> a .safetensors file -> ckpt::ops::SafetensorsReader
// (Open, every tensor read whole and by rows) and ckpt::ops::Source (the tools' view of it).
//
// Property: nothing crashes, hangs or leaks, and the only exception is ckpt::Error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/ops/safetensors.h"
#include "ckpt/ops/source.h"
#include "fuzz/fuzz_util.h"
#include "test_util.h"

namespace {

const std::filesystem::path& InputPath() {
  static const ckpt_test::TempDir dir("fuzz-safetensors");
  static const std::filesystem::path path = dir / "input.safetensors";
  return path;
}

void WriteInput(const uint8_t* data, size_t size) {
  std::ofstream out(InputPath(), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out.flush()) ckpt_fuzz::Fail("cannot write " + InputPath().string());
}

// Reads every tensor of `reader`: whole, then row by row (the region path).
void ReadAll(const ckpt::ops::SafetensorsReader& reader) {
  std::vector<uint8_t> buf;
  for (const ckpt::ops::SafetensorsTensor& t : reader.tensors()) {
    const uint64_t bytes = t.end - t.begin;
    if (bytes > ckpt_fuzz::kMaxReadBytes) continue;
    buf.assign(static_cast<std::size_t>(bytes), 0);
    reader.ReadRange(t, 0, bytes, buf.data());
    if (reader.Find(t.name) != &t) ckpt_fuzz::Fail("Find('" + t.name + "') does not return the tensor");
    const ckpt::Box full = ckpt::Box::Full(t.shape);
    reader.ReadRegion(t, full, buf.data());
    if (!t.shape.empty() && t.shape[0] > 1) {
      ckpt::Box row = full;
      row.offsets[0] = t.shape[0] - 1;
      row.sizes[0] = 1;
      reader.ReadRegion(t, row, buf.data());
    }
  }
}

void ReadSource(ckpt::ops::Source& source) {
  std::vector<uint8_t> buf;
  for (const auto& [key, entry] : source.metadata().entries) {
    if (entry.kind != ckpt::EntryKind::kTensor) continue;
    const uint64_t bytes = entry.TensorBytes();
    if (bytes > ckpt_fuzz::kMaxReadBytes) continue;
    buf.assign(static_cast<std::size_t>(bytes), 0);
    source.ReadRegion(key, ckpt::Box::Full(entry.shape), buf.data());
    (void)source.HoldsWhole(key);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WriteInput(data, size);
  try {
    ReadAll(*ckpt::ops::SafetensorsReader::Open(InputPath()));
  } catch (const ckpt::Error&) {
  }
  try {
    auto source = ckpt::ops::Source::Open(InputPath());
    ReadSource(*source);
  } catch (const ckpt::Error&) {
  }
  return 0;
}
