// tests/tools/ops_test.cc: the tools' library (ckpt::ops) without the command line:
// casts, the schema validator, and merge / reshard / diff / verify round trips over
// checkpoints saved by libckpt (the safetensors module: safetensors_test.cc).
#include <doctest/doctest.h>
#include <hdf5.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/ckpt.h"
#include "ckpt/digest.h"
#include "ckpt/ops/diff.h"
#include "ckpt/ops/inspect.h"
#include "ckpt/ops/merge.h"
#include "ckpt/ops/safetensors.h"
#include "ckpt/ops/source.h"
#include "ckpt/ops/verify.h"
#include "ckpt_edit.h"
#include "ops/elements.h"
#include "ops/json_schema.h"
#include "ops/util.h"
#include "test_util.h"
#include "tools/hostile_shard.h"

namespace fs = std::filesystem;
using namespace ckpt;
using nlohmann::json;

namespace {

// Saves a 2-rank checkpoint: w [6, 4] float32 split by rows, b [4] replicated, step scalar,
// rng bytes, config json. Its tensor chunks packed (FORMAT.md §5.7) unless `pack_bytes` is 0.
void SaveSample(const fs::path& dir, float scale = 1.0f, uint64_t pack_bytes = SaveOptions{}.pack_bytes) {
  RunThreads(2, [&](Comm& comm) {
    std::vector<float> w(12), b(4);
    for (int i = 0; i < 12; ++i) w[i] = scale * static_cast<float>(comm.rank() * 12 + i) * 0.5f;
    for (int i = 0; i < 4; ++i) b[i] = static_cast<float>(i) - 1.5f;
    StateDict sd;
    sd.Add("model.w", Tensor::Slice(DType::kFloat32, {6, 4}, 0, comm.rank() * 3, 3, w.data()));
    sd.Add("model.b", Tensor::Full(DType::kFloat32, {4}, b.data()));
    sd.Add("step", Scalar::Int(42));
    sd.Add("rng", Bytes{{1, 2, 3, 4, 5}});
    sd.Add("config", Json{R"({"lr": 0.1})"});
    SaveOptions opt;
    opt.pack_bytes = pack_bytes;
    Save(dir, sd, comm, opt);
  });
}

std::vector<float> ReadAll(ops::Source& s, const std::string& key) {
  const EntryMeta* e = s.metadata().Find(key);
  REQUIRE(e);
  std::vector<float> v(static_cast<std::size_t>(NumElements(e->shape)));
  s.ReadRegion(key, Box::Full(e->shape), v.data());
  return v;
}

}  // namespace

TEST_CASE("casts round to nearest even and keep NaN") {
  const float in[] = {1.0f, 1.00390625f /* 1 + 2^-8: tie -> even (1.0) */, 1.01171875f /* 1+3*2^-8: tie -> up */,
                      -2.5f, NAN, INFINITY, 65504.0f, 1e6f};
  uint16_t bf[8];
  ops::detail::CastElements(DType::kFloat32, in, DType::kBFloat16, bf, 8);
  CHECK(bf[0] == 0x3f80);
  CHECK(bf[1] == 0x3f80);
  CHECK(bf[2] == 0x3f82);
  CHECK(bf[3] == 0xc020);
  CHECK((bf[4] & 0x7f80) == 0x7f80);
  CHECK((bf[4] & 0x7f) != 0);
  CHECK(bf[5] == 0x7f80);
  uint16_t h[8];
  ops::detail::CastElements(DType::kFloat32, in, DType::kFloat16, h, 8);
  CHECK(h[0] == 0x3c00);
  CHECK(h[3] == 0xc100);
  CHECK(h[5] == 0x7c00);
  CHECK(h[6] == 0x7bff);  // largest half
  CHECK(h[7] == 0x7c00);  // overflow to inf
  // Every bf16 value survives bf16 -> f32 -> bf16 and f16 -> f64 -> f16 exactly.
  for (uint32_t v = 0; v < 65536; ++v) {
    const auto x = static_cast<uint16_t>(v);
    for (DType d : {DType::kBFloat16, DType::kFloat16}) {
      double wide;
      ops::detail::CastElements(d, &x, DType::kFloat64, &wide, 1);
      uint16_t back;
      ops::detail::CastElements(DType::kFloat64, &wide, d, &back, 1);
      if (std::isnan(wide)) continue;
      REQUIRE(back == x);
    }
  }
  for (uint32_t v = 0; v < 256; ++v) {
    const auto x = static_cast<uint8_t>(v);
    for (DType d : {DType::kFloat8E4M3FN, DType::kFloat8E5M2}) {
      double wide;
      ops::detail::CastElements(d, &x, DType::kFloat64, &wide, 1);
      uint8_t back;
      ops::detail::CastElements(DType::kFloat64, &wide, d, &back, 1);
      if (std::isnan(wide)) continue;
      REQUIRE(back == x);
    }
  }
}

TEST_CASE("schema validator: the rules metadata.schema.json uses") {
  ops::detail::JsonSchema s(json::parse(R"({
    "type": "object", "required": ["a"], "additionalProperties": false,
    "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"type": "string", "pattern": "^x[0-9]+$"},
                   "c": {"type": "array", "maxItems": 2, "items": {"enum": [1, 2]}},
                   "d": {"allOf": [{"if": {"properties": {"t": {"const": "k"}}}, "then": {"required": ["v"]}}]}},
    "$defs": {"n": {"type": "integer", "minimum": 0}}})"));
  CHECK(s.Validate(json::parse(R"({"a": 3, "b": "x12", "c": [1, 2], "d": {"t": "k", "v": 1}})")).empty());
  const auto errs = s.Validate(json::parse(R"({"a": -1, "b": "y", "c": [1, 3, 2], "d": {"t": "k"}, "e": 0})"));
  CHECK(errs.size() == 6);
  const auto missing = s.Validate(json::parse(R"({})"));
  REQUIRE(missing.size() == 1);
  CHECK(missing[0].find("missing required member \"a\"") != std::string::npos);
  // The embedded schema is the real one and accepts what libckpt writes.
  ckpt_test::TempDir tmp("sc");
  SaveSample(tmp / "c");
  ops::detail::JsonSchema real(json::parse(ops::detail::EmbeddedMetadataSchema()));
  CHECK(real.Validate(json::parse(ops::detail::ReadFileText(tmp / "c" / "metadata.json"))).empty());
}

