// Packs (FORMAT.md §5.7): small chunks share pack datasets. Round trips of thousands of
// small chunks among big ones, resharded; the records and the HDF5 layout they make; and
// hostile pack records (digests recomputed, tests/ckpt_edit.h): each a kCorrupt naming the
// file and the key, on load and in ckpt-verify.
#include <doctest/doctest.h>

#include <hdf5.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "ckpt/ckpt.h"
#include "ckpt/ops/merge.h"
#include "ckpt/ops/verify.h"
#include "ckpt_edit.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ckpt;
using ckpt_test::TempDir;
using json = nlohmann::json;

namespace {

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt64, DType::kUInt8, DType::kFloat64};

// Tensor i: 1-D, of a random small size (a few big ones), split into `world` row ranges
// held round robin; its bytes are a function of (i, element).
struct Spec {
  std::string key;
  DType dtype;
  int64_t n;
};

std::vector<Spec> Specs(int small, int big) {
  std::mt19937 rng(7);
  std::vector<Spec> out;
  for (int i = 0; i < small + big; ++i) {
    const bool is_big = i % ((small + big) / big) == 0;
    const DType dt = kDTypes[rng() % std::size(kDTypes)];
    const int64_t n = is_big ? 40000 + static_cast<int64_t>(rng() % 30000) : 1 + static_cast<int64_t>(rng() % 700);
    out.push_back({"t." + std::to_string(i), dt, n});
  }
  return out;
}

// The tensor's bytes, a function of its key and position.
std::vector<uint8_t> Whole(const Spec& s) {
  std::vector<uint8_t> b(static_cast<std::size_t>(s.n) * DTypeSize(s.dtype));
  const uint64_t salt = std::hash<std::string>{}(s.key);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>((salt >> (i % 7)) + i * 31);
  return b;
}

// (start, length) of `parts` nearly even pieces of n elements (n >= parts: none empty);
// one piece of all of them when n is smaller.
std::vector<std::pair<int64_t, int64_t>> Parts(int64_t n, int parts) {
  if (n < parts) return std::vector<std::pair<int64_t, int64_t>>(static_cast<std::size_t>(parts), {0, n});
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = 0;
  for (int p = 0; p < parts; ++p) {
    const int64_t len = p + 1 == parts ? n - at : std::min<int64_t>(n - at, (n + p) / parts);
    out.emplace_back(at, len);
    at += len;
  }
  return out;
}

void SaveSpecs(const fs::path& dir, const std::vector<Spec>& specs, int world, uint64_t pack_bytes) {
  RunThreads(world, [&](Comm& comm) {
    std::vector<std::vector<uint8_t>> keep;
    keep.reserve(specs.size() * 2);
    StateDict sd;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const Spec& s = specs[i];
      const std::vector<uint8_t> whole = Whole(s);
      const std::size_t item = DTypeSize(s.dtype);
      std::vector<Chunk> chunks;
      // Every fourth tensor whole on one rank, the others cut over all ranks.
      const int parts = i % 4 == 0 || s.n < world ? 1 : world;
      const auto cut = Parts(s.n, parts);
      for (int p = 0; p < parts; ++p) {
        if ((parts == 1 ? static_cast<int>(i % world) : p) != comm.rank()) continue;
        keep.emplace_back(whole.begin() + cut[p].first * item, whole.begin() + (cut[p].first + cut[p].second) * item);
        chunks.push_back(Chunk{Box{{cut[p].first}, {cut[p].second}}, keep.back().data()});
      }
      if (!chunks.empty()) sd.Add(s.key, Tensor::Sharded(s.dtype, {s.n}, std::move(chunks)));
    }
    sd.Add("step", Scalar::Int(3));
    SaveOptions opt;
    opt.pack_bytes = pack_bytes;
    Save(dir, sd, comm, opt);
  });
}

