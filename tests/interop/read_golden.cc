// read_golden: libckpt reads checkpoints it did not write in this build, and must get back
// exactly what their writer meant: those an independent writer (write_golden.py: h5py and
// numpy, per schemas/FORMAT.md) produced, and the v1 golden checkpoints of tests/golden/v1
// (written by the v1 library). For every case under <dir> (a <case>/ checkpoint beside
// <case>.expected/, the manifest format of write_corpus.cc), or only the named cases:
//   - CheckpointReader: every tensor read whole (ReadRegion, checksums verified), a column
//     slice of it (a partial read of every chunk), and every chunk (ReadChunk); every bytes
//     entry; equal to the expected raw files;
//   - ckpt::Load on (saved world size + 1) thread ranks into another layout (uneven dim-0
//     rows), and on 1 rank into full tensors, with scalars, bytes and JSON entries; values
//     equal, report clean. A LOCAL checkpoint (FORMAT.md §8.6) loads as LOCAL on its own
//     world size into the layout that saved it (uneven dim-0 rows), and a load on another
//     world size must fail with kMismatch.
// Exit 0 when everything matched, 1 with one line per problem otherwise.
//
// Usage: ckpt-interop-read-golden <dir> [<case>...]
#include <ckpt/ckpt.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "interop_util.h"

namespace fs = std::filesystem;
using ckpt_interop::ExtractBox;
using ckpt_interop::ReadFile;

namespace {

std::vector<std::string> g_problems;
std::mutex g_mu;

void Problem(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_problems.push_back(what);
}

struct Expected {
  std::string key;
  ckpt::DType dtype;
  ckpt::Shape shape;
  std::vector<uint8_t> data;
};

struct Manifest {
  int world_size = 1;
  bool local = false;  // state_dict_type LOCAL
  std::vector<Expected> tensors;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> blobs;
  nlohmann::json scalars, jsons;
};

Manifest ReadManifest(const fs::path& exp) {
  const auto text = ReadFile(exp / "manifest.json");
  const auto m = nlohmann::json::parse(text.begin(), text.end());
  Manifest out;
  out.world_size = m.at("world_size").get<int>();
  out.local = m.at("state_dict_type").get<std::string>() == "LOCAL";
  for (const auto& t : m.at("tensors")) {
    auto dtype = ckpt::DTypeFromName(t.at("dtype").get<std::string>());
    if (!dtype) throw std::runtime_error("manifest: unknown dtype " + t.at("dtype").dump());
    out.tensors.push_back({t.at("key"), *dtype, t.at("shape").get<ckpt::Shape>(),
                           ReadFile(exp / t.at("raw").get<std::string>())});
  }
  for (const auto& b : m.at("bytes")) out.blobs.emplace_back(b.at("key"), ReadFile(exp / b.at("raw").get<std::string>()));
  out.scalars = m.at("scalars");
  out.jsons = m.at("json");
  return out;
}

// The reader API: whole tensors, single chunks, blobs.
void CheckReader(const std::string& name, const fs::path& dir, const Manifest& man) {
  auto reader = ckpt::CheckpointReader::Open(dir);
  const ckpt::Metadata& meta = reader->metadata();
  for (const Expected& t : man.tensors) {
    const std::string where = name + ": tensor '" + t.key + "'";
    const ckpt::EntryMeta* e = meta.Find(t.key);
    if (e == nullptr || e->kind != ckpt::EntryKind::kTensor || e->dtype != t.dtype || e->shape != t.shape) {
      Problem(where + ": not in the metadata as written");
      continue;
    }
    if (e->chunks.empty()) {
      Problem(where + ": the reader lists no chunk (every tensor has at least one)");
      continue;
    }
    const std::size_t item = ckpt::DTypeSize(t.dtype);
    // Reads `box` (one byte past it must stay untouched) by `read`, compares it with the expected values.
    auto check = [&](const ckpt::Box& box, const std::string& what, auto read) {
      std::vector<uint8_t> got(static_cast<std::size_t>(box.NumElements()) * item + 1, 0xA5);
      read(got.data());
      if (got.back() != 0xA5) Problem(where + ": " + what + " writes past its region");
      got.pop_back();
      if (got != ExtractBox(t.data, t.shape, box, item)) Problem(where + ": " + what + " differs from the expected values");
    };
    const ckpt::Box full = ckpt::Box::Full(t.shape);
    check(full, "ReadRegion of the whole tensor", [&](void* out) { reader->ReadRegion(t.key, full, out); });
    if (t.shape.size() >= 2 && t.shape.back() > 2) {
      // A strided column slice: a partial, verified read of every chunk it meets.
      ckpt::Box cols = full;
      cols.offsets.back() = 1;
      cols.sizes.back() = t.shape.back() - 2;
      check(cols, "ReadRegion " + cols.ToString(), [&](void* out) { reader->ReadRegion(t.key, cols, out); });
    }
    for (std::size_t c = 0; c < e->chunks.size(); ++c)
      check(e->chunks[c].box, "ReadChunk " + e->chunks[c].box.ToString(),
            [&](void* out) { reader->ReadChunk(t.key, c, out); });
  }
  for (const auto& [key, blob] : man.blobs) {
    if (reader->ReadBytes(key) != blob) Problem(name + ": bytes '" + key + "' differ from the expected values");
  }
}

// Collective Load into `world` ranks, each wanting uneven dim-0 rows of every tensor.
void CheckLoad(const std::string& name, const fs::path& dir, const Manifest& man, int world) {
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    const int rank = comm.rank();
    std::vector<std::vector<uint8_t>> buffers;
    buffers.reserve(man.tensors.size() + 1);
    std::vector<std::pair<const Expected*, ckpt::Box>> wanted;
    ckpt::StateDict state;
    for (const Expected& t : man.tensors) {
      std::vector<ckpt::Chunk> chunks;
      ckpt::Box box = ckpt::Box::Full(t.shape);
      if (!t.shape.empty() && world > 1) {
        auto [begin, count] = ckpt_interop::UnevenSplit(t.shape[0], world)[static_cast<std::size_t>(rank)];
        box.offsets[0] = begin;
        box.sizes[0] = count;
      }
      if (box.NumElements() > 0 || t.shape.empty() || world == 1) {
        buffers.emplace_back(static_cast<std::size_t>(box.NumElements()) * ckpt::DTypeSize(t.dtype) + 1, 0xA5);
        chunks.push_back({box, buffers.back().data()});
        wanted.emplace_back(&t, box);
      }
      state.Add(t.key, ckpt::Tensor::Sharded(t.dtype, t.shape, std::move(chunks)));
    }
    for (const auto& s : man.scalars) {
      const auto dtype = *ckpt::DTypeFromName(s.at("dtype").get<std::string>());
      state.Add(s.at("key"), ckpt::IsFloating(dtype) ? ckpt::Scalar::Float(0, dtype) : ckpt::Scalar::Int(0, dtype));
    }
    for (const auto& [key, blob] : man.blobs) state.Add(key, ckpt::Bytes{});
    for (const auto& j : man.jsons) state.Add(j.at("key"), ckpt::Json{});

    ckpt::LoadOptions options;
    if (man.local) options.state_dict_type = ckpt::StateDictType::kLocal;
    const ckpt::LoadReport report = ckpt::Load(dir, state, comm, options);
    const std::string where = name + " (Load on " + std::to_string(world) + " ranks, rank " + std::to_string(rank) + ")";
    if (!report.ok()) Problem(where + ": the load report lists missing, unexpected or mismatched keys");
    std::size_t b = 0;
    for (const auto& [t, box] : wanted) {
      std::vector<uint8_t>& got = buffers[b++];
      got.pop_back();
      if (got != ExtractBox(t->data, t->shape, box, ckpt::DTypeSize(t->dtype)))
        Problem(where + ": tensor '" + t->key + "' region " + box.ToString() + " differs from the expected values");
    }
    for (const auto& s : man.scalars) {
      const auto& v = std::get<ckpt::Scalar>(state.At(s.at("key").get<std::string>()));
      const bool same = s.at("value").is_number_float() ? v.AsDouble() == s.at("value").get<double>()
                                                         : v.AsInt() == s.at("value").get<int64_t>();
      if (!same) Problem(where + ": scalar '" + s.at("key").get<std::string>() + "' differs");
    }
    for (const auto& [key, blob] : man.blobs) {
      if (std::get<ckpt::Bytes>(state.At(key)).data != blob) Problem(where + ": bytes '" + key + "' differ");
    }
    for (const auto& j : man.jsons) {
      const std::string& text = std::get<ckpt::Json>(state.At(j.at("key").get<std::string>())).text;
      if (nlohmann::json::parse(text) != j.at("value")) Problem(where + ": json '" + j.at("key").get<std::string>() + "' differs");
    }
  });
}