TEST_CASE("merge: FULL, reshard along dims 0 and 1, safetensors; all read back the same") {
  ckpt_test::TempDir tmp("mg");
  SaveSample(tmp / "src");
  auto src = ops::Source::Open(tmp / "src");
  const auto w = ReadAll(*src, "model.w");

  ops::MergeOptions full;
  full.max_memory = 64;  // blocks of 8 bytes: many chunks, still exact
  const auto r = ops::Merge(tmp / "src", tmp / "full", full);
  CHECK(r.tensors == 2);
  CHECK(r.other_entries == 3);
  const Metadata md = ReadMetadata(tmp / "full");
  CHECK(md.state_dict_type == StateDictType::kFull);
  CHECK(md.files.size() == 1);
  CHECK(md.Find("step")->value == "42");
  CHECK(md.Find("rng")->size == 5);
  CHECK(ops::Verify(tmp / "full", {}).ok());

  for (int dim : {0, 1}) {
    ops::MergeOptions re;
    re.world = 3;
    re.dim = dim;
    const fs::path dst = tmp / ("re" + std::to_string(dim));
    ops::Merge(tmp / "full", dst, re);
    const Metadata m = ReadMetadata(dst);
    CHECK(m.world_size == 3);
    CHECK(m.Find("model.w")->chunks.size() == (dim == 0 ? 3u : 3u));
    CHECK(ops::DescribeLayout(*m.Find("model.w"), 3) == "sharded dim " + std::to_string(dim) + " / 3");
    auto back = ops::Source::Open(dst);
    CHECK(ReadAll(*back, "model.w") == w);
    CHECK(ops::Diff(tmp / "src", dst, {}).same());
  }

  ops::MergeOptions st;
  st.exclude = {"rng"};
  ops::Merge(tmp / "src", tmp / "m.safetensors", st);
  auto sts = ops::Source::Open(tmp / "m.safetensors");
  CHECK(sts->kind() == ops::SourceKind::kSafetensors);
  CHECK(ReadAll(*sts, "model.w") == w);
  const auto d = ops::Diff(tmp / "src", tmp / "m.safetensors", {});
  CHECK(d.same());
  CHECK(d.notes.size() == 1);  // non-tensor entries not compared

  // An existing destination is kept unless forced.
  CHECK_THROWS_AS(ops::Merge(tmp / "src", tmp / "full", {}), Error);
  ops::MergeOptions force;
  force.force = true;
  force.keys = {"model.*"};
  ops::Merge(tmp / "src", tmp / "full", force);
  CHECK(ReadMetadata(tmp / "full").entries.size() == 2);
}

// Flips one byte in the middle of the stored bytes of chunk `chunk` of `key`.
void FlipStoredByte(const fs::path& dir, const std::string& key, std::size_t chunk) {
  const auto range = CheckpointReader::Open(dir)->LocateChunk(key, chunk);
  REQUIRE(range);
  std::fstream f(range->file, std::ios::in | std::ios::out | std::ios::binary);
  const auto at = static_cast<std::streamoff>(range->offset + range->length / 2);
  f.seekg(at);
  const char c = static_cast<char>(f.get());
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x10));
}

TEST_CASE("merge copies chunks file to file, bit for bit, and never launders a corrupt source") {
  ckpt_test::TempDir tmp("copy");
  SaveSample(tmp / "src");
  auto src = ops::Source::Open(tmp / "src");
  const auto w = ReadAll(*src, "model.w");
  const EntryMeta& sw = *src->metadata().Find("model.w");

  ops::MergeOptions copy;
  copy.copy_min_bytes = 0;  // the sample's tensors are tiny
  const auto r = ops::Merge(tmp / "src", tmp / "full", copy);
  CHECK(r.bytes_copied == r.bytes);
  CHECK(r.bytes_copied == (24 + 4) * sizeof(float));
  const Metadata md = ReadMetadata(tmp / "full");
  const EntryMeta& mw = *md.Find("model.w");
  REQUIRE(mw.chunks.size() == 1);  // one dataset for the whole tensor
  CHECK(ops::Diff(tmp / "src", tmp / "full", {}).same());
  CHECK(ops::Verify(tmp / "full", {}).ok());
  // Statistics recombined from the two source chunks agree with the values.
  REQUIRE(mw.chunks[0].stats);
  const ChunkStats& st = *mw.chunks[0].stats;
  CHECK(st.finite_count == 24);
  CHECK(st.min == *std::min_element(w.begin(), w.end()));
  CHECK(st.max == *std::max_element(w.begin(), w.end()));
  double sum = 0, sumsq = 0;
  for (float v : w) sum += v, sumsq += static_cast<double>(v) * v;
  CHECK(st.mean == doctest::Approx(sum / 24).epsilon(1e-12));
  CHECK(st.l2 == doctest::Approx(std::sqrt(sumsq)).epsilon(1e-12));

  // Resharding copies the parts too, reading source chunks in part (checked on their own).
  ops::MergeOptions re = copy;
  re.world = 3;
  const auto r3 = ops::Merge(tmp / "src", tmp / "re", re);
  CHECK(r3.bytes_copied == r3.bytes);
  CHECK(ReadAll(*ops::Source::Open(tmp / "re"), "model.w") == w);

  // So does a safetensors destination.
  const auto rs = ops::Merge(tmp / "src", tmp / "m.safetensors", copy);
  CHECK(rs.bytes_copied == rs.bytes);
  CHECK(ReadAll(*ops::Source::Open(tmp / "m.safetensors"), "model.w") == w);

  // Casting goes through memory.
  ops::MergeOptions cast = copy;
  cast.cast = DType::kFloat16;
  CHECK(ops::Merge(tmp / "src", tmp / "half", cast).bytes_copied == 0);

  // One flipped byte in a source chunk: every path refuses, naming the key, and writes nothing.
  FlipStoredByte(tmp / "src", "model.w", 1);
  ops::MergeOptions cast_parts = cast;
  cast_parts.world = 3;  // through memory, each source chunk read in part
  for (const auto& [name, o] : std::vector<std::pair<std::string, ops::MergeOptions>>{
           {"whole", copy}, {"parts", re}, {"memory", cast}, {"memory-parts", cast_parts}, {"st.safetensors", copy}}) {
    CAPTURE(name);
    const fs::path dst = tmp / ("bad-" + name);
    CHECK_THROWS_WITH_AS(ops::Merge(tmp / "src", dst, o), doctest::Contains("model.w"), Error);
    try {
      ops::Merge(tmp / "src", dst, o);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kCorrupt);
      CHECK(std::string(e.what()).find("checksum mismatch") != std::string::npos);
    }
    CHECK_FALSE(fs::exists(dst));
  }
  CHECK(sw.chunks.size() == 2);
}

