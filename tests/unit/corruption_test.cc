// Bad input on load: each kind of damage gets a clear ckpt::Error naming the file and
// key, never a crash or a silent wrong answer.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <sys/stat.h>

#include "ckpt/ckpt.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ckpt;
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
      Save(dir, sd, comm);
    });
  }

  json Meta() const {
    std::ifstream in(dir / "metadata.json");
    return json::parse(in);
  }
  void WriteMeta(const json& j) const { std::ofstream(dir / "metadata.json") << j.dump(); }
  void WriteMetaText(const std::string& s) const { std::ofstream(dir / "metadata.json") << s; }

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

TEST_CASE("an intact checkpoint loads") {
  Fixture f;
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
    const std::string old = m["files"][0]["name"];
    m["files"][0]["name"] = bad;
    for (auto& c : m["entries"]["model.w"]["chunks"]) {
      if (c["file"] == old) c["file"] = bad;
    }
    f.WriteMeta(m);
    ErrorCode code{};
    const std::string e = f.LoadError(&code);
    CAPTURE(bad);
    CHECK(code == ErrorCode::kCorrupt);
    CHECK(Has(e, "not a plain file name"));
  }
}

TEST_CASE("overlapping, gapped and out-of-bounds chunks in metadata are rejected") {
  SUBCASE("overlap") {
    Fixture f;
    json m = f.Meta();
    m["entries"]["model.w"]["chunks"][1]["offsets"] = {2, 0};
    f.WriteMeta(m);
    CHECK(Has(f.LoadError(), "overlap"));
  }
  SUBCASE("gap") {
    Fixture f;
    json m = f.Meta();
    m["entries"]["model.w"]["chunks"].erase(1);
    f.WriteMeta(m);
    const std::string e = f.LoadError();
    CHECK(Has(e, "gap"));
    CHECK(Has(e, "model.w"));
    // A reader refuses it on open, before any read (FORMAT.md §8.5).
    CHECK_THROWS_WITH_AS(CheckpointReader::Open(f.dir), doctest::Contains("a gap"), Error);
  }
  SUBCASE("out of bounds") {
    Fixture f;
    json m = f.Meta();
    m["entries"]["model.w"]["chunks"][1]["offsets"] = {6, 0};
    f.WriteMeta(m);
    CHECK(Has(f.LoadError(), "outside shape"));
  }
  SUBCASE("sizes that lie about the dataset") {
    Fixture f;
    json m = f.Meta();
    m["entries"]["model.w"]["shape"] = {8, 32};
    m["entries"]["model.w"]["chunks"][0]["sizes"] = {4, 32};
    m["entries"]["model.w"]["chunks"][1]["sizes"] = {4, 32};
    f.WriteMeta(m);
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
    Fixture f;
    json m = f.Meta();
    m["entries"]["model.w"]["dtype"] = "int32";
    f.WriteMeta(m);
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
  const std::string good = f.Meta().dump();
  SUBCASE("duplicate key") {
    std::string dup = good;
    dup.insert(1, R"("format": "ckpt",)");
    f.WriteMetaText(dup);
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
    m["format_version"] = 2;
    f.WriteMeta(m);
    ErrorCode code{};
    const std::string e = f.LoadError(&code);
    CHECK(code == ErrorCode::kUnsupported);
    CHECK(Has(e, "format_version 2 is newer than this library supports (1)"));
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