// Loads with `world` ranks, each rank a range of every tensor (cut otherwise than saved;
// a tensor smaller than the world whole on every rank); every byte compared.
void LoadAndCheck(const fs::path& dir, const std::vector<Spec>& specs, int world) {
  RunThreads(world, [&](Comm& comm) {
    std::vector<std::vector<uint8_t>> bufs;
    bufs.reserve(specs.size());
    StateDict sd;
    std::vector<std::pair<std::size_t, std::pair<int64_t, int64_t>>> expect;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const Spec& s = specs[i];
      const auto part = Parts(s.n, world)[comm.rank()];
      bufs.emplace_back(static_cast<std::size_t>(part.second) * DTypeSize(s.dtype), 0xEE);
      sd.Add(s.key, Tensor::Slice(s.dtype, {s.n}, 0, part.first, part.second, bufs.back().data()));
      expect.push_back({i, part});
    }
    sd.Add("step", Scalar{});
    Load(dir, sd, comm);
    int bad = 0;
    for (std::size_t j = 0; j < expect.size(); ++j) {
      const Spec& s = specs[expect[j].first];
      const std::vector<uint8_t> whole = Whole(s);
      const std::size_t item = DTypeSize(s.dtype);
      const auto [from, len] = expect[j].second;
      if (!std::equal(bufs[j].begin(), bufs[j].end(), whole.begin() + from * item) ||
          bufs[j].size() != static_cast<std::size_t>(len) * item)
        ++bad;
    }
    CHECK(bad == 0);
  });
}

// Packed records and pack datasets in every shard of `dir`.
struct PackCensus {
  int packed = 0, unpacked = 0;
  std::set<std::string> packs;
};
PackCensus Census(const fs::path& dir) {
  PackCensus c;
  const json m = ckpt_test::ReadMetaJson(dir);
  for (const auto& f : m["files"]) {
    const json index = ckpt_test::ReadIndexJson(dir / f["name"].get<std::string>());
    for (const auto& r : index["chunks"]) {
      if (r.contains("pack_offset")) {
        ++c.packed;
        c.packs.insert(f["name"].get<std::string>() + "/" + r["dataset"].get<std::string>());
      } else {
        ++c.unpacked;
      }
    }
  }
  return c;
}

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("thousands of small chunks among big ones: packed, loaded resharded bit-identical, verified") {
  const auto specs = Specs(3000, 12);
  TempDir tmp("pack");
  SaveSpecs(tmp / "ck", specs, 3, SaveOptions{}.pack_bytes);
  const PackCensus c = Census(tmp / "ck");
  // Every small chunk packed (a few MiB of them: a handful of packs a shard), no big one.
  CHECK(c.packed > 3000);
  CHECK(c.unpacked <= 12 * 3);
  CHECK(c.packs.size() >= 3);
  CHECK(c.packs.size() < 40);
  for (int m : {1, 2, 5}) {
    CAPTURE(m);
    LoadAndCheck(tmp / "ck", specs, m);
  }
  ops::VerifyOptions vo;
  const ops::VerifyReport r = ops::Verify(tmp / "ck", vo);
  for (const auto& p : r.problems) CAPTURE(p.message);
  CHECK(r.ok());
  vo.quick = true;
  CHECK(ops::Verify(tmp / "ck", vo).ok());

  // The Reader API: a region inside one packed chunk, and the chunk's place in its file.
  const auto reader = CheckpointReader::Open(tmp / "ck");
  const Spec& s = specs[1];
  REQUIRE(s.n > 4);
  std::vector<uint8_t> part(3 * DTypeSize(s.dtype));
  reader->ReadRegion(s.key, Box{{1}, {3}}, part.data());
  const auto whole = Whole(s);
  CHECK(std::equal(part.begin(), part.end(), whole.begin() + DTypeSize(s.dtype)));
  const auto range = reader->LocateChunk(s.key, 0);
  REQUIRE(range);
  CHECK(range->length == reader->metadata().Find(s.key)->chunks.at(0).stored_bytes);
  reader->VerifyChunk(s.key, 0);

  // A merge that packs its output too (CheckpointWriter::Options::pack_bytes): into 2
  // files, the chunks recut; loaded bit-identical, verified.
  ops::MergeOptions mo;
  mo.world = 2;
  mo.pack_bytes = SaveOptions{}.pack_bytes;
  mo.copy_min_bytes = uint64_t{1} << 30;  // every chunk through memory
  ops::Merge(tmp / "ck", tmp / "merged", mo);
  const PackCensus mc = Census(tmp / "merged");
  CHECK(mc.packed > 3000);
  CHECK(mc.packs.size() < 40);
  CHECK(ops::Verify(tmp / "merged", {}).ok());
  LoadAndCheck(tmp / "merged", specs, 3);

  // pack_bytes 0: a dataset a chunk, as before packs.
  SaveSpecs(tmp / "plain", specs, 2, 0);
  const PackCensus u = Census(tmp / "plain");
  CHECK(u.packed == 0);
  CHECK(u.packs.empty());
  LoadAndCheck(tmp / "plain", specs, 3);
}