// All problem messages of a verify report, one per line.
std::string Messages(const ops::VerifyReport& r) {
  std::string s;
  for (const auto& p : r.problems) s += p.message + "\n";
  return s;
}

TEST_CASE("verify: schema violations inside entries carry the pointer of the whole document") {
  ckpt_test::TempDir tmp("sch");
  SaveSample(tmp / "ck");
  json doc = ckpt_test::ReadMetaJson(tmp / "ck");
  doc["entries"]["model.b"]["extra"] = 1;  // not in the schema of an entry, ignored by the parser
  doc["world_size"] = 0;                   // below the minimum
  ckpt_test::WriteMetaJson(tmp / "ck", doc);  // digest recomputed: the schema is what is tested
  // Entries are validated one at a time (no tree of them), yet pointers name the document.
  const auto r = ops::Verify(tmp / "ck", {});
  const std::string m = Messages(r);
  CAPTURE(m);
  CHECK(m.find("schema: /entries/model.b") != std::string::npos);
  CHECK(m.find("schema: /world_size") != std::string::npos);
  // A schema that constrains "entries" as a whole is checked over the whole tree.
  json schema = json::parse(ops::detail::EmbeddedMetadataSchema());
  schema["properties"]["entries"]["required"] = {"model.absent"};
  {
    std::ofstream(tmp / "schema.json") << schema.dump();
  }
  ops::VerifyOptions o;
  o.schema = tmp / "schema.json";
  const std::string m2 = Messages(ops::Verify(tmp / "ck", o));
  CAPTURE(m2);
  CHECK(m2.find("schema: /entries: ") != std::string::npos);
  CHECK(m2.find("schema: /entries/model.b") != std::string::npos);
}

TEST_CASE("merge --dtype bfloat16 casts floating tensors only") {
  ckpt_test::TempDir tmp("cast");
  SaveSample(tmp / "src");
  ops::MergeOptions o;
  o.cast = DType::kBFloat16;
  ops::Merge(tmp / "src", tmp / "bf", o);
  auto s = ops::Source::Open(tmp / "bf");
  const EntryMeta* e = s->metadata().Find("model.w");
  CHECK(e->dtype == DType::kBFloat16);
  std::vector<uint16_t> v(24);
  s->ReadRegion("model.w", Box::Full(e->shape), v.data());
  CHECK(v[3] == 0x3fc0);  // 1.5
  CHECK(s->metadata().Find("step")->dtype == DType::kInt64);
}

TEST_CASE("diff: value drift, tolerance, renames, missing keys") {
  ckpt_test::TempDir tmp("df");
  SaveSample(tmp / "a");
  SaveSample(tmp / "b", 1.0001f);
  auto d = ops::Diff(tmp / "a", tmp / "b", {});
  REQUIRE(d.diffs.size() == 1);
  CHECK(d.diffs[0].what == "values");
  CHECK(d.diffs[0].key == "model.w");
  CHECK(d.diffs[0].num_different == 23);  // all but the 0
  CHECK(d.diffs[0].max_rel == doctest::Approx(1e-4).epsilon(0.01));
  // Compared on several threads (each with its own sources): the same answer.
  for (int threads : {2, 3}) {
    ops::DiffOptions par;
    par.threads = threads;
    const auto p = ops::Diff(tmp / "a", tmp / "b", par);
    REQUIRE(p.diffs.size() == 1);
    CHECK(p.diffs[0].key == "model.w");
    CHECK(p.diffs[0].num_different == 23);
    CHECK(p.diffs[0].max_rel == d.diffs[0].max_rel);
    CHECK(p.bytes_compared == d.bytes_compared);
  }
  ops::DiffOptions tol;
  tol.rtol = 2e-4;
  CHECK(ops::Diff(tmp / "a", tmp / "b", tol).same());
  ops::DiffOptions keys;
  keys.keys_only = true;
  CHECK(ops::Diff(tmp / "a", tmp / "b", keys).same());

  // Rename model.b -> model.bias, and drop rng.
  ops::MergeOptions o;
  o.exclude = {"rng", "model.b"};
  ops::Merge(tmp / "a", tmp / "c", o);
  {
    auto w = CheckpointWriter::Create(tmp / "c2", {});
    auto src = ops::Source::Open(tmp / "c");
    for (const auto& [k, e] : src->metadata().entries) {
      if (e.kind == EntryKind::kTensor) {
        std::vector<float> v(static_cast<std::size_t>(NumElements(e.shape)));
        src->ReadRegion(k, Box::Full(e.shape), v.data());
        w->WriteChunk(k, e.dtype, e.shape, Box::Full(e.shape), v.data());
      } else if (e.kind == EntryKind::kScalar) {
        w->WriteScalar(k, Scalar::Int(42));
      } else {
        w->WriteJson(k, e.value);
      }
    }
    float b[4] = {-1.5f, -0.5f, 0.5f, 1.5f};
    w->WriteChunk("model.bias", DType::kFloat32, {4}, Box::Full({4}), b);
    w->Commit();
  }
  d = ops::Diff(tmp / "a", tmp / "c2", {});
  std::map<std::string, std::string> what;
  for (const auto& x : d.diffs) what[x.key] = x.what + (x.other_key.empty() ? "" : ":" + x.other_key);
  CHECK(what["model.b"] == "renamed:model.bias");
  CHECK(what["rng"] == "only_in_a");
  CHECK(what.size() == 2);
}

