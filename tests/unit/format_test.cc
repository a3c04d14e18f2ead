// format: dtypes and the metadata.json codec.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/ckpt.h"
#include "format/json_value.h"
#include "format/names.h"

using namespace ckpt;

TEST_CASE("dtype names are PyTorch's and round-trip") {
  for (DType dt : kAllDTypes) CHECK(DTypeFromName(DTypeName(dt)) == dt);
  CHECK(DTypeName(DType::kBFloat16) == "bfloat16");
  CHECK(DTypeName(DType::kFloat8E4M3FN) == "float8_e4m3fn");
  CHECK(DTypeSize(DType::kFloat8E5M2) == 1);
  CHECK_FALSE(DTypeFromName("complex64"));
  CHECK(IsFloating(DType::kBFloat16));
  CHECK_FALSE(IsFloating(DType::kBool));
}

TEST_CASE("element conversion of the small float formats") {
  const uint16_t half_one = 0x3C00, bf16_minus_two = 0xC000;
  CHECK(ElementToDouble(DType::kFloat16, &half_one) == 1.0);
  CHECK(ElementToDouble(DType::kBFloat16, &bf16_minus_two) == -2.0);
  const uint8_t e4m3_max = 0x7E, e4m3_nan = 0x7F, e5m2_inf = 0x7C, e4m3_one = 0x38;
  CHECK(ElementToDouble(DType::kFloat8E4M3FN, &e4m3_max) == 448.0);
  CHECK(std::isnan(ElementToDouble(DType::kFloat8E4M3FN, &e4m3_nan)));
  CHECK(std::isinf(ElementToDouble(DType::kFloat8E5M2, &e5m2_inf)));
  CHECK(ElementToDouble(DType::kFloat8E4M3FN, &e4m3_one) == 1.0);
}

TEST_CASE("metadata v1 serializes and parses back identically, keeping key order") {
  Metadata m;
  m.format_version = 1;
  m.state_dict_type = StateDictType::kSharded;
  m.world_size = 2;
  m.user = R"({"run":"a"})";
  m.files = {{"shard-00000-of-00002.h5", 0, 100, ""}, {"shard-00001-of-00002.h5", 1, 90, ""}};
  EntryMeta t;
  t.kind = EntryKind::kTensor;
  t.dtype = DType::kBFloat16;
  t.shape = {4, 2};
  ChunkMeta c;
  c.box = Box{{0, 0}, {2, 2}};
  c.file = "shard-00000-of-00002.h5";
  c.dataset = "z.w@0,0";
  c.checksum = "xxh3-64:0123456789abcdef";
  c.stored_bytes = 8;
  c.stats = ChunkStats{-1, 1, 0, 2, 0, 0, 4};
  t.chunks.push_back(c);
  c.box.offsets = {2, 0};
  c.file = "shard-00001-of-00002.h5";
  c.stats.reset();
  t.chunks.push_back(c);
  m.entries.emplace_back("z.w", t);
  EntryMeta s;
  s.kind = EntryKind::kScalar;
  s.dtype = DType::kInt64;
  s.value = "7";
  m.entries.emplace_back("a.step", s);
  const std::string text = SerializeMetadata(m);
  const Metadata back = ParseMetadata(text);
  CHECK(SerializeMetadata(back) == text);
  REQUIRE(back.entries.size() == 2);
  CHECK(back.entries[0].first == "z.w");  // save order, not sorted
  CHECK(back.Find("z.w")->chunks[0].stats->finite_count == 4);
  CHECK_FALSE(back.Find("z.w")->chunks[1].stats.has_value());
  CHECK(back.Find("a.step")->value == "7");
}

TEST_CASE("IsSafeFileName") {
  CHECK(IsSafeFileName("shard-00000-of-00001.h5"));
  CHECK_FALSE(IsSafeFileName("../x.h5"));
  CHECK_FALSE(IsSafeFileName("a/b"));
  CHECK_FALSE(IsSafeFileName(".."));
  CHECK_FALSE(IsSafeFileName(""));
  CHECK_FALSE(IsSafeFileName(std::string("a\0b", 3)));
}