namespace {

// Two small float32 tensors a and b and a big one in one shard: a and b packed together.
struct PackFixture {
  TempDir tmp{"packbad"};
  fs::path dir = tmp / "ck";
  std::vector<float> a = std::vector<float>(10, 1.5f), b = std::vector<float>(20, 2.5f),
                     big = std::vector<float>(20000, 3.5f);
  PackFixture() {
    StateDict sd;
    sd.Add("a", Tensor::Full(DType::kFloat32, {10}, a.data()));
    sd.Add("b", Tensor::Full(DType::kFloat32, {20}, b.data()));
    sd.Add("big", Tensor::Full(DType::kFloat32, {20000}, big.data()));
    SingleComm comm;
    Save(dir, sd, comm);
    const json index = Index();
    int packed = 0;
    for (const auto& r : index["chunks"]) packed += r.contains("pack_offset");
    REQUIRE(packed == 2);
  }
  std::string Shard() const { return ckpt_test::ReadMetaJson(dir)["files"][0]["name"].get<std::string>(); }
  json Index() const { return ckpt_test::ReadIndexJson(dir / Shard()); }
  template <typename Edit>
  void EditRecord(const std::string& key, Edit edit) const {
    json index = Index();
    for (auto& r : index["chunks"])
      if (r["key"] == key) edit(r);
    ckpt_test::WriteIndexJson(dir, 0, index);
  }
  json Record(const std::string& key) const {
    const json index = Index();
    for (const auto& r : index["chunks"])
      if (r["key"] == key) return r;
    FAIL("no record");
    return {};
  }
  // The load's error ("" if it loaded: then every value is checked).
  std::string LoadError(ErrorCode* code) const {
    std::vector<float> oa(10), ob(20), obig(20000);
    StateDict sd;
    sd.Add("a", Tensor::Full(DType::kFloat32, {10}, oa.data()));
    sd.Add("b", Tensor::Full(DType::kFloat32, {20}, ob.data()));
    sd.Add("big", Tensor::Full(DType::kFloat32, {20000}, obig.data()));
    SingleComm comm;
    try {
      Load(dir, sd, comm);
    } catch (const Error& e) {
      *code = e.code();
      return e.what();
    }
    CHECK(oa == a);
    CHECK(ob == b);
    CHECK(obig == big);
    return "";
  }
  // Load fails kCorrupt naming the shard, one of `keys` and `what`; ckpt-verify fails too,
  // naming one of them.
  void ExpectCorrupt(const std::vector<std::string>& keys, const std::string& what) const {
    auto names_key = [&](const std::string& text, const std::string& key_field) {
      for (const auto& k : keys)
        if (Has(text, "'" + k + "'") || key_field == k) return true;
      return false;
    };
    ErrorCode code{};
    const std::string e = LoadError(&code);
    CAPTURE(e);
    CHECK(code == ErrorCode::kCorrupt);
    CHECK(Has(e, Shard()));
    CHECK(names_key(e, ""));
    CHECK(Has(e, what));
    const ops::VerifyReport r = ops::Verify(dir, {});
    CHECK_FALSE(r.ok());
    bool named = false;
    for (const auto& p : r.problems) named = named || names_key(p.message, p.key);
    CHECK(named);
  }
};

}  // namespace

TEST_CASE("a packed record whose bytes lie outside its pack") {
  PackFixture f;
  f.EditRecord("b", [](json& r) {
    r["pack_offset"] = r["pack_offset"].get<uint64_t>() + 64;
    r["offset"] = r["offset"].get<uint64_t>() + 64;
  });
  f.ExpectCorrupt({"b"}, "outside");
}

TEST_CASE("two packed records that overlap") {
  PackFixture f;
  const json a = f.Record("a");
  f.EditRecord("b", [&](json& r) {
    r["pack_offset"] = a["pack_offset"].get<uint64_t>() + 4;
    r["offset"] = a["offset"].get<uint64_t>() + 4;
  });
  f.ExpectCorrupt({"b"}, "overlap");
}