TEST_CASE("diff: identical bits are the same value, NaN included; IEEE NaN under a tolerance") {
  ckpt_test::TempDir tmp("nan");
  const float quiet = NAN, other = -NAN;  // another bit pattern of NaN
  auto write = [&](const char* name, float nan) {
    auto w = CheckpointWriter::Create(tmp / name, {});
    float v[3] = {1, nan, 3};
    w->WriteChunk("x", DType::kFloat32, {3}, Box::Full({3}), v);
    double dv[2] = {nan, 2};  // another dtype takes the generic path
    w->WriteChunk("y", DType::kFloat64, {2}, Box::Full({2}), dv);
    w->Commit();
  };
  write("a", quiet);
  write("b", quiet);
  write("c", other);
  CHECK(ops::Diff(tmp / "a", tmp / "b", {}).same());
  ops::DiffOptions tol;
  tol.atol = 1e-6;
  auto d = ops::Diff(tmp / "a", tmp / "b", tol);
  REQUIRE(d.diffs.size() == 2);
  CHECK(d.diffs[0].num_different == 1);
  CHECK(d.diffs[0].num_nan == 1);
  d = ops::Diff(tmp / "a", tmp / "c", {});  // NaNs of other bits
  REQUIRE(d.diffs.size() == 2);
  CHECK(d.diffs[0].num_different == 1);
  ops::DiffOptions o;
  o.nan_equal = true;
  CHECK(ops::Diff(tmp / "a", tmp / "c", o).same());
  o.atol = 1e-6;
  CHECK(ops::Diff(tmp / "a", tmp / "b", o).same());
  ops::VerifyOptions vo;
  vo.check_finite = true;
  const auto v = ops::Verify(tmp / "a", vo);
  REQUIRE(v.problems.size() == 2);  // x and y
  CHECK(v.problems[0].check == "finite");
  vo.quick = true;  // from the recorded statistics
  CHECK(ops::Verify(tmp / "a", vo).problems.size() == 2);
}

TEST_CASE("inspect: layout, totals, statistics recorded and recomputed") {
  ckpt_test::TempDir tmp("in");
  SaveSample(tmp / "c");
  ops::InspectOptions o;
  o.stats = true;
  const auto r = ops::Inspect(tmp / "c", o);
  CHECK(r.total_keys == 5);
  CHECK(r.tensor_bytes == 24 * 4 + 16);
  std::map<std::string, ops::KeyInfo> by;
  for (const auto& k : r.keys) by[k.key] = k;
  CHECK(by["model.w"].layout == "sharded dim 0 / 2");
  CHECK(by["model.b"].layout == "replicated");
  REQUIRE(by["model.w"].stats);
  CHECK(by["model.w"].stats->max == doctest::Approx(11.5));
  CHECK(by["model.w"].stats->mean == doctest::Approx(5.75));
  CHECK(!by["model.w"].stats->recomputed);
  // The same numbers streamed from a safetensors copy (no recorded statistics).
  ops::Merge(tmp / "c", tmp / "c.safetensors", {});
  const auto s = ops::Inspect(tmp / "c.safetensors", o);
  for (const auto& k : s.keys)
    if (k.key == "model.w") {
      REQUIRE(k.stats);
      CHECK(k.stats->recomputed);
      CHECK(k.stats->mean == doctest::Approx(5.75));
      CHECK(k.stats->std == doctest::Approx(by["model.w"].stats->std));
    }
  // A missing shard is reported, not fatal.
  fs::remove(tmp / "c" / r.files[1].name);
  const auto m = ops::Inspect(tmp / "c", {});
  CHECK(m.problems.size() == 1);
  CHECK(m.keys.size() == 5);
}

namespace {

// The file offset of a dataset's data (contiguous datasets).
uint64_t DataOffset(const fs::path& file, const std::string& dataset) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  REQUIRE(f >= 0);
  const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  REQUIRE(d >= 0);
  const haddr_t at = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  REQUIRE(at != HADDR_UNDEF);
  return at;
}

void FlipByte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// Three files: chunks larger than the 1 MiB above which verify maps data (with `huge`, one
// of 34 MiB: two 32 MiB windows) split across them, small tensors, an empty tensor, bytes
// and a scalar; `zstd` stores the chunks compressed.
Metadata SaveWide(const fs::path& dir, bool zstd, bool huge = false) {
  CheckpointWriter::Options wo;
  wo.world_size = wo.num_files = 3;
  wo.state_dict_type = StateDictType::kSharded;
  if (zstd) wo.compression.codec = Compression::Codec::kZstd;
  auto w = CheckpointWriter::Create(dir, wo);
  std::vector<float> big(900 * 1000);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 977) * 0.25f;
  for (int f = 0; f < 3; ++f)
    w->WriteChunk("big", DType::kFloat32, {900, 1000}, Box{{f * 300, 0}, {300, 1000}},
                  big.data() + f * 300 * 1000, f);
  std::vector<int64_t> mid(70000);
  for (std::size_t i = 0; i < mid.size(); ++i) mid[i] = static_cast<int64_t>(i * i);
  w->WriteChunk("mid", DType::kInt64, {70000}, Box::Full({70000}), mid.data(), 1);
  for (int k = 0; k < 20; ++k) {
    std::vector<double> v(17 + k, 0.5 * k);
    w->WriteChunk("small." + std::to_string(k), DType::kFloat64, {17 + k}, Box::Full({17 + k}), v.data(), k % 3);
  }
  w->WriteChunk("empty", DType::kFloat32, {0, 4}, Box::Full({0, 4}), nullptr, 2);
  const auto blob = ckpt_test::RandomBytes(400000, 7);
  w->WriteBytes("blob", blob, 0);
  w->WriteScalar("step", Scalar::Int(9));
  if (huge) {
    const auto h = ckpt_test::RandomBytes(std::size_t{34} << 20, 11);
    w->WriteChunk("huge", DType::kUInt8, {int64_t{34} << 20}, Box::Full({int64_t{34} << 20}), h.data(), 2);
  }
  w->Commit();
  return ReadMetadata(dir);  // resolved: the chunk records from the shard indexes
}

