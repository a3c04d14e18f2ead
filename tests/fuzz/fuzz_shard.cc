// tests/fuzz/fuzz_shard.cc: hostile shard bytes under a valid metadata.json (the HDF5
// layer, not our JSON).
//
// At startup the state of fuzz_checkpoint.h is saved twice (plain, and zstd-compressed;
// SingleComm, so one shard each) and their metadata.json texts are kept. Each input
// replaces the shard of both, and metadata.json is rewritten with the input's size as
// the shard's recorded size (so the size check does not stop every input before HDF5
// sees it). Then, on each: ops::Verify (full, data read), CheckpointReader::Open and a
// read of everything, a non-strict ckpt::Load, and ops::Source::Open of the lone shard
// with a read of every tensor its index lists.
//
// Property: nothing crashes, hangs or leaks, and the only exception is ckpt::Error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/comm.h"
#include "ckpt/error.h"
#include "ckpt/ops/source.h"
#include "ckpt/ops/verify.h"
#include "fuzz/fuzz_checkpoint.h"
#include "fuzz/fuzz_util.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

struct Target {
  fs::path dir;
  std::string shard;        // its one shard's file name
  ordered_json metadata;    // as saved
};

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void WriteAll(const fs::path& p, const void* data, std::size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out.flush()) ckpt_fuzz::Fail("cannot write " + p.string());
}

// The two checkpoints every input is tried in; saved on first use. With
// CKPT_FUZZ_SHARD_SEED=<dir> set, their shards are copied there (the seeds of corpus/shard/).
const std::vector<Target>& Targets() {
  static const ckpt_test::TempDir root("fuzz-shard");
  static const std::vector<Target> targets = [] {
    std::vector<float> w, zero_d;
    std::vector<uint16_t> b;
    const ckpt::StateDict state = ckpt_fuzz::SampleState(w, b, zero_d);
    ckpt::SingleComm comm;
    std::vector<Target> out;
    for (const bool zstd : {false, true}) {
      ckpt::SaveOptions options;
      if (zstd) options.compression.codec = ckpt::Compression::Codec::kZstd;
      Target t;
      t.dir = root / (zstd ? "zstd" : "plain");
      ckpt::Save(t.dir, state, comm, options);
      t.metadata = ordered_json::parse(ReadAll(t.dir / ckpt::kMetadataFileName));
      t.shard = t.metadata.at("files").at(0).at("name").get<std::string>();
      if (const char* seed = std::getenv("CKPT_FUZZ_SHARD_SEED"))
        fs::copy_file(t.dir / t.shard, fs::path(seed) / (zstd ? "zstd.h5" : "plain.h5"),
                      fs::copy_options::overwrite_existing);
      out.push_back(std::move(t));
    }
    return out;
  }();
  return targets;
}

// Reads every tensor a lone shard's index lists (those it holds whole).
void ReadLoneShard(const fs::path& file) {
  std::unique_ptr<ckpt::ops::Source> src;
  try {
    src = ckpt::ops::Source::Open(file);
  } catch (const ckpt::Error&) {
    return;
  }
  std::vector<uint8_t> buf;
  for (const auto& [key, entry] : src->metadata().entries) {
    if (entry.kind != ckpt::EntryKind::kTensor) continue;
    try {
      const ckpt::Box full = ckpt::Box::Full(entry.shape);
      const std::size_t bytes = ckpt_fuzz::BoundedBytes(full, entry.dtype);
      if (bytes == 0 && full.NumElements() != 0) continue;
      buf.assign(bytes + 1, 0);
      src->ReadRegion(key, full, buf.data());
      for (std::size_t i = 0; i < entry.chunks.size(); ++i) (void)src->Locate(key, i);
    } catch (const ckpt::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (const Target& t : Targets()) {
    WriteAll(t.dir / t.shard, data, size);
    ordered_json md = t.metadata;
    md["files"][0]["bytes"] = size;
    const std::string text = md.dump();
    WriteAll(t.dir / ckpt::kMetadataFileName, text.data(), text.size());

    ckpt::ops::VerifyOptions vo;
    vo.threads = 1;
    try {
      (void)ckpt::ops::Verify(t.dir, vo);
    } catch (const ckpt::Error&) {
    }
    std::unique_ptr<ckpt::CheckpointReader> reader;
    try {
      reader = ckpt::CheckpointReader::Open(t.dir);
    } catch (const ckpt::Error&) {
      continue;
    }
    ckpt_fuzz::ReadEverything(*reader);
    try {
      ckpt_fuzz::LoadEverything(t.dir, reader->metadata());
    } catch (const ckpt::Error&) {
    }
    reader.reset();
    ReadLoneShard(t.dir / t.shard);
  }
  return 0;
}
