// tests/tools/safetensors_test.cc: the safetensors module (ckpt/ops/safetensors.h) on its
// own, over libckpt's public API: files written and read back bit for bit, hostile headers,
// the F4 / F8_E8M0 / unsigned dtypes, and the Hub's sharded layout.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/ops/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

// A safetensors file from a header (as JSON text) and a data buffer, written raw.
void WriteRawSafetensors(const fs::path& p, const std::string& header, std::size_t data_len,
                         uint64_t claimed_len = 0) {
  std::ofstream out(p, std::ios::binary);
  uint64_t n = claimed_len ? claimed_len : header.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(n >> (8 * i)));
  out << header << std::string(data_len, '\x01');
}

std::string OpenError(const fs::path& p) {
  try {
    ops::SafetensorsReader::Open(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors: write then read back, bit for bit, with metadata") {
  ckpt_test::TempDir tmp("st");
  const fs::path p = tmp / "a.safetensors";
  std::vector<uint16_t> bf = {0x3f80, 0x7fc0, 0x0001};
  std::vector<double> f64 = {1.5, -2.25};
  {
    ops::SafetensorsWriter w(p, {{"x", DType::kBFloat16, {3}}, {"y", DType::kFloat64, {2, 1}}},
                             {{"format", "pt"}});
    w.Append(bf.data(), 2);  // in pieces
    w.Append(reinterpret_cast<uint8_t*>(bf.data()) + 2, 4);
    w.Append(f64.data(), 16);
    CHECK(!fs::exists(p));
    w.Commit();
  }
  auto r = ops::SafetensorsReader::Open(p);
  REQUIRE(r->tensors().size() == 2);
  CHECK(r->metadata() == std::vector<std::pair<std::string, std::string>>{{"format", "pt"}});
  const auto* y = r->Find("y");
  REQUIRE(y);
  CHECK(y->shape == Shape{2, 1});
  double back[2];
  r->ReadRegion(*y, Box::Full(y->shape), back);
  CHECK(back[0] == 1.5);
  CHECK(back[1] == -2.25);
  uint16_t bb[2];
  r->ReadRegion(*r->Find("x"), Box{{1}, {2}}, bb);
  CHECK(bb[0] == 0x7fc0);
  CHECK(bb[1] == 0x0001);
  for (DType d : kAllDTypes) CHECK(ops::DTypeFromSafetensors(ops::SafetensorsDTypeName(d)) == d);
}

TEST_CASE("safetensors: an uncommitted writer leaves nothing, and an incomplete one cannot commit") {
  ckpt_test::TempDir tmp("st");
  const fs::path p = tmp / "b.safetensors";
  {
    ops::SafetensorsWriter w(p, {{"x", DType::kFloat32, {4}}}, {});
    float v[2] = {1, 2};
    w.Append(v, 8);
    CHECK_THROWS_AS(w.Commit(), Error);
  }
  CHECK(!fs::exists(p));
  CHECK(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()) == 0);
}

TEST_CASE("safetensors: hostile headers are clear errors") {
  ckpt_test::TempDir tmp("st");
  const fs::path p = tmp / "bad.safetensors";
  auto check = [&](const std::string& header, std::size_t data, const std::string& expect, uint64_t claim = 0) {
    WriteRawSafetensors(p, header, data, claim);
    const std::string err = OpenError(p);
    INFO("header: " << header << " error: " << err);
    CHECK(err.find(expect) != std::string::npos);
    CHECK(err.find("bad.safetensors") != std::string::npos);
  };
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, "runs past the end", 1 << 20);
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
        12, "overlap");
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "run past the data buffer");
  check(R"({"a":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8, "unknown or unsupported dtype 'Q4'");
  check(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "data_offsets span 8");
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
        8, "duplicate key 'a'");
  check(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "gap");
  check(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904],"data_offsets":[0,8]}})", 8,
        "overflows");
  check(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "end before they begin");
  check(R"([1,2])", 0, "not a JSON object");
  check(R"({"a":)", 0, "not valid JSON");
  // Too short for the length field.
  {
    std::ofstream(p, std::ios::binary) << "abc";
  }
  CHECK(OpenError(p).find("too short") != std::string::npos);
}