TEST_CASE("ParseMetadata compares format_version in 64 bits (found by fuzz_metadata review)") {
  auto doc = [](const std::string& version) {
    return R"({"format":"ckpt","format_version":)" + version +
           R"(,"state_dict_type":"FULL","world_size":1,"files":[],"entries":{}})";
  };
  CHECK(ParseMetadata(doc("1")).format_version == 1);
  // 2^32 + 1 and 1 - 2^32 once narrowed to int as 1: a newer or invalid version read as v1.
  CHECK_THROWS_WITH_AS(ParseMetadata(doc("2")), doctest::Contains("no digest"), Error);  // v2 needs its digest
  for (const char* newer : {"3", "4294967297", "18446744073709551615"}) {
    CHECK_THROWS_WITH_AS(ParseMetadata(doc(newer)), doctest::Contains("is newer than"), Error);
  }
  for (const char* invalid : {"0", "-1", "-4294967295"}) {
    CHECK_THROWS_WITH_AS(ParseMetadata(doc(invalid)), doctest::Contains("is invalid"), Error);
  }
}

TEST_CASE("ParseMetadata refuses integer scalars outside int64 (found by fuzz_load)") {
  auto doc = [](const char* dtype, const std::string& value) {
    return std::string(R"({"format":"ckpt","format_version":1,"state_dict_type":"FULL","world_size":1,"files":[],)") +
           R"("entries":{"s":{"type":"scalar","dtype":")" + dtype + R"(","value":)" + value + "}}}";
  };
  CHECK(ParseMetadata(doc("int64", "-9223372036854775808")).Find("s")->value == "-9223372036854775808");
  CHECK(ParseMetadata(doc("int64", "9223372036854775807")).Find("s")->value == "9223372036854775807");
  CHECK_NOTHROW(ParseMetadata(doc("int32", "2.5")));
  CHECK_NOTHROW(ParseMetadata(doc("float32", "1e300")));
  // Load converted these with static_cast<int64_t>(double): undefined behaviour.
  for (const char* value : {"1e300", "-1e300", "9223372036854775808.0", "9223372036854775808"}) {
    CAPTURE(value);
    CHECK_THROWS_WITH_AS(ParseMetadata(doc("int64", value)), doctest::Contains("does not fit dtype int64"), Error);
  }
  CHECK_THROWS_WITH_AS(ParseMetadata(doc("bool", "1e19")), doctest::Contains("does not fit dtype bool"), Error);
}

TEST_CASE("ParseMetadata enforces its limits") {
  ParseLimits small;
  small.max_bytes = 10;
  CHECK_THROWS_WITH_AS(ParseMetadata(R"({"format": "ckpt"})", "m.json", small), doctest::Contains("exceeds the limit"),
                       Error);
  CHECK_THROWS_WITH_AS(ParseMetadata("[1]"), doctest::Contains("must be a JSON object"), Error);
  CHECK_THROWS_WITH_AS(ParseMetadata(R"({"format":"other"})"), doctest::Contains("not \"ckpt\""), Error);
  const std::string base =
      R"({"format":"ckpt","format_version":1,"state_dict_type":"SHARDED","world_size":1,"files":[{"name":"f.h5","rank":0,"bytes":1}],"entries":{"k":)";
  CHECK_NOTHROW(ParseMetadata(base + R"({"type":"json","value":{"a":1}}}})"));
  CHECK_THROWS_WITH_AS(ParseMetadata(base + R"({"type":"tensor","dtype":"float32","shape":[-1],"chunks":[]}}})"),
                       doctest::Contains("negative"), Error);
  CHECK_THROWS_WITH_AS(
      ParseMetadata(base + R"({"type":"tensor","dtype":"float32","shape":[2],"chunks":[{"offsets":[0],"sizes":[2],"file":"g.h5","dataset":"k","checksum":"xxh3-64:0000000000000000"}]}}})"),
      doctest::Contains("not listed"), Error);
  CHECK_THROWS_WITH_AS(
      ParseMetadata(base + R"({"type":"tensor","dtype":"float32","shape":[2],"chunks":[{"offsets":[0],"sizes":[2],"file":"f.h5","dataset":"k","checksum":"md5:00"}]}}})"),
      doctest::Contains("checksum"), Error);
  CHECK_THROWS_WITH_AS(ParseMetadata(base + R"({"type":"blob"}}})"), doctest::Contains("unknown entry type 'blob'"),
                       Error);
  std::string wide = "[";
  for (int i = 0; i < 40; ++i) wide += std::string(i ? "," : "") + "1";
  CHECK_THROWS_WITH_AS(
      ParseMetadata(base + R"({"type":"tensor","dtype":"float32","shape":)" + wide + R"(],"chunks":[]}}})"),
      doctest::Contains("dimensions"), Error);
}

