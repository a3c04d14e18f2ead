// Bad input on load: each kind of damage gets a clear ckpt::Error naming the file and
// key, never a crash or a silent wrong answer.
//
// Format v2 puts a digest on metadata.json and on every shard index. A lie in one of them
// alone is a digest mismatch; the cases that make metadata lie about the data recompute the
// digests (tests/ckpt_edit.h), as a buggy writer would, so that the check behind the digest
// (file names, tiling, dataset shape and type, checksums) is what they test.
#include <doctest/doctest.h>

#include <array>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <sys/stat.h>

#include "ckpt/ckpt.h"
#include "ckpt/verify.h"
#include "ckpt_edit.h"
#include "storage/shard_reader.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ckpt;
using ckpt_test::Digests;
using ckpt_test::TempDir;
using json = nlohmann::json;

namespace {

// A 2-rank checkpoint of one 8x16 float32 tensor (row shards) and a scalar.
struct Fixture {
  TempDir tmp{"bad"};
  fs::path dir = tmp / "ck";
  std::vector<float> values = [] {
    std::vector<float> v(128);
    for (int i = 0; i < 128; ++i) v[i] = static_cast<float>(i);
    return v;
  }();

  Fixture() {
    RunThreads(2, [&](Comm& comm) {
      StateDict sd;
      sd.Add("model.w", Tensor::Slice(DType::kFloat32, {8, 16}, 0, comm.rank() * 4, 4, values.data() + comm.rank() * 64));
      sd.Add("step", Scalar::Int(5));
      // A dataset a chunk: the cases below damage a chunk's own dataset and its record
      // (packed chunks: tests/unit/pack_test.cc).
      SaveOptions opt;
      opt.pack_bytes = 0;
      Save(dir, sd, comm, opt);
    });
  }

  json Meta() const { return ckpt_test::ReadMetaJson(dir); }
  // Digest recomputed unless told otherwise.
  void WriteMeta(const json& j, Digests d = Digests::kRecompute) const { ckpt_test::WriteMetaJson(dir, j, d); }
  void WriteMetaText(const std::string& s) const { ckpt_test::WriteMetaText(dir, s); }
  std::string Shard(int i) const { return "shard-0000" + std::to_string(i) + "-of-00002.h5"; }
  json Index(int i) const { return ckpt_test::ReadIndexJson(dir / Shard(i)); }
  // `edit` applied to the index record of model.w in each shard, digests recomputed.
  template <typename Edit>
  void EditRecords(Edit edit, Digests d = Digests::kRecompute) const {
    for (int i = 0; i < 2; ++i) {
      json index = Index(i);
      for (auto& r : index["chunks"]) {
        if (r["key"] == "model.w") edit(r);
      }
      ckpt_test::WriteIndexJson(dir, i, index, d);
    }
  }
  // model.w's layout replaced by an explicit chunk list of (row offset, rows, file).
  void ExplicitRows(const std::vector<std::array<int, 3>>& rows) const {
    json m = Meta();
    json chunks = json::array();
    for (const auto& r : rows) chunks.push_back({{"offsets", {r[0], 0}}, {"sizes", {r[1], 16}}, {"file", r[2]}});
    m["entries"]["model.w"]["layout"] = {{"chunks", chunks}};
    WriteMeta(m);
  }

  // Loads the whole tensor into one rank; returns the error message ("" if it loaded).
  std::string LoadError(ErrorCode* code = nullptr) const {
    std::vector<float> out(128);
    StateDict sd;
    sd.Add("model.w", Tensor::Full(DType::kFloat32, {8, 16}, out.data()));
    sd.Add("step", Scalar{});
    SingleComm comm;
    try {
      Load(dir, sd, comm);
    } catch (const Error& e) {
      if (code) *code = e.code();
      return e.what();
    }
    CHECK(out == values);
    return "";
  }