TEST_CASE("safetensors F4: the header counts values, ckpt bytes of two; odd or 0-d shapes are refused") {
  ckpt_test::TempDir tmp("hub");
  const fs::path p = tmp.path() / "f4.safetensors";
  WriteRawSafetensors(p, R"({"q":{"dtype":"F4","shape":[3,8],"data_offsets":[0,12]},)"
                         R"("s":{"dtype":"F8_E8M0","shape":[3],"data_offsets":[12,15]},)"
                         R"("u":{"dtype":"U16","shape":[2],"data_offsets":[15,19]}})", 19);
  auto r = ops::SafetensorsReader::Open(p);
  REQUIRE(r->Find("q"));
  CHECK(r->Find("q")->dtype == DType::kFloat4E2M1FNx2);
  CHECK(r->Find("q")->shape == Shape{3, 4});
  CHECK(r->Find("s")->dtype == DType::kFloat8E8M0FNU);
  CHECK(r->Find("u")->dtype == DType::kUInt16);
  // Written back: [3, 8] again.
  const fs::path back = tmp.path() / "back.safetensors";
  {
    ops::SafetensorsWriter w(back, {{"q", DType::kFloat4E2M1FNx2, {3, 4}}}, {});
    std::vector<uint8_t> data(12, 0x21);
    w.Append(data.data(), data.size());
    w.Commit();
  }
  CHECK(ops::SafetensorsReader::Open(back)->Find("q")->shape == Shape{3, 4});
  std::ifstream in(back, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find(R"("shape":[3,8])") != std::string::npos);
  CHECK_THROWS_WITH_AS(ops::SafetensorsWriter(tmp.path() / "z.safetensors", {{"z", DType::kFloat4E2M1FNx2, {}}}, {}),
                       doctest::Contains("'z': a 0-d float4_e2m1fn_x2"), Error);
  const fs::path odd = tmp.path() / "odd.safetensors";
  WriteRawSafetensors(odd, R"({"q":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]}})", 3);
  CHECK(OpenError(odd).find("odd.safetensors: tensor 'q': F4 shape [2,3] has no float4_e2m1fn_x2 shape") !=
        std::string::npos);
  auto skipped = ops::SafetensorsReader::Open(odd, /*skip_unsupported=*/true);
  CHECK(skipped->tensors().empty());
  REQUIRE(skipped->skipped().size() == 1);
  CHECK(skipped->skipped()[0].second == "F4");
  const fs::path unknown = tmp.path() / "unknown.safetensors";
  WriteRawSafetensors(unknown, R"({"k":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", 3);
  CHECK(OpenError(unknown).find("unknown.safetensors: tensor 'k': unknown or unsupported dtype 'F6_E2M3'") !=
        std::string::npos);
}

TEST_CASE("safetensors shards: planned as huggingface_hub does, named as the Hub does") {
  using Plan = std::vector<std::vector<std::size_t>>;
  CHECK(ops::PlanSafetensorsShards({}, 10).empty());
  CHECK(ops::PlanSafetensorsShards({4, 4, 4}, 10) == Plan{{0, 1}, {2}});
  CHECK(ops::PlanSafetensorsShards({5, 5, 5}, 10) == Plan{{0, 1}, {2}});  // exactly the cap fits
  // A tensor over the cap is a shard of its own, placed where it is met, before the open shard.
  CHECK(ops::PlanSafetensorsShards({3, 20, 3, 5}, 10) == Plan{{1}, {0, 2}, {3}});
  CHECK(ops::PlanSafetensorsShards({0, 0, 11}, 10) == Plan{{2}, {0, 1}});
  CHECK(ops::SafetensorsShardName("model", 0, 3) == "model-00001-of-00003.safetensors");
  CHECK(ops::SafetensorsShardName("diffusion_pytorch_model", 11, 12) ==
        "diffusion_pytorch_model-00012-of-00012.safetensors");
  ckpt_test::TempDir tmp("hub");
  const fs::path idx = tmp.path() / "model.safetensors.index.json";
  ops::WriteSafetensorsIndex(idx, 42, {{"b", "model-00002-of-00002.safetensors"}, {"a", "model-00001-of-00002.safetensors"}});
  std::ifstream in(idx);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text ==
        "{\n  \"metadata\": {\n    \"total_size\": 42\n  },\n  \"weight_map\": {\n"
        "    \"a\": \"model-00001-of-00002.safetensors\",\n    \"b\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");
  const auto read = ops::ReadSafetensorsIndex(idx);
  CHECK(read.total_size == uint64_t{42});
  CHECK(read.files.size() == 2);
  CHECK(ops::FindSafetensorsIndex(tmp.path()) == idx);
  CHECK(ops::FindSafetensorsIndex(idx) == idx);
  CHECK(!ops::FindSafetensorsIndex(tmp.path() / "model.safetensors"));
}