TEST_CASE("a packed record whose offset and pack_offset disagree with its pack's other members") {
  PackFixture f;
  f.EditRecord("b", [](json& r) { r["offset"] = r["offset"].get<uint64_t>() + 8; });
  f.ExpectCorrupt({"b"}, "pack");
}

TEST_CASE("a packed record naming a dataset that is not a pack") {
  PackFixture f;
  f.EditRecord("b", [](json& r) { r["dataset"] = "big"; });
  f.ExpectCorrupt({"b"}, "not a pack");
}

TEST_CASE("a packed record that is compressed, or has no offset") {
  PackFixture f;
  f.EditRecord("b", [](json& r) { r.erase("offset"); });
  f.ExpectCorrupt({"b"}, "pack_offset");
}

TEST_CASE("a pack dataset of the wrong dtype or shape") {
  for (const bool two_d : {false, true}) {
    CAPTURE(two_d);
    PackFixture f;
    const std::string pack = f.Record("a")["dataset"].get<std::string>();
    const fs::path shard = f.dir / f.Shard();
    {
      ckpt::h5::Init();
      auto file = ckpt::h5::File(H5Fopen(shard.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
      REQUIRE(file);
      REQUIRE(H5Ldelete(file.get(), pack.c_str(), H5P_DEFAULT) >= 0);
      const hsize_t dims[2] = {two_d ? hsize_t{10} : hsize_t{30}, 3};
      auto space = ckpt::h5::Space(H5Screate_simple(two_d ? 2 : 1, dims, nullptr));
      auto ds = ckpt::h5::Dataset(H5Dcreate2(file.get(), pack.c_str(), two_d ? H5T_STD_U8LE : H5T_IEEE_F32LE,
                                             space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
      REQUIRE(ds);
      std::vector<float> zeros(30 * 3);
      REQUIRE(H5Dwrite(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros.data()) >= 0);
    }
    ckpt_test::RecordIndexDigest(f.dir, 0);
    f.ExpectCorrupt({"a", "b"}, "not a 1-D uint8 dataset");
  }
}

TEST_CASE("merge reads packed chunks; a virtual file copies them, read and checked") {
  PackFixture f;
  // A copy into one file, read back whole.
  ops::MergeOptions o;
  ops::Merge(f.dir, f.tmp / "merged", o);
  CHECK(ops::Verify(f.tmp / "merged", {}).ok());
  const auto reader = CheckpointReader::Open(f.tmp / "merged");
  std::vector<float> b(20);
  reader->ReadRegion("b", Box::Full({20}), b.data());
  CHECK(b == f.b);
  // Virtual datasets: the packed 'a' and 'b' are copied into the file (a mapping cannot
  // retype a pack's bytes), 'big' is mapped; HDF5 alone reads each by its key.
  o.virtual_file = true;
  const auto report = ops::Merge(f.dir, f.tmp / "virtual.h5", o);
  CHECK(report.tensors == 3);
  {
    ckpt::h5::Init();
    auto file = ckpt::h5::File(H5Fopen((f.tmp / "virtual.h5").c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    REQUIRE(file);
    for (const auto& [key, want] : {std::pair{"a", &f.a}, {"b", &f.b}, {"big", &f.big}}) {
      CAPTURE(key);
      auto ds = ckpt::h5::Dataset(H5Dopen2(file.get(), key, H5P_DEFAULT));
      REQUIRE(ds);
      auto dcpl = ckpt::h5::Plist(H5Dget_create_plist(ds.get()));
      CHECK((H5Pget_layout(dcpl.get()) == H5D_VIRTUAL) == (std::string(key) == "big"));
      std::vector<float> got(want->size());
      REQUIRE(H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, got.data()) >= 0);
      CHECK(got == *want);
    }
  }
  // A packed chunk whose bytes changed is refused as any read is, naming the key; nothing
  // is left behind.
  {
    std::fstream shard(f.dir / f.Shard(), std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(f.Record("b")["offset"].get<std::streamoff>() + 4);
    shard.put('\x7f');
  }
  try {
    ops::Merge(f.dir, f.tmp / "virtual2.h5", o);
    FAIL("a virtual merge copied a changed packed chunk");
  } catch (const Error& e) {
    CHECK(Has(e.what(), "'b'"));
  }
  CHECK_FALSE(fs::exists(f.tmp / "virtual2.h5"));
}
