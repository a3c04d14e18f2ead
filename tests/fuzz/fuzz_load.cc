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
#include "fuzz/fuzz_checkpoint.h"
#include "fuzz/fuzz_util.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;

// The checkpoint directory every input is tried against; made on first use.
const fs::path& CheckpointDir() {
  static const ckpt_test::TempDir root("fuzz-load");
  static const fs::path dir = [] {
    std::vector<float> w, zero_d;
    std::vector<uint16_t> b;
    const ckpt::StateDict state = ckpt_fuzz::SampleState(w, b, zero_d);
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  WriteMetadata(data, size);
  std::unique_ptr<ckpt::CheckpointReader> reader;
  try {
    reader = ckpt::CheckpointReader::Open(CheckpointDir());
  } catch (const ckpt::Error&) {
    return 0;
  }
  ckpt_fuzz::ReadEverything(*reader);
  try {
    ckpt_fuzz::LoadEverything(CheckpointDir(), reader->metadata());
  } catch (const ckpt::Error&) {
  }
  return 0;
}