TEST_CASE("keys must be non-empty UTF-8 without NUL bytes, checked when added") {
  CHECK(KeyProblem("model.layers.0.w") == "");
  CHECK(KeyProblem("模型.权重") == "");
  CHECK(KeyProblem("") == "empty key");
  CHECK(KeyProblem(std::string("a\0b", 3)).find("NUL") != std::string::npos);
  CHECK(KeyProblem("bad\xffkey") == "key 'bad\\xffkey' is not valid UTF-8 (byte 3)");
  CHECK(KeyProblem("\xc0\x80").find("UTF-8") != std::string::npos);      // overlong
  CHECK(KeyProblem("\xed\xa0\x80").find("UTF-8") != std::string::npos);  // surrogate
  StateDict sd;
  CHECK_THROWS_WITH_AS(sd.Add("bad\xffkey", Scalar::Int(1)), doctest::Contains("bad\\xffkey"), Error);
}

TEST_CASE("absurd world sizes, ranks and compression levels are corruption, not clamped") {
  const std::string head = R"({"format":"ckpt","format_version":1,"state_dict_type":"SHARDED",)";
  CHECK_THROWS_WITH_AS(ParseMetadata(head + R"("world_size":4294967296,"files":[],"entries":{}})"),
                       doctest::Contains("world_size 4294967296 is absurd"), Error);
  CHECK_THROWS_WITH_AS(
      ParseMetadata(head + R"("world_size":1,"files":[{"name":"a.h5","rank":99999999999,"bytes":1}],"entries":{}})"),
      doctest::Contains("rank 99999999999"), Error);
  CHECK_THROWS_WITH_AS(
      ParseMetadata(
          head +
          R"("world_size":1,"files":[{"name":"a.h5","rank":0,"bytes":1}],"entries":{"k":{"type":"tensor","dtype":"uint8","shape":[1],"chunks":[{"offsets":[0],"sizes":[1],"file":"a.h5","dataset":"k","checksum":"xxh3-64:0000000000000000","compression":{"codec":"zstd","level":18446744073709551615}}]}}})"),
      doctest::Contains("out of range"), Error);
}

// --- the one-pass reader of metadata.json (format/json_value.h, ParseMetadata) ----------

namespace {

// A valid document around one tensor entry `k` whose chunk is `chunk` (JSON members).
std::string TensorDoc(const std::string& entry_extra = "", const std::string& chunk_extra = "") {
  return R"({"format":"ckpt","format_version":1,"state_dict_type":"FULL","world_size":1,)"
         R"("files":[{"name":"f.h5","rank":0,"bytes":1}],"entries":{"k":{"type":"tensor","dtype":"float32",)"
         R"("shape":[2],)" + entry_extra + R"("chunks":[{"offsets":[0],"sizes":[2],"file":"f.h5","dataset":"k",)"
         R"("checksum":"xxh3-64:0000000000000000",)" + chunk_extra +
         R"("stats":{"min":0,"max":1,"mean":0.5,"l2":1,"nan_count":0,"inf_count":0,"finite_count":2}}]}}})";
}

std::string ParseError(const std::string& text, const ParseLimits& limits = {}) {
  try {
    ParseMetadata(text, "m.json", limits);
  } catch (const Error& e) {
    return e.what();
  }
  return "(parsed)";
}

// Whether the reader walks `text` as one JSON document without a problem.
bool ReaderAccepts(std::string_view text) {
  struct Walk final : format::JsonVisitor {
    bool Descend(const format::JsonPath&, bool) override { return true; }
    void Value(const format::JsonPath&, format::Json&&) override {}
  } walk;
  return !format::ReadJson(text, 64, walk);
}

}  // namespace