std::multiset<std::string> Problems(const ops::VerifyReport& r) {
  std::multiset<std::string> out;
  for (const auto& p : r.problems) out.insert(p.check + "|" + p.file + "|" + p.key + "|" + p.message);
  return out;
}

}  // namespace

TEST_CASE("verify: every chunk of every file is read, whatever the thread count") {
  ckpt_test::TempDir tmp("vw");
  for (bool zstd : {false, true}) {
    CAPTURE(zstd);
    const fs::path dir = tmp / (zstd ? "z" : "plain");
    const Metadata md = SaveWide(dir, zstd);
    uint64_t tensor_bytes = 900 * 1000 * 4 + 70000 * 8 + 400000;
    for (int k = 0; k < 20; ++k) tensor_bytes += (17 + k) * 8;
    for (int threads : {1, 2, 16}) {
      ops::VerifyOptions o;
      o.threads = threads;
      const auto r = ops::Verify(dir, o);
      CHECK(r.ok());
      CHECK(r.files == 3);
      CHECK(r.chunks == 3 + 1 + 20 + 1 + 1);
      CHECK(r.bytes_read == tensor_bytes);
      o.quick = true;
      const auto q = ops::Verify(dir, o);
      CHECK(q.ok());
      CHECK(q.bytes_read == 0);
    }
    if (zstd) {
      // A compressed chunk whose recorded checksum is wrong (in its shard's index, whose
      // digest metadata.json records: recomputed, so the checksum is what is tested).
      const ChunkMeta& mid = md.Find("mid")->chunks[0];
      std::string text = ckpt_test::ReadIndexText(dir / mid.file);
      REQUIRE(text.find(mid.checksum) != std::string::npos);
      text.replace(text.find(mid.checksum), mid.checksum.size(), "xxh3-64:0123456789abcdef");
      ckpt_test::WriteIndexText(dir, ckpt_test::FileIndexOf(dir, mid.file), text);
      const auto r = ops::Verify(dir, {});
      REQUIRE(r.problems.size() == 1);
      CHECK(r.problems[0].check == "checksums");
      CHECK(r.problems[0].key == "mid");
      CHECK(r.problems[0].message.find("0123456789abcdef") != std::string::npos);
    }
  }
}

TEST_CASE("verify: damaged data in several files, each problem named once, same for any thread count") {
  ckpt_test::TempDir tmp("vd");
  const fs::path dir = tmp / "c";
  const Metadata md = SaveWide(dir, false, /*huge=*/true);
  // A byte inside a big chunk (1.2 MB: mapped), the last byte of another, a byte in the
  // second 32 MiB window of the huge chunk, a byte of the bytes entry (400 kB: read in
  // pieces) and of a small tensor.
  const auto& big = md.Find("big")->chunks;
  FlipByte(dir / big[1].file, DataOffset(dir / big[1].file, big[1].dataset) + 300000);
  FlipByte(dir / big[2].file, DataOffset(dir / big[2].file, big[2].dataset) + 1199999);
  const auto& huge = md.Find("huge")->chunks[0];
  FlipByte(dir / huge.file, DataOffset(dir / huge.file, huge.dataset) + (uint64_t{33} << 20) + 5);
  const auto& blob = md.Find("blob")->chunks[0];
  FlipByte(dir / blob.file, DataOffset(dir / blob.file, blob.dataset) + 123456);
  const auto& small = md.Find("small.4")->chunks[0];
  FlipByte(dir / small.file, DataOffset(dir / small.file, small.dataset) + 3);
  std::multiset<std::string> first;
  for (int threads : {1, 2, 5}) {
    ops::VerifyOptions o;
    o.threads = threads;
    const auto r = ops::Verify(dir, o);
    REQUIRE(r.problems.size() == 5);
    std::set<std::string> keys;
    for (const auto& p : r.problems) {
      CHECK(p.check == "checksums");
      CHECK(!p.file.empty());
      CHECK(p.message.find(p.file) != std::string::npos);
      CHECK(p.message.find("'" + p.key + "'") != std::string::npos);
      keys.insert(p.key);
    }
    CHECK(keys == std::set<std::string>{"big", "blob", "huge", "small.4"});
    if (first.empty()) first = Problems(r);
    CHECK(Problems(r) == first);
    o.quick = true;  // no data read: nothing to see
    CHECK(ops::Verify(dir, o).ok());
  }
}

TEST_CASE("verify: v2 indexes checked a group of files at a time report what one group does") {
  ckpt_test::TempDir tmp("vg");
  const fs::path dir = tmp / "c";
  SaveWide(dir, false);
  // File 0 loses the record of small.0; file 1 lists small.1 twice; file 2 lists a key
  // metadata.json does not have; the data of big's chunk in file 1 is changed.
  auto edit = [&](int file, const std::function<void(nlohmann::json&)>& fn) {
    const std::string name = ckpt_test::ReadMetaJson(dir)["files"][file]["name"];
    nlohmann::json index = ckpt_test::ReadIndexJson(dir / name);
    fn(index["chunks"]);
    ckpt_test::WriteIndexJson(dir, file, index);
  };
  auto find = [](nlohmann::json& chunks, const std::string& key) -> nlohmann::json& {
    for (auto& c : chunks)
      if (c["key"] == key) return c;
    throw std::runtime_error("no record of " + key);
  };
  edit(0, [&](nlohmann::json& c) {
    for (std::size_t i = 0; i < c.size(); ++i)
      if (c[i]["key"] == "small.0") c.erase(i);
  });
  edit(1, [&](nlohmann::json& c) { c.push_back(find(c, "small.1")); });
  edit(2, [&](nlohmann::json& c) {
    nlohmann::json stray = find(c, "small.2");
    stray["key"] = "stray";
    c.push_back(stray);
  });
  std::multiset<std::string> one_group;
  for (const int64_t group : {int64_t{1} << 15, int64_t{1}, int64_t{20}}) {
    CAPTURE(group);
    for (const bool quick : {false, true}) {
      ops::VerifyOptions o;
      o.quick = quick;
      o.group_chunks = group;
      const auto r = ops::Verify(dir, o);
      std::map<std::string, std::string> by_key;  // key -> file of its index problem
      for (const auto& p : r.problems)
        if (p.check == "index") by_key[p.key] = p.file;
      CHECK(by_key.count("small.0"));
      CHECK(by_key.count("small.1"));
      CHECK(by_key.count("stray"));
      if (!quick && group == (int64_t{1} << 15)) one_group = Problems(r);
      if (!quick) CHECK(Problems(r) == one_group);
    }
  }
}

