// tests/fuzz/fuzz_shard.cc: hostile shard bytes (the HDF5 layer, not our JSON).
//
// At startup fuzz_checkpoint.h's state is saved three ways (packed, the default; unpacked,
// one contiguous dataset per chunk; zstd-compressed; SingleComm, one shard each), and each
// shard's own index gives the chunks a reader looks for. With CKPT_FUZZ_SHARD_SEED=<dir>
// set, the three shards are copied there (the seeds of corpus/shard/).
//
// Each input is written once into a memfd (no file, no fork per input) and opened once by
// storage::ShardReader, HDF5 reading it whole through its core driver: the shard index
// (IndexText, Index, ForeignLinks), then every chunk of the three saved shards as a
// checkpoint reader finds it (at the offset its index record gives), as ckpt-verify does
// (through its HDF5 header: Locate by header, Verify) and as a reader without an index
// offset does (verified and raw reads, whole and in part), and every chunk the input's own
// index lists, as a lone shard is read.
//
// The replay build (fuzz_replay_shard, CTest) also runs the whole path on disk: the input
// as the shard of each saved checkpoint, under a metadata.json giving its size, through
// ops::Verify, CheckpointReader (everything read), a non-strict Load and ops::Source::Open
// of the lone shard: too slow for fuzzing, but every corpus input is replayed through the
// tools' own code.
//
// Property: nothing crashes, hangs or leaks, and the only exception is ckpt::Error.
#include <sys/mman.h>
#include <unistd.h>

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
#include "storage/fs.h"
#include "storage/shard_reader.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using ckpt::storage::ShardIndexEntry;
using ckpt::storage::ShardReader;

struct Target {
  fs::path dir;
  std::string shard;                     // its one shard's file name
  ordered_json metadata;                 // as saved
  std::vector<ShardIndexEntry> chunks;   // the saved shard's index: every chunk, with offsets
};

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The checkpoints every input is tried as; saved on first use.
const std::vector<Target>& Targets() {
  static const ckpt_test::TempDir root("fuzz-shard");
  static const std::vector<Target> targets = [] {
    std::vector<float> w, zero_d;
    std::vector<uint16_t> b;
    const ckpt::StateDict state = ckpt_fuzz::SampleState(w, b, zero_d);
    ckpt::SingleComm comm;
    std::vector<Target> out;
    for (const char* kind : {"packed", "unpacked", "zstd"}) {
      ckpt::SaveOptions options;
      if (std::string(kind) == "unpacked") options.pack_bytes = 0;
      if (std::string(kind) == "zstd") options.compression.codec = ckpt::Compression::Codec::kZstd;
      Target t;
      t.dir = root / kind;
      ckpt::Save(t.dir, state, comm, options);
      t.metadata = ordered_json::parse(ReadAll(t.dir / ckpt::kMetadataFileName));
      t.shard = t.metadata.at("files").at(0).at("name").get<std::string>();
      t.chunks = ShardReader(t.dir, t.shard).Index().entries;
      if (t.chunks.empty()) ckpt_fuzz::Fail(std::string("the ") + kind + " shard's index lists no chunk");
      // The harness reaches real reads: every chunk of the good shard reads and verifies
      // through its HDF5 header (no index offset), so the header checks accept what Save writes.
      ShardReader good(t.dir, t.shard, /*use_index=*/false);
      std::vector<uint8_t> buf;
      for (ShardIndexEntry e : t.chunks) {
        e.chunk.offset.reset();
        const ckpt::DType dtype = e.bytes ? ckpt::DType::kUInt8 : e.dtype;
        buf.assign(ckpt_fuzz::BoundedBytes(e.chunk.box, dtype) + 1, 0);
        try {
          (void)good.Read(e.key, dtype, e.chunk, e.chunk.box, buf.data(), e.chunk.box, /*verify=*/true);
        } catch (const ckpt::Error& err) {
          ckpt_fuzz::Fail(std::string("the ") + kind + " shard does not read back: " + err.what());
        }
      }
      if (const char* seed = std::getenv("CKPT_FUZZ_SHARD_SEED"))
        fs::copy_file(t.dir / t.shard, fs::path(seed) / (std::string(kind) + ".h5"),
                      fs::copy_options::overwrite_existing);
      out.push_back(std::move(t));
    }
    return out;
  }();
  return targets;
}