TEST_CASE("the JSON reader accepts exactly what nlohmann::json accepts") {
  const std::vector<std::string> cases = {
      "{}", "[]", "0", "-0", "-0.0", "1e5", "1E+5", "1e-5", "1.5e308", "1e400", "-1e400", "1e-400",
      "01", "-", "1.", ".5", "+1", "1e", "1e+", "0x10", "18446744073709551616", "-9223372036854775809",
      "true", "false", "null", "tru", "nul", "True", "NaN", "Infinity",
      "\"\"", "\"a\\\"b\"", "\"\\u00e9\"", "\"\\ud83d\\ude00\"", "\"\\ud83d\"", "\"\\ude00\"", "\"\\ud83dx\"",
      "\"\\ud83d\\u0041\"", "\"\\u0000\"", "\"\\x41\"", "\"\\u12\"", "\"\\uZZZZ\"", "\"tab\there\"",
      "\"\xc3\xa9\"", "\"\xc3\"", "\"\xc0\x80\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"", "\"\xf0\x9f\x98\x80\"",
      "\"\xff\"", "\"unterminated", "[1,]", "[,1]", "[1 2]", "{\"a\":1,}", "{\"a\" 1}", "{,}", "{\"a\":}", "{1:2}",
      "[[[]]]", "{\"a\":{\"b\":[1,{\"c\":null}]}}", " \t\r\n{} \n", "{} x", "{}{}", "",
      "\xEF\xBB\xBF{}", "\xEF\xBB{}", std::string("{}\0garbage", 10), std::string("{\0}", 3),
      std::string("\"a\0b\"", 5)};
  for (const std::string& text : cases) {
    CAPTURE(text);
    CHECK(ReaderAccepts(text) == nlohmann::json::accept(text));
  }
}

TEST_CASE("ParseMetadata: a JSON problem anywhere wins over a problem of meaning") {
  // The entry's dtype is unknown (kUnsupported), but the text is cut short / repeats a key later.
  std::string doc = TensorDoc();
  doc.replace(doc.find("float32"), 7, "complex128");
  CHECK_THROWS_WITH_AS(ParseMetadata(doc), doctest::Contains("unknown dtype 'complex128'"), Error);
  CHECK_THROWS_WITH_AS(ParseMetadata(doc.substr(0, doc.size() - 1)), doctest::Contains("invalid JSON"), Error);
  std::string dup = doc;
  dup.insert(dup.size() - 1, R"(,"world_size":1)");
  CHECK_THROWS_WITH_AS(ParseMetadata(dup), doctest::Contains("duplicate key 'world_size'"), Error);
  // nlohmann::json's words for a syntax error, with the place.
  CHECK(ParseError(R"({"format": "ckpt", )").find("invalid JSON: [json.exception.parse_error.101] parse error at line 1, column 20") !=
        std::string::npos);
}