TEST_CASE("verify: a file that is not HDF5 is reported once; the other files are still read") {
  ckpt_test::TempDir tmp("vh");
  const fs::path dir = tmp / "c";
  const Metadata md = SaveWide(dir, false);
  const std::string victim = md.files[1].name;
  const auto size = fs::file_size(dir / victim);
  {
    std::ofstream out(dir / victim, std::ios::binary | std::ios::trunc);
    out << std::string(size, 'x');  // same size, no HDF5 signature
  }
  // And a dataset whose header disagrees with metadata in another file (dtype lie): in
  // metadata.json and in small.0's index record alike, the digests recomputed.
  const ChunkMeta& small0 = md.Find("small.0")->chunks[0];
  REQUIRE(small0.file != victim);
  json doc = ckpt_test::ReadMetaJson(dir);
  REQUIRE(doc["entries"]["small.0"]["dtype"] == "float64");
  doc["entries"]["small.0"]["dtype"] = "float32";
  doc["entries"]["small.0"].erase("stats");
  // (stored_bytes follows the lie, else the index is refused before the dataset is looked at)
  const uint64_t lied_bytes = doc["entries"]["small.0"]["stored_bytes"].get<uint64_t>() / 2;
  doc["entries"]["small.0"]["stored_bytes"] = lied_bytes;
  ckpt_test::WriteMetaJson(dir, doc);
  const int small0_file = ckpt_test::FileIndexOf(dir, small0.file);
  json index = ckpt_test::ReadIndexJson(dir / small0.file);
  for (auto& r : index["chunks"])
    if (r["key"] == "small.0") {
      r["dtype"] = "float32";
      r["stored_bytes"] = lied_bytes;
    }
  ckpt_test::WriteIndexJson(dir, small0_file, index);
  for (bool quick : {false, true}) {
    CAPTURE(quick);
    ops::VerifyOptions o;
    o.quick = quick;
    const auto r = ops::Verify(dir, o);
    std::size_t files = 0, datasets = 0;
    for (const auto& p : r.problems) {
      if (p.check == "files") {
        ++files;
        CHECK(p.file == victim);
        CHECK(p.message.find(victim) != std::string::npos);
      } else if (p.check == "datasets") {
        ++datasets;
        CHECK(p.message.find("does not match dtype float32") != std::string::npos);
        CHECK(p.file != victim);
      }
    }
    INFO(Messages(r));
    CHECK(files == 1);
    CHECK(datasets == 1);
    CHECK(r.problems.size() == 2);
    if (!quick) CHECK(r.bytes_read > 900000 * 4 / 3);
  }
}