// The memfd every input is written into.
int InputFd() {
  static const int fd = [] {
    const int got = ::memfd_create("fuzz-shard", MFD_CLOEXEC);
    if (got < 0) ckpt_fuzz::Fail("memfd_create failed");
    return got;
  }();
  return fd;
}

void PutInput(const uint8_t* data, std::size_t size) {
  const int fd = InputFd();
  if (::ftruncate(fd, 0) != 0) ckpt_fuzz::Fail("ftruncate of the memfd failed");
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) ckpt_fuzz::Fail("pwrite to the memfd failed");
    done += static_cast<std::size_t>(n);
  }
}

std::unique_ptr<ShardReader> OpenInput(const std::string& name, bool use_index) {
  const int fd = ::dup(InputFd());
  if (fd < 0) ckpt_fuzz::Fail("dup of the memfd failed");
  try {
    return std::make_unique<ShardReader>(ckpt::storage::Fd(fd), name, use_index, /*in_memory=*/true);
  } catch (const ckpt::Error&) {
    return nullptr;
  }
}

// Each way a reader reaches one chunk; errors swallowed, each call on its own.
void ReadChunk(ShardReader& r, const ShardIndexEntry& e, std::vector<uint8_t>& buf) {
  const ckpt::DType dtype = e.bytes ? ckpt::DType::kUInt8 : e.dtype;
  const ckpt::ChunkMeta& c = e.chunk;
  const std::size_t bytes = ckpt_fuzz::BoundedBytes(c.box, dtype);
  if (bytes == 0 && c.box.NumElements() != 0) return;
  buf.assign(bytes + 1, 0);
  auto attempt = [](auto&& f) {
    try {
      f();
    } catch (const ckpt::Error&) {
    }
  };
  attempt([&] { (void)r.Locate(e.key, dtype, c, /*by_header=*/true); });
  attempt([&] { (void)r.Locate(e.key, dtype, c); });
  attempt([&] { (void)r.Read(e.key, dtype, c, c.box, buf.data(), c.box, /*verify=*/true); });
  attempt([&] { (void)r.Read(e.key, dtype, c, c.box, buf.data(), c.box, /*verify=*/false); });
  attempt([&] { (void)r.Verify(e.key, dtype, c); });
  if (!c.box.sizes.empty() && c.box.sizes[0] > 1) {  // the first row: a partial read
    ckpt::Box part = c.box;
    part.sizes[0] = 1;
    attempt([&] { (void)r.Read(e.key, dtype, c, part, buf.data(), part, /*verify=*/true); });
  }
}

// One reader of the input (one HDF5 open: most of an input's cost) serves every target's
// chunks. Located through HDF5 (no index fast path), as ckpt-verify and a lone shard read.
void ReadInMemory(const std::vector<Target>& targets) {
  auto r = OpenInput("shard-00000-of-00001.h5", /*use_index=*/false);
  if (!r) return;
  std::vector<uint8_t> buf;
  (void)r->IndexText();
  (void)r->ForeignLinks(4);
  // A checkpoint reader: the chunks as the saved index gives them (offsets trusted once the
  // index digest matched), and as a reader that must find each through HDF5.
  for (const Target& t : targets) {
    for (ShardIndexEntry e : t.chunks) {
      ReadChunk(*r, e, buf);
      e.chunk.offset.reset();  // (a packed chunk then through its pack's HDF5 header)
      ReadChunk(*r, e, buf);
    }
  }
  // A lone shard: the chunks its own index lists.
  std::vector<ShardIndexEntry> own;
  try {
    own = r->Index().entries;
  } catch (const ckpt::Error&) {
  }
  for (const ShardIndexEntry& e : own) ReadChunk(*r, e, buf);
}

#ifdef CKPT_FUZZ_REPLAY
void WriteAll(const fs::path& p, const void* data, std::size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out.flush()) ckpt_fuzz::Fail("cannot write " + p.string());
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

// The input as the shard of `t` on disk, through the tools' own entry points.
void ReadOnDisk(const Target& t, const uint8_t* data, size_t size) {
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
    return;
  }
  ckpt_fuzz::ReadEverything(*reader);
  try {
    ckpt_fuzz::LoadEverything(t.dir, reader->metadata());
  } catch (const ckpt::Error&) {
  }
  reader.reset();
  ReadLoneShard(t.dir / t.shard);
}
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<Target>& targets = Targets();
  PutInput(data, size);
  ReadInMemory(targets);
#ifdef CKPT_FUZZ_REPLAY
  for (const Target& t : targets) ReadOnDisk(t, data, size);
#endif
  return 0;
}