TEST_CASE("ParseMetadata checks in a fixed order, whatever the order of the fields") {
  // `entries` before `files`: still parses, and the chunk's file is checked against them.
  const std::string head = R"({"format":"ckpt","format_version":1,"state_dict_type":"FULL","world_size":1,)";
  const std::string entries =
      R"("entries":{"k":{"chunks":[{"checksum":"xxh3-64:0000000000000000","dataset":"k","file":"f.h5","sizes":[2],"offsets":[0]}],"shape":[2],"dtype":"int8","type":"tensor"}})";
  const Metadata m = ParseMetadata(head + entries + R"(,"files":[{"name":"f.h5","rank":0,"bytes":1}]})");
  REQUIRE(m.Find("k"));
  CHECK(m.Find("k")->chunks.at(0).box.sizes == Shape{2});
  CHECK_THROWS_WITH_AS(ParseMetadata(head + entries + R"(,"files":[{"name":"g.h5","rank":0,"bytes":1}]})"),
                       doctest::Contains("entry 'k': file 'f.h5' is not listed"), Error);
  // A problem in the top-level fields wins over one in an entry, even when it comes last.
  std::string late_format = TensorDoc("", R"("stored_bytes":-1,)");
  CHECK_THROWS_WITH_AS(ParseMetadata(late_format), doctest::Contains("entry 'k': stored_bytes is negative (-1)"), Error);
  late_format.replace(late_format.find(R"("format":"ckpt",)"), 16, "");
  late_format.insert(late_format.size() - 1, R"(,"format":"kpt")");
  CHECK_THROWS_WITH_AS(ParseMetadata(late_format), doctest::Contains("'format' is not \"ckpt\""), Error);
  // Within an entry: its shape is checked before its chunks, even when the chunks come first.
  const std::string chunks_first = head + R"("files":[],"entries":{"k":{"type":"tensor","dtype":"int8",)"
                                          R"("chunks":[{"offsets":[0]}],"shape":[-2]}}})";
  CHECK_THROWS_WITH_AS(ParseMetadata(chunks_first), doctest::Contains("entry 'k': an element of 'shape' is negative (-2)"),
                       Error);
  // The first entry in the document with a problem is the one reported.
  const std::string two = head + R"("files":[],"entries":{"a":{"type":"blob"},"b":{"type":"json"}}})";
  CHECK_THROWS_WITH_AS(ParseMetadata(two), doctest::Contains("entry 'a': unknown entry type 'blob'"), Error);
}

TEST_CASE("ParseMetadata refuses duplicate keys at any depth, also spelled with escapes") {
  CHECK(ParseError(TensorDoc("", R"("file":"f.h5",)")).find("m.json: duplicate key 'file'") != std::string::npos);
  std::string in_stats = TensorDoc();
  in_stats.insert(in_stats.find("\"finite_count\""), R"("nan_count":1,)");
  CHECK(ParseError(in_stats) == "m.json: duplicate key 'nan_count'");
  CHECK(ParseError(TensorDoc(R"("\u0074ype":"tensor",)")) == "m.json: duplicate key 'type'");
  std::string in_user = TensorDoc();
  in_user.insert(1, R"("user":{"a":[{"x":1,"y":{"z":2,"z":3}}]},)");
  CHECK(ParseError(in_user) == "m.json: duplicate key 'z'");
  std::string twice = TensorDoc();
  twice.insert(twice.find(R"("k":{)"), std::string(R"("k":{"type":"json","value":1},)"));
  CHECK(ParseError(twice) == "m.json: duplicate key 'k'");
  // Many keys in one object (a set, not a scan): the 40th repeats the first.
  std::string wide = R"({"user":{)";
  for (int i = 0; i < 40; ++i) wide += "\"u" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  CHECK(ParseError(wide + R"("u0":0}})") == "m.json: duplicate key 'u0'");
}

TEST_CASE("ParseMetadata's depth limit counts every array and object") {
  // document 1, entries 2, entry 3, chunks 4, chunk 5, offsets/sizes/stats 6.
  ParseLimits limits;
  limits.max_depth = 6;
  CHECK_NOTHROW(ParseMetadata(TensorDoc(), "m.json", limits));
  limits.max_depth = 5;
  CHECK(ParseError(TensorDoc(), limits) == "m.json: JSON nesting deeper than 5");
  limits.max_depth = 64;
  CHECK(ParseError(TensorDoc(R"("deep":)" + std::string(62, '[') + std::string(62, ']') + ",")) ==
        "m.json: JSON nesting deeper than 64");
  // Deep but within the limit, in a value kept as text.
  const std::string deep = std::string(60, '[') + std::string(60, ']');
  std::string doc = TensorDoc();
  doc.insert(1, R"("user":{"a":)" + deep + "},");
  CHECK(ParseMetadata(doc, "m.json", limits).user == R"({"a":)" + deep + "}");
}