TEST_CASE("schema validator: compiled once; messages carry JSON pointers; a malformed schema is refused") {
  ops::detail::JsonSchema s(json::parse(R"({
    "type": "object",
    "properties": {"list": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
    "additionalProperties": {"type": "integer"},
    "propertyNames": {"pattern": "^[a-z]+$"},
    "$defs": {"item": {"type": "object", "required": ["a/b"],
                       "properties": {"a/b": {"oneOf": [{"type": "string"}, {"type": "integer", "minimum": 3}]},
                                      "n": {"not": {"const": 0}}}}}})"));
  CHECK(s.Validate(json::parse(R"({"list": [{"a/b": "x"}, {"a/b": 4}], "extra": 1})")).empty());
  const auto errs = s.Validate(json::parse(R"({"list": [{"a/b": 1, "n": 0}, {}], "X": 1, "y": "s"})"));
  REQUIRE(errs.size() == 5);
  CHECK(errs[0] == "/: member name \"X\" is not allowed");  // members in name order
  CHECK(errs[1] == "/list/0/a~1b: matches 0 of the oneOf alternatives, expected 1");
  CHECK(errs[2] == "/list/0/n: matches a schema it must not");
  CHECK(errs[3] == "/list/1: missing required member \"a/b\"");
  CHECK(errs[4] == "/y: expected type \"integer\", found \"s\"");
  CHECK(s.Validate(json::parse(R"({"list": [{}, {}, {}]})"), 2).size() == 2);  // the limit
  // Recursive schemas compile (a $ref back to the root).
  ops::detail::JsonSchema tree(json::parse(R"({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}})"));
  CHECK(tree.Validate(json::parse(R"({"kids": [{"kids": []}, {"kids": [{}]}]})")).empty());
  CHECK(tree.Validate(json::parse(R"({"kids": [{"kids": [1]}]})")).size() == 1);
  // Malformed schemas are errors at construction, not crashes or silent passes.
  auto refused = [](const char* text) {
    try {
      ops::detail::JsonSchema bad(json::parse(text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(refused(R"({"$ref": "#/$defs/nowhere"})").find("does not resolve") != std::string::npos);
  CHECK(refused(R"({"$ref": "other.json#/x"})").find("only local $ref") != std::string::npos);
  CHECK(refused(R"({"pattern": "("})").find("not a valid regular expression") != std::string::npos);
  CHECK(refused(R"({"minimum": "3"})").find("'minimum'") != std::string::npos);
  CHECK(refused(R"({"type": 7})").find("'type'") != std::string::npos);
  // The schema `false` and a boolean additionalProperties.
  ops::detail::JsonSchema no(json::parse("false"));
  CHECK(no.Validate(json::parse("1")) == std::vector<std::string>{"/: not allowed here"});
}

TEST_CASE("inspect --json: written key by key, exactly as one dump(2) of the whole report") {
  ckpt_test::TempDir tmp("inj");
  SaveSample(tmp / "c");
  ops::InspectOptions o;
  o.stats = true;
  ops::InspectOptions none;
  none.keys = {"nothing.*"};
  ops::InspectReport odd;  // strings with escaped newlines, nested user data, problems
  odd.user = R"({"a":{"b":[1,2.5]},"s":"x\ny"})";
  odd.keys.push_back(ops::KeyInfo{"k\n", EntryKind::kJson, "", {}, 0, 0, 0, "-", R"({"v":"1\n2","w":[]})", {}});
  odd.problems = {"one", "two"};
  for (const ops::InspectReport& r : {ops::Inspect(tmp / "c", o), ops::Inspect(tmp / "c", none), odd}) {
    const std::string text = ops::RenderInspectJson(r);
    const auto doc = nlohmann::ordered_json::parse(text);
    CHECK(doc.dump(2) + "\n" == text);
    CHECK(doc["keys"].size() == r.keys.size());
    CHECK(doc["problems"].size() == r.problems.size());
  }
}

namespace {

// The shard holding dataset `dataset` of a checkpoint saved by SaveSample.
fs::path ShardOf(const fs::path& dir, const std::string& key, const std::string& dataset) {
  const Metadata md = ReadMetadata(dir);
  for (const auto& c : md.Find(key)->chunks)
    if (c.dataset == dataset) return dir / c.file;
  FAIL("no dataset " << dataset);
  return {};
}

template <typename Fn>
std::string ErrorOf(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("every reader refuses a shard dataset that reaches outside its file or names a foreign filter") {
  const std::map<std::string, std::string> kinds = {{"lz4", "HDF5 filter 32004 (LZ4)"},
                                                     {"extlink", "is an external link"},
                                                     {"softlink", "is a soft link"},
                                                     {"vds", "a virtual dataset"},
                                                     {"external", "stored in external files"}};
  ckpt_test::TempDir tmp("hostile");
  for (const auto& [kind, phrase] : kinds) {
    CAPTURE(kind);
    const fs::path dir = tmp / kind;
    SaveSample(dir, 1.0f, /*pack_bytes=*/0);  // each chunk a dataset of its own, damaged here
    const fs::path shard = ShardOf(dir, "model.w", "model.w@3,0");
    ckpt::testing::MakeHostileDataset(shard.string(), "model.w@3,0", kind, (tmp / (kind + ".outside")).string());
    ckpt_test::RecordIndexDigest(dir, ckpt_test::FileIndexOf(dir, shard.filename().string()));
    auto names_all = [&](const std::string& what) {
      CHECK_MESSAGE(what.find(phrase) != std::string::npos, what);
      CHECK_MESSAGE(what.find(shard.filename().string()) != std::string::npos, what);
      CHECK_MESSAGE(what.find("model.w@3,0") != std::string::npos, what);
    };
    // load (the reader the library's Load uses)
    std::vector<float> w(24);
    names_all(ErrorOf([&] { CheckpointReader::Open(dir)->ReadRegion("model.w", Box::Full({6, 4}), w.data()); }));
    const Metadata md = ReadMetadata(dir);
    const auto& chunks = md.Find("model.w")->chunks;
    const std::size_t hostile = chunks[0].dataset == "model.w@3,0" ? 0 : 1;
    names_all(ErrorOf([&] { CheckpointReader::Open(dir)->VerifyChunk("model.w", hostile); }));
    // the tools' readers: a checkpoint source, a lone shard, verify and merge
    names_all(ErrorOf([&] { ReadAll(*ops::Source::Open(dir), "model.w"); }));
    names_all(ErrorOf([&] { ReadAll(*ops::Source::Open(shard), "model.w"); }));
    const auto v = ops::Verify(dir, {});
    CHECK(!v.ok());
    names_all(Messages(v));
    names_all(ErrorOf([&] { ops::Merge(dir, tmp / (kind + ".merged"), {}); }));
    CHECK(!fs::exists(tmp / (kind + ".merged")));
    // the rest of the shard still reads
    std::vector<float> b(4);
    CheckpointReader::Open(dir)->ReadRegion("model.b", Box::Full({4}), b.data());
    CHECK(b[3] == 1.5f);
  }
}

TEST_CASE("a lone shard: its index is parsed strictly once, bytes entries included") {
  ckpt_test::TempDir tmp("lone");
  SaveSample(tmp / "c");
  const Metadata md = ReadMetadata(tmp / "c");
  const fs::path shard = tmp / "c" / md.Find("rng")->chunks[0].file;  // holds a bytes entry
  {
    auto src = ops::Source::Open(shard);
    CHECK(src->kind() == ops::SourceKind::kShard);
    CHECK(src->metadata().Find("model.w"));
    CHECK(!src->metadata().Find("rng"));  // bytes entries are read from the checkpoint directory
  }
  // A malformed index is refused naming the file and what is wrong.
  std::string text = ckpt_test::ReadIndexText(shard);
  const auto at = text.find("\"offset\":");
  REQUIRE(at != std::string::npos);
  text.replace(at, 9, "\"offset\":-");  // a negative data offset
  const int file = ckpt_test::FileIndexOf(tmp / "c", shard.filename().string());
  ckpt_test::WriteIndexText(tmp / "c", file, text, ckpt_test::Digests::kKeepStale);
  const std::string bad = ErrorOf([&] { ops::Source::Open(shard); });
  CHECK_MESSAGE(bad.find(shard.string() + ": ckpt_shard_index") != std::string::npos, bad);
  CHECK_MESSAGE(bad.find("\"offset\" is not a byte offset") != std::string::npos, bad);
  // In the checkpoint (v2: the index is the chunks' description, its digest in
  // metadata.json) the changed index is a digest mismatch naming the shard ...
  std::vector<float> b(4);
  const std::string stale = ErrorOf([&] { CheckpointReader::Open(tmp / "c")->ReadRegion("model.b", Box::Full({4}), b.data()); });
  CHECK_MESSAGE(stale.find(shard.filename().string()) != std::string::npos, stale);
  CHECK_MESSAGE(stale.find("digest mismatch") != std::string::npos, stale);
  // ... and with its digest recomputed, the parser behind it refuses the offset.
  ckpt_test::WriteIndexText(tmp / "c", file, text);
  const std::string parsed = ErrorOf([&] { CheckpointReader::Open(tmp / "c")->ReadRegion("model.b", Box::Full({4}), b.data()); });
  CHECK_MESSAGE(parsed.find(shard.filename().string() + ": ckpt_shard_index") != std::string::npos, parsed);
  CHECK_MESSAGE(parsed.find("\"offset\" is not a byte offset") != std::string::npos, parsed);
}

TEST_CASE("verify reports links in a shard that no chunk names and that are not datasets of its own") {
  ckpt_test::TempDir tmp("links");
  SaveSample(tmp / "c");
  const fs::path shard = tmp / "c" / ReadMetadata(tmp / "c").files[0].name;
  const hid_t f = H5Fopen(shard.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  REQUIRE(f >= 0);
  REQUIRE(H5Lcreate_external((tmp / "elsewhere.h5").c_str(), "x", f, "extra", H5P_DEFAULT, H5P_DEFAULT) >= 0);
  REQUIRE(H5Lcreate_soft("/model.b", f, "alias", H5P_DEFAULT, H5P_DEFAULT) >= 0);
  H5Fclose(f);
  const std::string m = Messages(ops::Verify(tmp / "c", {}));
  CHECK_MESSAGE(m.find(shard.filename().string() + ": 'extra' is an external link") != std::string::npos, m);
  CHECK_MESSAGE(m.find(shard.filename().string() + ": 'alias' is a soft link") != std::string::npos, m);
}

TEST_CASE("merge --world 4: a key spelled like another key's chunk gets a dataset of its own") {
  // 'w' split in four has a chunk at [0, 0], which was dataset 'w@0,0': the same name as
  // the whole tensor 'w@0,0' ("key 'w@0,0' writes dataset 'w@0,0' twice").
  ckpt_test::TempDir tmp("at");
  std::vector<float> w(32), w00(8);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  for (std::size_t i = 0; i < w00.size(); ++i) w00[i] = -static_cast<float>(i);
  {
    auto wr = CheckpointWriter::Create(tmp / "src", {});
    wr->WriteChunk("w", DType::kFloat32, {8, 4}, Box::Full({8, 4}), w.data());
    wr->WriteChunk("w@0,0", DType::kFloat32, {2, 4}, Box::Full({2, 4}), w00.data());
    wr->Commit();
  }
  ops::MergeOptions o;
  o.world = 4;
  ops::Merge(tmp / "src", tmp / "out", o);
  CHECK(ops::Verify(tmp / "out", {}).ok());
  const Metadata md = ReadMetadata(tmp / "out");
  std::set<std::pair<std::string, std::string>> names;  // (file, dataset)
  for (const auto& [key, e] : md.entries)
    for (const auto& c : e.chunks) CHECK(names.emplace(c.file, c.dataset).second);
  CHECK(md.Find("w@0,0")->chunks.front().dataset.find("%40") != std::string::npos);
  auto src = ops::Source::Open(tmp / "out");
  CHECK(ReadAll(*src, "w") == w);
  CHECK(ReadAll(*src, "w@0,0") == w00);
}

TEST_CASE("new dtypes: names, sizes, and values decoded as FORMAT.md §4.5 says") {
  const std::pair<DType, const char*> names[] = {{DType::kUInt16, "uint16"},
                                                 {DType::kUInt32, "uint32"},
                                                 {DType::kUInt64, "uint64"},
                                                 {DType::kFloat8E8M0FNU, "float8_e8m0fnu"},
                                                 {DType::kFloat4E2M1FNx2, "float4_e2m1fn_x2"}};
  for (const auto& [d, name] : names) {
    CHECK(DTypeName(d) == name);
    CHECK(DTypeFromName(name) == d);
  }
  CHECK(DTypeSize(DType::kUInt64) == 8);
  CHECK(DTypeSize(DType::kFloat4E2M1FNx2) == 1);
  CHECK(DTypeValues(DType::kFloat4E2M1FNx2) == 2);
  CHECK(DTypeValues(DType::kFloat8E8M0FNU) == 1);
  CHECK(IsFloating(DType::kFloat8E8M0FNU));
  CHECK(!IsCastable(DType::kFloat8E8M0FNU));
  CHECK(!IsCastable(DType::kFloat4E2M1FNx2));
  CHECK(!IsFloating(DType::kUInt32));
  CHECK(!DTypeFromName("float4_e2m1fn"));
  // e8m0: 2^(b-127), 255 NaN.
  for (int b = 0; b < 255; ++b) {
    const auto byte = static_cast<uint8_t>(b);
    REQUIRE(ElementToDouble(DType::kFloat8E8M0FNU, &byte) == std::ldexp(1.0, b - 127));
  }
  const uint8_t nan = 255;
  CHECK(std::isnan(ElementToDouble(DType::kFloat8E8M0FNU, &nan)));
  // e2m1 pairs: low nibble first.
  const double e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int b = 0; b < 256; ++b) {
    const auto byte = static_cast<uint8_t>(b);
    double v[2];
    ElementValues(DType::kFloat4E2M1FNx2, &byte, v);
    REQUIRE(v[0] == e2m1[b & 15]);
    REQUIRE(v[1] == e2m1[b >> 4]);
    REQUIRE(std::signbit(v[0]) == ((b & 8) != 0));
  }
  const uint64_t big = 0xfffffffffffffff0ull;
  CHECK(ElementToDouble(DType::kUInt64, &big) == static_cast<double>(big));
  // Statistics are of the values: an F4 byte is two of them.
  const uint8_t f4[2] = {0x71, 0xf8};  // 0.5, 6 | -0, -6
  ops::detail::StatsAccumulator acc;
  acc.Add(DType::kFloat4E2M1FNx2, f4, 2);
  CHECK(acc.finite == 4);
  CHECK(acc.min == -6);
  CHECK(acc.max == 6);
  CHECK(acc.sum == 0.5);
  ChunkDigest digest(DType::kFloat4E2M1FNx2, true);
  digest.Update(f4, 2);
  const auto s = digest.Stats();
  REQUIRE(s);
  CHECK(s->finite_count == 4);
  CHECK(s->min == -6);
  CHECK(s->max == 6);
  CHECK(s->mean == doctest::Approx(0.125));
  const uint8_t scales[3] = {127, 128, 255};  // 1, 2, NaN
  ChunkDigest ds(DType::kFloat8E8M0FNU, true);
  ds.Update(scales, 3);
  CHECK(ds.Stats()->nan_count == 1);
  CHECK(ds.Stats()->finite_count == 2);
  CHECK(ds.Stats()->mean == 1.5);
}