  // Offset of chunk 1's data inside shard 1 (found by searching its known bytes).
  std::streamoff DataOffset(const fs::path& file) const {
    std::ifstream in(file, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string bytes = ss.str();
    const std::string needle(reinterpret_cast<const char*>(values.data() + 64), 64 * sizeof(float));
    const auto pos = bytes.find(needle);
    REQUIRE(pos != std::string::npos);
    return static_cast<std::streamoff>(pos);
  }
};

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("an intact checkpoint loads, also after ckpt_edit rewrote it with the digests recomputed") {
  Fixture f;
  CHECK(f.LoadError() == "");
  f.WriteMeta(f.Meta());
  f.EditRecords([](json&) {});
  CHECK(f.LoadError() == "");
}

TEST_CASE("a flipped data byte is a checksum error naming the file and key") {
  Fixture f;
  const fs::path shard = f.dir / "shard-00001-of-00002.h5";
  const auto off = f.DataOffset(shard) + 100;
  std::fstream io(shard, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(off);
  char c;
  io.get(c);
  io.seekp(off);
  io.put(static_cast<char>(c ^ 0x01));
  io.close();
  ErrorCode code{};
  const std::string e = f.LoadError(&code);
  CHECK(code == ErrorCode::kCorrupt);
  CHECK(Has(e, "checksum mismatch"));
  CHECK(Has(e, "model.w"));
  CHECK(Has(e, "shard-00001-of-00002.h5"));
}

TEST_CASE("a truncated shard is an error naming the file") {
  Fixture f;
  const fs::path shard = f.dir / "shard-00001-of-00002.h5";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  const std::string e = f.LoadError();
  CHECK(Has(e, "shard-00001-of-00002.h5"));
  CHECK_FALSE(e.empty());
}

TEST_CASE("a missing shard file is an error naming the file") {
  Fixture f;
  fs::remove(f.dir / "shard-00000-of-00002.h5");
  ErrorCode code{};
  const std::string e = f.LoadError(&code);
  CHECK(code == ErrorCode::kNotFound);
  CHECK(Has(e, "shard-00000-of-00002.h5"));
}

TEST_CASE("a shard replaced by a symlink or a FIFO is refused") {
  Fixture f;
  const fs::path shard = f.dir / "shard-00000-of-00002.h5";
  fs::rename(shard, f.tmp / "elsewhere.h5");
  fs::create_symlink(f.tmp / "elsewhere.h5", shard);
  CHECK(Has(f.LoadError(), "symbolic link"));
  fs::remove(shard);
  REQUIRE(::mkfifo(shard.c_str(), 0600) == 0);
  CHECK(Has(f.LoadError(), "not a regular file"));
}

TEST_CASE("file names that escape the directory are rejected") {
  for (const std::string bad : {"../outside.h5", "/etc/passwd", "sub/dir.h5", ".."}) {
    Fixture f;
    json m = f.Meta();
    m["files"][0]["name"] = bad;  // v2 layouts refer to files by position
    f.WriteMeta(m);
    ErrorCode code{};
    const std::string e = f.LoadError(&code);
    CAPTURE(bad);
    CHECK(code == ErrorCode::kCorrupt);
    CHECK(Has(e, "not a plain file name"));
  }
}

TEST_CASE("a change to metadata.json or a shard index alone is a digest mismatch") {
  // Edits of the exact text (a rewrite by a JSON library would change more than the lie).
  auto edit_text = [](const Fixture& f, const std::string& from, const std::string& to) {
    std::string text = ckpt_test::ReadText(f.dir / "metadata.json");
    const auto at = text.find(from);
    REQUIRE_MESSAGE(at != std::string::npos, from << " not in " << text);
    f.WriteMetaText(text.replace(at, from.size(), to));
  };
  SUBCASE("metadata.json: a file name") {
    Fixture f;
    edit_text(f, "\"shard-00000-of-00002.h5\"", "\"../outside.h5\"");
    ErrorCode code{};
    const std::string e = f.LoadError(&code);
    CHECK(code == ErrorCode::kCorrupt);
    CHECK(Has(e, "digest mismatch"));
    CHECK(Has(e, "metadata.json"));
  }
  SUBCASE("metadata.json: the scalar's value") {
    Fixture f;
    edit_text(f, "\"value\":5", "\"value\":4");
    CHECK(Has(f.LoadError(), "digest mismatch"));
  }
  SUBCASE("a shard index: a chunk's offset, edited in the exact text") {
    Fixture f;
    std::string text = ckpt_test::ReadIndexText(f.dir / f.Shard(1));
    const auto at = text.find("\"offset\":");
    REQUIRE(at != std::string::npos);
    const auto end = text.find_first_not_of("0123456789", at + 9);
    const uint64_t offset = std::stoull(text.substr(at + 9, end - at - 9));
    text.replace(at + 9, end - at - 9, std::to_string(offset + 4));
    ckpt_test::WriteIndexText(f.dir, 1, text, Digests::kKeepStale);
    ErrorCode code{};
    const std::string e = f.LoadError(&code);
    CHECK(code == ErrorCode::kCorrupt);
    CHECK(Has(e, "digest"));
    CHECK(Has(e, "shard-0000"));
  }
}

TEST_CASE("a shard index that lies about where a chunk's bytes are, digests recomputed") {
  // 4 bytes early: still inside the file (the data ends the shard). A reader that locates
  // the chunk by its record reads bytes that fail their block digest; one that locates it
  // through HDF5 reads the right ones. Either is fine; a silent wrong answer is not
  // (LoadError checks the values when the load succeeds).
  Fixture f;
  f.EditRecords([](json& r) { r["offset"] = r["offset"].get<uint64_t>() - 4; });
  ErrorCode code{};
  const std::string e = f.LoadError(&code);
  if (!e.empty()) {
    CHECK(code == ErrorCode::kCorrupt);
    CHECK(Has(e, "model.w"));
    CHECK(Has(e, "block"));
  }
}

TEST_CASE("overlapping, gapped and out-of-bounds chunks in metadata are rejected") {
  // A grid cannot overlap or leave a gap: an explicit layout can.
  SUBCASE("the intact layout as an explicit list loads") {
    Fixture f;
    f.ExplicitRows({{0, 4, 0}, {4, 4, 1}});
    CHECK(f.LoadError() == "");
  }
  SUBCASE("overlap") {
    Fixture f;
    f.ExplicitRows({{0, 4, 0}, {2, 4, 1}});
    CHECK(Has(f.LoadError(), "overlap"));
  }
  SUBCASE("gap") {
    Fixture f;
    f.ExplicitRows({{0, 4, 0}});
    const std::string e = f.LoadError();
    CHECK(Has(e, "gap"));
    CHECK(Has(e, "model.w"));
    // A reader refuses it on open, before any read (FORMAT.md §8.5).
    CHECK_THROWS_WITH_AS(CheckpointReader::Open(f.dir), doctest::Contains("a gap"), Error);
  }
  SUBCASE("out of bounds") {
    Fixture f;
    f.ExplicitRows({{0, 4, 0}, {6, 4, 1}});
    CHECK(Has(f.LoadError(), "outside shape"));
  }
  SUBCASE("a chunk in a file the index of which does not hold it") {
    Fixture f;
    f.ExplicitRows({{0, 4, 0}, {4, 4, 0}});
    const std::string e = f.LoadError();
    CHECK(Has(e, "model.w"));
    CHECK(Has(e, "shard-00000-of-00002.h5"));
  }
  SUBCASE("sizes that lie about the dataset") {
    // The layout and both index records say [4, 32]; the datasets hold [4, 16]. Read by
    // offset, the chunk's bytes fail their block digests; read through HDF5 (no offset
    // recorded), the dataset's shape is checked.
    Fixture f;
    json m = f.Meta();
    m["entries"]["model.w"]["shape"] = {8, 32};
    m["entries"]["model.w"]["layout"]["grid"][1] = {{"step", 32}};
    f.WriteMeta(m);
    f.EditRecords([](json& r) {
      r["shape"] = {8, 32};
      r["sizes"] = {4, 32};
      r["stored_bytes"] = 512;  // consistent with the lie: else the index itself is refused
      r.erase("offset");
    });
    std::vector<float> out(256);
    StateDict sd;
    sd.Add("model.w", Tensor::Full(DType::kFloat32, {8, 32}, out.data()));
    SingleComm comm;
    LoadOptions lo;
    lo.strict = false;
    CHECK_THROWS_WITH_AS(Load(f.dir, sd, comm, lo), doctest::Contains("dataset has shape [4, 16], metadata says [4, 32]"),
                         Error);
  }
  SUBCASE("a dtype lie") {
    // As above: the HDF5 dataset's type is what the lie contradicts.
    Fixture f;
    json m = f.Meta();
    m["entries"]["model.w"]["dtype"] = "int32";
    m["entries"]["model.w"].erase("stats");
    f.WriteMeta(m);
    f.EditRecords([](json& r) {
      r["dtype"] = "int32";
      r.erase("offset");
    });
    std::vector<int32_t> out(128);
    StateDict sd;
    sd.Add("model.w", Tensor::Full(DType::kInt32, {8, 16}, out.data()));
    SingleComm comm;
    LoadOptions lo;
    lo.strict = false;
    CHECK_THROWS_WITH_AS(Load(f.dir, sd, comm, lo), doctest::Contains("does not match dtype int32"), Error);
  }
}

TEST_CASE("absurd shapes overflow-checked, never allocated") {
  Fixture f;
  json m = f.Meta();
  m["entries"]["model.w"]["shape"] = {4611686018427387904LL, 4};
  f.WriteMeta(m);
  const std::string e = f.LoadError();
  CHECK(Has(e, "64 bits"));
  CHECK(Has(e, "model.w"));
}

TEST_CASE("metadata that is not valid: duplicate keys, deep nesting, newer version, garbage") {
  Fixture f;
  const std::string good = ckpt_test::ReadText(f.dir / "metadata.json");
  SUBCASE("duplicate key") {
    std::string dup = good;
    dup.insert(1, R"("format": "ckpt",)");
    f.WriteMetaText(ckpt_test::Redigest(dup));
    CHECK(Has(f.LoadError(), "duplicate key 'format'"));
  }
  SUBCASE("deep nesting") {
    json m = f.Meta();
    std::string deep(200, '[');
    deep += std::string(200, ']');
    m["user"] = json::parse(deep);
    f.WriteMeta(m);
    CHECK(Has(f.LoadError(), "nesting"));
  }
  SUBCASE("newer format version") {
    json m = f.Meta();
    m["format_version"] = 3;
    f.WriteMeta(m);
    ErrorCode code{};
    const std::string e = f.LoadError(&code);
    CHECK(code == ErrorCode::kUnsupported);
    CHECK(Has(e, "format_version 3 is newer than this library supports (2)"));
  }
  SUBCASE("not JSON") {
    f.WriteMetaText("{\"format\": \"ckpt\", ");
    CHECK(Has(f.LoadError(), "invalid JSON"));
  }
  SUBCASE("unknown dtype") {
    json m = f.Meta();
    m["entries"]["model.w"]["dtype"] = "complex128";
    f.WriteMeta(m);
    CHECK(Has(f.LoadError(), "unknown dtype 'complex128'"));
  }
  SUBCASE("no metadata.json: not a checkpoint") {
    fs::remove(f.dir / "metadata.json");
    ErrorCode code{};
    CHECK(Has(f.LoadError(&code), "not a checkpoint"));
    CHECK(code == ErrorCode::kNotFound);
  }
}

TEST_CASE("a shard that is not HDF5 at all") {
  Fixture f;
  std::ofstream(f.dir / "shard-00000-of-00002.h5", std::ios::trunc) << std::string(4096, 'x');
  const std::string e = f.LoadError();
  CHECK(Has(e, "shard-00000-of-00002.h5"));
  CHECK(Has(e, "not a readable HDF5 file"));
}

TEST_CASE("VerifyCheckpoint beside a load's reader of the same shard: each takes HDF5's evict-on-close setting the file has") {
  TempDir tmp("ve");
  const fs::path dir = tmp.path() / "c";
  std::vector<float> w(24, 1.5f);
  {
    StateDict sd;
    sd.Add("w", Tensor::Full(DType::kFloat32, {6, 4}, w.data()));
    SingleComm comm;
    Save(dir, sd, comm);
  }
  const std::string name = ReadMetadata(dir).files[0].name;
  {
    storage::ShardReader held(dir, name);  // a load's reader, default settings, kept open
    for (bool quick : {false, true}) {
      CheckOptions o;
      o.quick = quick;
      const VerifyReport r = VerifyCheckpoint(dir, o);
      INFO((r.ok() ? std::string() : r.problems[0].message));
      CHECK(r.ok());
    }
    CHECK(!storage::ShardReader(dir, name, /*use_index=*/false, /*evict_on_close=*/true).IndexText().empty());
  }
  {
    storage::ShardReader evicting(dir, name, /*use_index=*/false, /*evict_on_close=*/true);  // verify's
    storage::ShardReader plain(dir, name);  // a load meanwhile
    CHECK(!plain.Index().entries.empty());
  }
}