TEST_CASE("ParseMetadata reads numbers as nlohmann::json did") {
  CHECK(ParseError(TensorDoc(R"("x":1e400,)")).find("number overflow") != std::string::npos);
  auto with_rank = [](const std::string& rank) {
    return R"({"format":"ckpt","format_version":1,"state_dict_type":"FULL","world_size":1,"files":[{"name":"f.h5","rank":)" +
           rank + R"(,"bytes":1}],"entries":{}})";
  };
  CHECK(ParseError(with_rank("18446744073709551616")) ==
        "m.json: field 'rank' must be a non-negative integer, found 1.8446744073709552e+19");
  CHECK(ParseError(with_rank("-0")) == "m.json: field 'rank' is negative (0)");
  CHECK(ParseError(with_rank("2.0")) == "m.json: field 'rank' must be a non-negative integer, found 2.0");
  CHECK(ParseError(with_rank("\"1\"")) == "m.json: field 'rank' must be a non-negative integer, found \"1\"");
  CHECK(ParseError(with_rank("[1]")) == "m.json: field 'rank' must be a non-negative integer, found [1]");
  CHECK(ParseMetadata(with_rank("1073741824")).files.at(0).rank == 1073741824);
  std::string big_dim = TensorDoc();
  big_dim.replace(big_dim.find(R"("shape":[2])"), 11, R"("shape":[9223372036854775808])");
  CHECK(ParseError(big_dim) == "m.json: entry 'k': an element of 'shape' is too large");
  auto scalar = [](const std::string& value) {
    return R"({"format":"ckpt","format_version":1,"state_dict_type":"FULL","world_size":1,"files":[],)"
           R"("entries":{"s":{"type":"scalar","dtype":"float64","value":)" + value + "}}}";
  };
  CHECK(ParseMetadata(scalar("1e-400")).Find("s")->value == "0.0");
  CHECK(ParseMetadata(scalar("-1E-400")).Find("s")->value == "-0.0");
  CHECK(ParseMetadata(scalar("1e300")).Find("s")->value == "1e+300");
  CHECK(ParseMetadata(scalar("0.1")).Find("s")->value == "0.1");
  CHECK(ParseMetadata(scalar("-0")).Find("s")->value == "0");
  CHECK(ParseMetadata(scalar("true")).Find("s")->value == "true");
  CHECK(ParseMetadata(scalar("18446744073709551615")).Find("s")->value == "18446744073709551615");
}

TEST_CASE("ParseMetadata keeps JSON values as normalised text, as before") {
  std::string doc = TensorDoc();
  doc.insert(1, R"("user":{"b":1,"a":[1.50,true,"\u00e9\n"]},"mesh":{"shape":[2]},)");
  const Metadata m = ParseMetadata(doc);
  CHECK(m.user == "{\"a\":[1.5,true,\"\xc3\xa9\\n\"],\"b\":1}");
  CHECK(m.mesh == R"({"shape":[2]})");
  const Metadata bare = ParseMetadata(TensorDoc());
  CHECK(bare.user == "{}");
  CHECK(bare.mesh == "null");
  // A UTF-8 byte order mark, escaped keys and strings.
  std::string escaped = "\xEF\xBB\xBF" + TensorDoc();
  escaped.replace(escaped.find(R"("dataset":"k")"), 13, R"("d\u0061taset":"k\/\u00e9")");
  CHECK(ParseMetadata(escaped).Find("k")->chunks.at(0).dataset == "k/\xc3\xa9");
}


