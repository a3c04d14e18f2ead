// format: dtypes and the metadata.json codec.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "ckpt/ckpt.h"

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

TEST_CASE("metadata serializes and parses back identically, keeping key order") {
  Metadata m;
  m.state_dict_type = StateDictType::kSharded;
  m.world_size = 2;
  m.user = R"({"run":"a"})";
  m.files = {{"shard-00000-of-00002.h5", 0, 100}, {"shard-00001-of-00002.h5", 1, 90}};
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
  for (const char* newer : {"2", "4294967297", "18446744073709551615"}) {
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