// A LOCAL checkpoint loaded on another world size is refused (FORMAT.md §8.6).
void CheckLocalRefused(const std::string& name, const fs::path& dir, const Manifest& man, int world) {
  bool refused = true;
  std::mutex mu;
  ckpt::RunThreads(world, [&](ckpt::Comm& comm) {
    ckpt::StateDict state;
    for (const Expected& t : man.tensors) state.Add(t.key, ckpt::Tensor::Sharded(t.dtype, t.shape, {}));
    ckpt::LoadOptions options;
    options.state_dict_type = ckpt::StateDictType::kLocal;
    options.strict = false;
    try {
      ckpt::Load(dir, state, comm, options);
    } catch (const ckpt::Error& e) {
      if (e.code() == ckpt::ErrorCode::kMismatch) return;
    }
    std::lock_guard<std::mutex> lock(mu);
    refused = false;
  });
  if (!refused)
    Problem(name + ": a LOCAL checkpoint saved by " + std::to_string(man.world_size) + " ranks loaded on " +
            std::to_string(world) + " without a kMismatch error");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <dir of cases> [<case>...]\n", argv[0]);
    return 2;
  }
  int cases = 0;
  std::vector<fs::path> dirs;
  if (argc == 2) {
    for (const auto& e : fs::directory_iterator(argv[1]))
      if (e.path().extension() == ".expected") dirs.push_back(e.path());
  }
  for (int i = 2; i < argc; ++i) dirs.push_back(fs::path(argv[1]) / (std::string(argv[i]) + ".expected"));
  std::sort(dirs.begin(), dirs.end());
  for (const fs::path& exp : dirs) {
    const std::string name = exp.stem().string();
    const fs::path dir = exp.parent_path() / name;
    ++cases;
    try {
      const Manifest man = ReadManifest(exp);
      CheckReader(name, dir, man);
      if (man.local) {
        CheckLoad(name, dir, man, man.world_size);
        CheckLocalRefused(name, dir, man, man.world_size + 1);
      } else {
        CheckLoad(name, dir, man, man.world_size + 1);
        CheckLoad(name, dir, man, 1);
      }
      std::printf("read %s\n", name.c_str());
    } catch (const std::exception& e) {
      Problem(name + ": " + e.what());
    }
  }
  if (cases == 0) Problem(std::string("no cases under ") + argv[1]);
  for (const std::string& p : g_problems) std::printf("FAIL %s\n", p.c_str());
  return g_problems.empty() ? 0 : 1;
}