TEST_CASE("one Metadata read by many threads at once: Find never writes to it") {
  // Built by hand with no index: before, every thread's first Find rebuilt the shared index
  // (a data race: wrong answers, crashes, heap-use-after-free under the sanitizers).
  Metadata unindexed;
  constexpr int kKeys = 4000, kThreads = 8;
  for (int i = 0; i < kKeys; ++i) {
    EntryMeta e;
    e.kind = EntryKind::kScalar;
    e.value = std::to_string(i);
    unindexed.entries.emplace_back("k" + std::to_string(i), std::move(e));
  }
  Metadata m;
  for (int round = 0; round < 20; ++round) {
    m = unindexed;
    if (round % 2) m.BuildIndex();  // odd rounds read through the index
    const Metadata& shared = m;
    std::atomic<int> wrong{0}, ready{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < kThreads; ++t) {
      readers.emplace_back([&, t] {
        ++ready;
        while (ready < kThreads) {
        }  // all start together
        for (int i = t; i < kKeys; i += kThreads) {
          const EntryMeta* e = shared.Find("k" + std::to_string(i));
          if (!e || e->value != std::to_string(i) || shared.Find("missing" + std::to_string(i))) ++wrong;
        }
      });
    }
    for (auto& r : readers) r.join();
    CHECK(wrong == 0);
  }
  // Copies carry their index; appended entries are found, removed ones are not.
  Metadata copy = m;
  EntryMeta extra;
  extra.value = "x";
  copy.entries.emplace_back("extra", extra);
  REQUIRE(copy.Find("extra"));
  CHECK(copy.Find("extra")->value == "x");
  CHECK(copy.Find("k3999")->value == "3999");
  CHECK_FALSE(m.Find("extra"));
  copy.entries.resize(10);
  CHECK_FALSE(copy.Find("k10"));
  CHECK(copy.Find("k9")->value == "9");
  // A repeated key finds its first entry, with or without the index.
  copy.entries.emplace_back("k5", extra);
  CHECK(copy.Find("k5")->value == "5");
  copy.BuildIndex();
  CHECK(copy.Find("k5")->value == "5");
}

namespace {
// Inverts names::DatasetName (FORMAT.md §5.2): the key and, for a partial chunk, the offsets
// text. Fails the test on a name no key produces.
std::pair<std::string, std::string> DecodeDatasetName(const std::string& name) {
  const std::size_t at = name.find('@');
  const std::string esc = name.substr(0, at);
  std::string key;
  for (std::size_t i = 0; i < esc.size(); ++i) {
    if (esc[i] != '%') {
      key += esc[i];
      continue;
    }
    REQUIRE(i + 2 < esc.size());
    const std::string code = esc.substr(i + 1, 2);
    if (code == "25") key += '%';
    else if (code == "2F") key += '/';
    else if (code == "40") key += '@';
    else if (code == "2E" && i == 0) key += '.';
    else FAIL("undecodable escape in " << name);
    i += 2;
  }
  return {key, at == std::string::npos ? std::string("whole") : name.substr(at + 1)};
}
}  // namespace

TEST_CASE("dataset names are injective over keys and offsets, whatever the keys hold") {
  // Every key of up to 4 characters over the characters the rule is about, with whole and
  // partial chunks: no two (key, chunk) pairs share a name, and each name decodes back.
  const std::string alphabet = "a%/.@40,2EF";
  std::vector<std::string> keys{""};
  for (std::size_t begin = 0, len = 1; len <= 4; ++len) {
    const std::size_t end = keys.size();
    for (std::size_t k = begin; k < end; ++k)
      for (char c : alphabet) keys.push_back(keys[k] + c);
    begin = end;
  }
  const std::vector<std::vector<int64_t>> offsets{{}, {0}, {0, 0}, {1}, {10}, {1, 0}, {0, 40}};
  std::map<std::string, std::pair<std::string, std::string>> seen;
  for (const std::string& key : keys) {
    if (key.empty()) continue;
    for (std::size_t i = 0; i < offsets.size(); ++i) {
      const bool whole = i == 0;
      const std::string name = names::DatasetName(key, offsets[i], whole);
      CAPTURE(key);
      CAPTURE(name);
      CHECK(name.find('/') == std::string::npos);
      CHECK(name.front() != '.');
      const auto decoded = DecodeDatasetName(name);
      CHECK(decoded.first == key);
      const auto [it, fresh] = seen.emplace(name, decoded);
      CHECK_MESSAGE(fresh, "'" << key << "' shares dataset '" << name << "' with '" << it->second.first << "'");
    }
  }
  CHECK(seen.size() == (keys.size() - 1) * offsets.size());
  // The case that collided: tensor 'w' split in four has a chunk at [0, 0].
  CHECK(names::DatasetName("w", {0, 0}, false) == "w@0,0");
  CHECK(names::DatasetName("w@0,0", {0, 0}, true) == "w%400,0");
  CHECK(names::EscapeKey(".a/b%c@d") == "%2Ea%2Fb%25c%40d");
}
