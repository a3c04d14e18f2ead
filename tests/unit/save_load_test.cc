// Save/load round trips over random layouts, world sizes and dtypes; replicas; commit.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <random>

#include "checkpoint/save.h"
#include "ckpt/ckpt.h"
#include "fault/fault_fs.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ckpt;
using ckpt_test::TempDir;

namespace {

// A global tensor with deterministic bytes, and helpers to cut it into boxes.
struct Global {
  std::string key;
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

std::vector<uint8_t> Extract(const Global& g, const Box& box) {
  const std::size_t item = DTypeSize(g.dtype);
  std::vector<uint8_t> out(static_cast<std::size_t>(box.NumElements()) * item);
  // Element-by-element reference copy (deliberately not the library's run logic).
  const std::size_t rank = g.shape.size();
  std::vector<int64_t> idx(rank, 0);
  for (int64_t n = 0; n < box.NumElements(); ++n) {
    int64_t rem = n, src = 0, stride = 1;
    for (std::size_t d = rank; d-- > 0;) {
      idx[d] = rem % box.sizes[d];
      rem /= box.sizes[d];
    }
    for (std::size_t d = rank; d-- > 0;) {
      src += (idx[d] + box.offsets[d]) * stride;
      stride *= g.shape[d];
    }
    std::memcpy(out.data() + n * item, g.bytes.data() + src * item, item);
  }
  return out;
}

// Splits `shape` into `parts` boxes: along one dim (uneven), or a 2-D grid.
std::vector<Box> Split(const Shape& shape, int parts, std::mt19937& rng) {
  std::vector<Box> boxes;
  if (shape.empty()) {
    boxes.push_back(Box{});  // a 0-D tensor: every rank holds it (replicated)
    return boxes;
  }
  auto cut = [&](int64_t extent, int n) {
    std::vector<int64_t> points{0, extent};
    for (int i = 1; i < n; ++i) points.push_back(std::uniform_int_distribution<int64_t>(0, extent)(rng));
    std::sort(points.begin(), points.end());
    return points;
  };
  const bool grid = shape.size() >= 2 && parts >= 4 && parts % 2 == 0 && rng() % 2;
  if (grid) {
    const auto a = cut(shape[0], parts / 2), b = cut(shape[1], 2);
    for (std::size_t i = 0; i + 1 < a.size(); ++i) {
      for (std::size_t j = 0; j + 1 < b.size(); ++j) {
        Box box = Box::Full(shape);
        box.offsets[0] = a[i];
        box.sizes[0] = a[i + 1] - a[i];
        box.offsets[1] = b[j];
        box.sizes[1] = b[j + 1] - b[j];
        boxes.push_back(box);
      }
    }
    return boxes;
  }
  const int dim = static_cast<int>(rng() % shape.size());
  const auto p = cut(shape[dim], parts);
  for (std::size_t i = 0; i + 1 < p.size(); ++i) {
    Box box = Box::Full(shape);
    box.offsets[dim] = p[i];
    box.sizes[dim] = p[i + 1] - p[i];
    boxes.push_back(box);
  }
  return boxes;
}

std::vector<Global> MakeTensors(std::mt19937& rng, int count) {
  std::vector<Global> out;
  for (int i = 0; i < count; ++i) {
    Global g;
    g.key = "model.layers." + std::to_string(i) + ".w";
    g.dtype = kAllDTypes[rng() % std::size(kAllDTypes)];
    const int rank = static_cast<int>(rng() % 5);
    for (int d = 0; d < rank; ++d) g.shape.push_back(static_cast<int64_t>(rng() % 7));  // includes 0 extents
    if (rng() % 4 == 0 && rank > 0) g.shape[0] = 37;
    g.bytes = ckpt_test::RandomBytes(static_cast<std::size_t>(NumElements(g.shape)) * DTypeSize(g.dtype), rng());
    out.push_back(std::move(g));
  }
  return out;
}

// Assigns each box to a rank (round robin) and builds that rank's state dict.
struct Layout {
  std::map<std::string, std::vector<Box>> boxes;  // per key, box i goes to rank i % world
};

Layout MakeLayout(const std::vector<Global>& ts, int world, std::mt19937& rng) {
  Layout l;
  for (const auto& g : ts) l.boxes[g.key] = Split(g.shape, world, rng);
  return l;
}

// Save `ts` with `world` ranks in layout `l`.
void SaveAll(const fs::path& dir, const std::vector<Global>& ts, const Layout& l, int world, SaveOptions opts = {}) {
  RunThreads(world, [&](Comm& comm) {
    std::vector<std::vector<uint8_t>> keep;
    keep.reserve(64);
    StateDict sd;
    for (const auto& g : ts) {
      std::vector<Chunk> chunks;
      const auto& boxes = l.boxes.at(g.key);
      for (std::size_t i = 0; i < boxes.size(); ++i) {
        // 0-D tensors are held by every rank (replicas); others round robin.
        if (!g.shape.empty() && static_cast<int>(i % world) != comm.rank()) continue;
        keep.push_back(Extract(g, boxes[i]));
        chunks.push_back(Chunk{boxes[i], keep.back().data()});
      }
      sd.Add(g.key, Tensor::Sharded(g.dtype, g.shape, std::move(chunks)));
    }
    sd.Add("step", Scalar::Int(1234));
    sd.Add("lr", Scalar::Float(3e-4, DType::kFloat32));
    sd.Add("config", Json{R"({"layers": 3, "name": "tiny"})"});
    sd.Add("rng.rank" + std::to_string(comm.rank()), Bytes{ckpt_test::RandomBytes(100 + comm.rank(), comm.rank())});
    Save(dir, sd, comm, opts);
  });
}

// Load with `world` ranks in layout `l` and compare every byte.
void LoadAndCheck(const fs::path& dir, const std::vector<Global>& ts, const Layout& l, int world, int saved_world,
                  int io_threads = LoadOptions{}.io_threads) {
  RunThreads(world, [&](Comm& comm) {
    std::vector<std::vector<uint8_t>> bufs;
    bufs.reserve(1024);
    std::vector<std::pair<const Global*, Box>> expect;
    StateDict sd;
    for (const auto& g : ts) {
      std::vector<Chunk> chunks;
      const auto& boxes = l.boxes.at(g.key);
      for (std::size_t i = 0; i < boxes.size(); ++i) {
        if (static_cast<int>(i % world) != comm.rank()) continue;
        bufs.emplace_back(static_cast<std::size_t>(boxes[i].NumElements()) * DTypeSize(g.dtype), 0xEE);
        chunks.push_back(Chunk{boxes[i], bufs.back().data()});
        expect.emplace_back(&g, boxes[i]);
      }
      sd.Add(g.key, Tensor::Sharded(g.dtype, g.shape, std::move(chunks)));
    }
    sd.Add("step", Scalar{});
    sd.Add("lr", Scalar{});
    sd.Add("config", Json{});
    for (int r = 0; r < saved_world; ++r) sd.Add("rng.rank" + std::to_string(r), Bytes{});
    LoadOptions options;
    options.io_threads = io_threads;
    Load(dir, sd, comm, options);
    for (std::size_t i = 0; i < expect.size(); ++i) {
      const auto want = Extract(*expect[i].first, expect[i].second);
      CHECK_MESSAGE(bufs[i] == want, expect[i].first->key, " ", expect[i].second.ToString());
    }
    CHECK(std::get<Scalar>(sd.At("step")).AsInt() == 1234);
    CHECK(std::get<Scalar>(sd.At("lr")).AsDouble() == doctest::Approx(3e-4));
    CHECK(std::get<Json>(sd.At("config")).text.find("tiny") != std::string::npos);
    CHECK(std::get<Bytes>(sd.At("rng.rank0")).data == ckpt_test::RandomBytes(100, 0));
  });
}

}  // namespace

TEST_CASE("round trip: saved by W ranks, loaded by M ranks in another layout, bit-identical") {
  std::mt19937 rng(42);
  for (int w : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 5}) {
      CAPTURE(w);
      CAPTURE(m);
      TempDir tmp("rt");
      const auto ts = MakeTensors(rng, 14);
      const Layout saved = MakeLayout(ts, w, rng);
      const Layout loaded = MakeLayout(ts, m, rng);
      SaveAll(tmp / "ck", ts, saved, w);
      LoadAndCheck(tmp / "ck", ts, loaded, m, w);
      // Stored chunks are read in file order by however many readers: each reader's parts
      // of a chunk land where they belong, whichever reader takes them.
      for (int readers : {1, 3}) LoadAndCheck(tmp / "ck", ts, loaded, m, w, readers);
      // The metadata records what was saved.
      const Metadata md = ReadMetadata(tmp / "ck");
      CHECK(md.world_size == w);
      CHECK(md.state_dict_type == StateDictType::kSharded);
      for (const auto& g : ts) {
        const EntryMeta* e = md.Find(g.key);
        REQUIRE(e);
        CHECK(e->shape == g.shape);
        CHECK(e->dtype == g.dtype);
        CHECK(CheckTiling(g.key, *e).empty());
      }
    }
  }
}

TEST_CASE("every dtype round-trips as a full tensor, with statistics for floating dtypes") {
  TempDir tmp("dt");
  std::vector<std::vector<uint8_t>> data;
  StateDict sd;
  for (DType dt : kAllDTypes) {
    data.push_back(ckpt_test::RandomBytes(6 * 5 * DTypeSize(dt), static_cast<uint64_t>(dt)));
    sd.Add(std::string("t.") + std::string(DTypeName(dt)), Tensor::Full(dt, {6, 5}, data.back().data()));
  }
  SingleComm comm;
  Save(tmp / "ck", sd, comm);
  const Metadata md = ReadMetadata(tmp / "ck");
  auto reader = CheckpointReader::Open(tmp / "ck");
  std::size_t i = 0;
  for (DType dt : kAllDTypes) {
    const std::string key = std::string("t.") + std::string(DTypeName(dt));
    std::vector<uint8_t> back(data[i].size());
    reader->ReadRegion(key, Box::Full({6, 5}), back.data());
    CHECK(back == data[i]);
    const EntryMeta* e = md.Find(key);
    REQUIRE(e);
    CHECK(e->chunks[0].stats.has_value() == IsFloating(dt));
    ++i;
  }
}

TEST_CASE("statistics are exact for float32 with NaN and Inf") {
  TempDir tmp("st");
  std::vector<float> v(10000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 100) - 50.0f;
  v[17] = std::numeric_limits<float>::quiet_NaN();
  v[9000] = std::numeric_limits<float>::infinity();
  double sum = 0, sumsq = 0;
  int64_t finite = 0;
  for (float x : v) {
    if (std::isfinite(x)) {
      sum += x;
      sumsq += double(x) * x;
      ++finite;
    }
  }
  StateDict sd;
  sd.Add("w", Tensor::Full(DType::kFloat32, {10000}, v.data()));
  SingleComm comm;
  Save(tmp / "ck", sd, comm);
  const auto s = *ReadMetadata(tmp / "ck").Find("w")->chunks[0].stats;
  CHECK(s.nan_count == 1);
  CHECK(s.inf_count == 1);
  CHECK(s.finite_count == finite);
  CHECK(s.min == -50.0);
  CHECK(s.max == 49.0);
  CHECK(s.mean == doctest::Approx(sum / finite));
  CHECK(s.l2 == doctest::Approx(std::sqrt(sumsq)));
}

TEST_CASE("a replicated tensor is stored once, by one rank, after its copies are compared") {
  TempDir tmp("rep");
  std::vector<float> w(1000, 1.5f);
  RunThreads(4, [&](Comm& comm) {
    std::vector<float> mine = w;  // each rank its own copy
    StateDict sd;
    sd.Add("model.w", Tensor::Full(DType::kFloat32, {10, 100}, mine.data()));
    Save(tmp / "ck", sd, comm);
  });
  const Metadata md = ReadMetadata(tmp / "ck");
  REQUIRE(md.Find("model.w")->chunks.size() == 1);
  CHECK(md.files.size() == 1);
  // Count datasets in all shard files: exactly one for the tensor.
  int shards = 0;
  for (const auto& f : fs::directory_iterator(tmp / "ck")) shards += f.path().extension() == ".h5";
  CHECK(shards == 1);

  SUBCASE("replicas that differ are an error naming the key and ranks") {
    CHECK_THROWS_WITH_AS(RunThreads(3,
                                    [&](Comm& comm) {
                                      std::vector<float> mine = w;
                                      if (comm.rank() == 2) mine[5] = 7.0f;
                                      StateDict sd;
                                      sd.Add("model.w", Tensor::Full(DType::kFloat32, {10, 100}, mine.data()));
                                      Save(tmp / "ck2", sd, comm);
                                    }),
                         doctest::Contains("model.w"), Error);
    CHECK_FALSE(fs::exists(tmp / "ck2"));
  }
}

TEST_CASE("replicated regions are spread over ranks to balance bytes") {
  TempDir tmp("bal");
  std::vector<std::vector<float>> ws(8, std::vector<float>(256, 2.0f));
  RunThreads(4, [&](Comm& comm) {
    StateDict sd;
    for (int i = 0; i < 8; ++i) sd.Add("w" + std::to_string(i), Tensor::Full(DType::kFloat32, {256}, ws[i].data()));
    Save(tmp / "ck", sd, comm);
  });
  CHECK(ReadMetadata(tmp / "ck").files.size() == 4);
}

TEST_CASE("overlapping claims and disagreeing ranks are rejected before anything is written") {
  TempDir tmp("ov");
  std::vector<float> buf(100, 1.0f);
  CHECK_THROWS_WITH_AS(RunThreads(2,
                                  [&](Comm& comm) {
                                    StateDict sd;
                                    // rank 0 rows [0,6), rank 1 rows [4,10): overlap
                                    const int64_t begin = comm.rank() == 0 ? 0 : 4;
                                    sd.Add("w", Tensor::Slice(DType::kFloat32, {10, 10}, 0, begin, 6, buf.data()));
                                    Save(tmp / "ck", sd, comm);
                                  }),
                       doctest::Contains("overlap"), Error);
  CHECK_THROWS_WITH_AS(RunThreads(2,
                                  [&](Comm& comm) {
                                    StateDict sd;
                                    const DType dt = comm.rank() == 0 ? DType::kFloat32 : DType::kInt32;
                                    sd.Add("w", Tensor::Slice(dt, {10, 10}, 0, comm.rank() * 5, 5, buf.data()));
                                    Save(tmp / "ck", sd, comm);
                                  }),
                       doctest::Contains("int32"), Error);
  CHECK_THROWS_WITH_AS(RunThreads(2,
                                  [&](Comm& comm) {
                                    StateDict sd;  // rows [0,3) and [5,10): a gap
                                    const int64_t begin = comm.rank() == 0 ? 0 : 5;
                                    const int64_t count = comm.rank() == 0 ? 3 : 5;
                                    sd.Add("w", Tensor::Slice(DType::kFloat32, {10, 10}, 0, begin, count, buf.data()));
                                    Save(tmp / "ck", sd, comm);
                                  }),
                       doctest::Contains("gap"), Error);
  CHECK_FALSE(fs::exists(tmp / "ck"));
  for (const auto& f : fs::directory_iterator(tmp.path())) FAIL("left behind: " << f.path());
}

TEST_CASE("a rank failing mid-save: no commit, every rank throws, the previous checkpoint is intact") {
  TempDir tmp("fail");
  std::vector<float> v1(64, 1.0f), v2(64, 2.0f);
  RunThreads(3, [&](Comm& comm) {
    StateDict sd;
    sd.Add("w", Tensor::Full(DType::kFloat32, {64}, v1.data()));
    Save(tmp / "ck", sd, comm);
  });
  const std::string before = ReadMetadata(tmp / "ck").entries[0].second.chunks[0].checksum;
  std::atomic<int> threw{0};
  // Rank 1's disk fills up: the first file operation on its shard fails (the seam).
  ckpt_test::FaultFs disk_full(1, ENOSPC, "shard-00001-of-00003.h5");
  ckpt_test::Installed injected(disk_full);
  CHECK_THROWS_WITH_AS(RunThreads(3,
                                  [&](Comm& comm) {
                                    StateDict sd;
                                    sd.Add("w", Tensor::Slice(DType::kFloat32, {64}, 0, comm.rank() * 20,
                                                              comm.rank() == 2 ? 24 : 20, v2.data()));
                                    SaveOptions o;
                                    o.overwrite = true;
                                    try {
                                      Save(tmp / "ck", sd, comm, o);
                                    } catch (const Error&) {
                                      ++threw;
                                      throw;
                                    }
                                  }),
                       doctest::Contains("shard-00001-of-00003.h5: open: No space left on device"), Error);
  CHECK(disk_full.fired());
  CHECK(threw == 3);
  CHECK(ReadMetadata(tmp / "ck").entries[0].second.chunks[0].checksum == before);
  std::vector<float> back(64);
  CheckpointReader::Open(tmp / "ck")->ReadRegion("w", Box::Full({64}), back.data());
  CHECK(back == v1);
  int entries = 0;
  for (const auto& f : fs::directory_iterator(tmp.path())) {
    (void)f;
    ++entries;
  }
  CHECK(entries == 1);  // no staging directory left behind
}

TEST_CASE("saving over a checkpoint needs overwrite, which swaps atomically") {
  TempDir tmp("ow");
  std::vector<int32_t> a(8, 1), b(8, 2);
  SingleComm comm;
  StateDict sa, sb;
  sa.Add("x", Tensor::Full(DType::kInt32, {8}, a.data()));
  sb.Add("x", Tensor::Full(DType::kInt32, {8}, b.data()));
  Save(tmp / "ck", sa, comm);
  CHECK_THROWS_AS(Save(tmp / "ck", sb, comm), Error);
  SaveOptions o;
  o.overwrite = true;
  Save(tmp / "ck", sb, comm, o);
  std::vector<int32_t> back(8);
  CheckpointReader::Open(tmp / "ck")->ReadRegion("x", Box::Full({8}), back.data());
  CHECK(back == b);
  // A directory that is not a checkpoint is never replaced.
  fs::create_directories(tmp / "other");
  std::ofstream(tmp / "other" / "keep.txt") << "precious";
  CHECK_THROWS_WITH_AS(Save(tmp / "other", sb, comm, o), doctest::Contains("neither empty nor a checkpoint"), Error);
  CHECK(fs::exists(tmp / "other" / "keep.txt"));
}

TEST_CASE("load reports missing, unexpected and mismatched keys together; non-strict loads the rest") {
  TempDir tmp("keys");
  std::vector<float> a(4, 1.0f), b(4, 2.0f);
  SingleComm comm;
  StateDict sd;
  sd.Add("a", Tensor::Full(DType::kFloat32, {4}, a.data()));
  sd.Add("b", Tensor::Full(DType::kFloat32, {4}, b.data()));
  sd.Add("old", Scalar::Int(1));
  Save(tmp / "ck", sd, comm);

  std::vector<float> ra(4, 0.0f), rb(2, 0.0f), rc(4, 0.0f);
  StateDict target;
  target.Add("a", Tensor::Full(DType::kFloat32, {4}, ra.data()));
  target.Add("b", Tensor::Full(DType::kFloat32, {2}, rb.data()));
  target.Add("c", Tensor::Full(DType::kFloat32, {4}, rc.data()));
  try {
    Load(tmp / "ck", target, comm);
    FAIL("expected a mismatch");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(e.code() == ErrorCode::kMismatch);
    CHECK(m.find("missing keys (1)") != std::string::npos);
    CHECK(m.find("c") != std::string::npos);
    CHECK(m.find("unexpected keys (1)") != std::string::npos);
    CHECK(m.find("shape [0:4] in the checkpoint, [0:2] in the target") != std::string::npos);
  }
  CHECK(ra == std::vector<float>(4, 0.0f));  // strict: nothing read
  LoadOptions lo;
  lo.strict = false;
  const LoadReport r = Load(tmp / "ck", target, comm, lo);
  CHECK(r.missing_keys == std::vector<std::string>{"c"});
  CHECK(r.unexpected_keys == std::vector<std::string>{"old"});
  CHECK(r.mismatched.size() == 1);
  CHECK(ra == a);
}

TEST_CASE("LOCAL loads only into LOCAL with the identical layout; the error names both types") {
  TempDir tmp("local");
  std::vector<float> flat(12, 3.0f);
  RunThreads(2, [&](Comm& comm) {
    StateDict sd;
    sd.Add("flat_param", Tensor::Slice(DType::kFloat32, {24}, 0, comm.rank() * 12, 12, flat.data()));
    SaveOptions o;
    o.state_dict_type = StateDictType::kLocal;
    Save(tmp / "local", sd, comm, o);
    Save(tmp / "sharded", sd, comm);
  });
  RunThreads(2, [&](Comm& comm) {
    std::vector<float> back(12);
    StateDict sd;
    sd.Add("flat_param", Tensor::Slice(DType::kFloat32, {24}, 0, comm.rank() * 12, 12, back.data()));
    CHECK_THROWS_WITH_AS(Load(tmp / "local", sd, comm), doctest::Contains("saved as LOCAL and cannot be loaded as SHARDED"),
                         Error);
    LoadOptions lo;
    lo.state_dict_type = StateDictType::kLocal;
    CHECK_THROWS_WITH_AS(Load(tmp / "sharded", sd, comm, lo),
                         doctest::Contains("saved as SHARDED and cannot be loaded as LOCAL"), Error);
    Load(tmp / "local", sd, comm, lo);
    CHECK(back == flat);
  });
  RunThreads(3, [&](Comm& comm) {
    std::vector<float> back(8);
    StateDict sd;
    sd.Add("flat_param", Tensor::Slice(DType::kFloat32, {24}, 0, comm.rank() * 8, 8, back.data()));
    LoadOptions lo;
    lo.state_dict_type = StateDictType::kLocal;
    CHECK_THROWS_WITH_AS(Load(tmp / "local", sd, comm, lo), doctest::Contains("LOCAL"), Error);
  });
}

TEST_CASE("zstd compression round-trips and stores fewer bytes for compressible data") {
  TempDir tmp("z");
  std::vector<float> v(1 << 18);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7);
  RunThreads(2, [&](Comm& comm) {
    StateDict sd;
    sd.Add("w", Tensor::Slice(DType::kFloat32, {1 << 18}, 0, comm.rank() * (1 << 17), 1 << 17,
                              v.data() + comm.rank() * (1 << 17)));
    SaveOptions o;
    o.compression.codec = Compression::Codec::kZstd;
    o.compression.level = 3;
    Save(tmp / "ck", sd, comm, o);
  });
  const Metadata md = ReadMetadata(tmp / "ck");
  for (const auto& c : md.Find("w")->chunks) {
    CHECK(c.compression.codec == Compression::Codec::kZstd);
    CHECK(c.stored_bytes < (1u << 17) * 4 / 4);
  }
  std::vector<float> back(v.size());
  CheckpointReader::Open(tmp / "ck")->ReadRegion("w", Box::Full({1 << 18}), back.data());
  CHECK(back == v);
  std::vector<float> part(1000);
  CheckpointReader::Open(tmp / "ck")->ReadRegion("w", Box{{130000}, {1000}}, part.data());
  CHECK(std::equal(part.begin(), part.end(), v.begin() + 130000));
}

TEST_CASE("CheckpointWriter streams chunks into several files and commits atomically") {
  TempDir tmp("w");
  std::vector<int64_t> v(100);
  for (int i = 0; i < 100; ++i) v[i] = i * 3;
  {
    CheckpointWriter::Options o;
    o.num_files = 2;
    auto w = CheckpointWriter::Create(tmp / "ck", o);
    w->WriteChunk("x", DType::kInt64, {10, 10}, Box{{0, 0}, {5, 10}}, v.data(), 0);
    w->WriteChunk("x", DType::kInt64, {10, 10}, Box{{5, 0}, {5, 10}}, v.data() + 50, 1);
    w->WriteScalar("step", Scalar::Int(7));
    w->WriteJson("cfg", R"({"a": [1, 2]})");
    const uint8_t blob[3] = {1, 2, 3};
    w->WriteBytes("blob", blob, 1);
    CHECK_FALSE(fs::exists(tmp / "ck"));
    w->Commit();
  }
  const Metadata md = ReadMetadata(tmp / "ck");
  CHECK(md.files.size() == 2);
  CHECK(md.state_dict_type == StateDictType::kFull);
  std::vector<int64_t> back(100);
  auto r = CheckpointReader::Open(tmp / "ck");
  r->ReadRegion("x", Box::Full({10, 10}), back.data());
  CHECK(back == v);
  CHECK(r->ReadBytes("blob") == std::vector<uint8_t>{1, 2, 3});

  // A writer whose chunks leave a gap refuses to commit and leaves nothing behind.
  {
    auto w = CheckpointWriter::Create(tmp / "gap", {});
    w->WriteChunk("x", DType::kInt64, {10, 10}, Box{{0, 0}, {5, 10}}, v.data());
    CHECK_THROWS_WITH_AS(w->Commit(), doctest::Contains("gap"), Error);
  }
  CHECK_FALSE(fs::exists(tmp / "gap"));
}

TEST_CASE("a tensor of zero volume is stored as one chunk, the whole tensor, however the ranks hold it (issue 32.4)") {
  // FORMAT.md §3.3, §9.1: exactly one chunk, offsets all 0, sizes = shape.
  TempDir tmp("zero");
  float none = 0;
  RunThreads(3, [&](Comm& comm) {
    StateDict sd;
    const int64_t r = comm.rank();
    // [0, 6] cut along dimension 1 (as a DTensor sharded there), [4, 0] along dimension 0,
    // and [0, 2] held whole by every rank.
    sd.Add("a", Tensor::Sharded(DType::kFloat32, {0, 6}, {Chunk{Box{{0, 2 * r}, {0, 2}}, &none}}));
    sd.Add("b", Tensor::Sharded(DType::kFloat32, {4, 0}, {Chunk{Box{{r, 0}, {r == 2 ? 2 : 1, 0}}, &none}}));
    sd.Add("c", Tensor::Full(DType::kFloat32, {0, 2}, &none));
    Save(tmp / "ck", sd, comm);
  });
  auto reader = CheckpointReader::Open(tmp / "ck");
  for (const auto& [key, shape] : std::vector<std::pair<std::string, Shape>>{{"a", {0, 6}}, {"b", {4, 0}}, {"c", {0, 2}}}) {
    CAPTURE(key);
    const EntryMeta& e = *reader->metadata().Find(key);
    REQUIRE(e.chunks.size() == 1);
    CHECK(e.chunks[0].box == Box::Full(shape));
  }
  reader->ReadRegion("a", Box::Full({0, 6}), &none);

  // CheckpointWriter refuses several chunks of a tensor of zero volume.
  {
    auto w = CheckpointWriter::Create(tmp / "split", {});
    w->WriteChunk("e", DType::kFloat32, {0, 4}, Box{{0, 0}, {0, 2}}, &none);
    w->WriteChunk("e", DType::kFloat32, {0, 4}, Box{{0, 2}, {0, 2}}, &none);
    CHECK_THROWS_WITH_AS(w->Commit(), doctest::Contains("exactly one chunk"), Error);
  }
  CHECK_FALSE(fs::exists(tmp / "split"));
}

TEST_CASE("CheckpointWriter chunk streams: pieces from memory and ranges copied from files") {
  TempDir tmp("cs");
  // A source checkpoint with one 3 MiB chunk (several copy blocks) and a raw file.
  std::vector<int32_t> v(3 << 18);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>(i * 2654435761u);
  {
    auto w = CheckpointWriter::Create(tmp / "src", {});
    w->WriteChunk("v", DType::kInt32, {static_cast<int64_t>(v.size())}, Box::Full({static_cast<int64_t>(v.size())}),
                  v.data());
    w->Commit();
  }
  auto src = CheckpointReader::Open(tmp / "src");
  const auto range = src->LocateChunk("v", 0);
  REQUIRE(range);
  CHECK(range->length == v.size() * 4);
  CHECK(range->file == tmp / "src" / src->metadata().Find("v")->chunks[0].file);
  src->VerifyChunk("v", 0);
  const ChunkMeta* stored = &src->metadata().Find("v")->chunks[0];  // checksum and block digests

  const int64_t n = static_cast<int64_t>(v.size());
  {
    auto w = CheckpointWriter::Create(tmp / "dst", {});
    // [head from memory | the whole source copied, checked | tail from memory]
    auto s = w->OpenChunk("x", DType::kInt32, {n + 20}, Box::Full({n + 20}));
    std::vector<int32_t> head(10, 7), tail(10, -7);
    s->Write(head.data(), 40);
    s->Copy(*range, stored);
    s->Write(tail.data(), 20);
    CHECK_THROWS_WITH_AS(s->Close(), doctest::Contains("bytes given"), Error);  // 20 bytes short
    s->Write(tail.data() + 5, 20);
    CHECK_THROWS_WITH_AS(s->Write(tail.data(), 4), doctest::Contains("more than"), Error);
    auto open = w->OpenChunk("y", DType::kInt32, {4}, Box::Full({4}));
    CHECK_THROWS_WITH_AS(w->Commit(), doctest::Contains("still open"), Error);
    open.reset();  // dropped unclosed: a gap Commit() refuses
    s->Close();
    CHECK_THROWS_WITH_AS(w->Commit(), doctest::Contains("'y'"), Error);
  }
  CHECK_FALSE(fs::exists(tmp / "dst"));
  {
    auto w = CheckpointWriter::Create(tmp / "dst", {});
    auto s = w->OpenChunk("x", DType::kInt32, {n + 20}, Box::Full({n + 20}));
    std::vector<int32_t> head(10, 7), tail(10, -7);
    s->Write(head.data(), 40);
    s->Copy(*range, stored);
    s->Write(tail.data(), 40);
    s->Close();
    w->Commit();
  }
  auto r = CheckpointReader::Open(tmp / "dst");
  std::vector<int32_t> back(v.size() + 20);
  r->ReadRegion("x", Box::Full({n + 20}), back.data());  // checksum verified
  CHECK(std::equal(v.begin(), v.end(), back.begin() + 10));
  CHECK(back[0] == 7);
  CHECK(back.back() == -7);

  // A flipped byte in the source: VerifyChunk and a checked copy both refuse it, naming the file.
  {
    std::fstream f(range->file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(range->offset + 1000));
    f.put('\x5a');
  }
  CHECK_THROWS_WITH_AS(src->VerifyChunk("v", 0), doctest::Contains("checksum mismatch"), Error);
  auto w = CheckpointWriter::Create(tmp / "bad", {});
  auto s = w->OpenChunk("x", DType::kInt32, {n}, Box::Full({n}));
  CHECK_THROWS_WITH_AS(s->Copy(*range, stored), doctest::Contains(range->file.string().c_str()), Error);
  // Compressed chunks have no raw bytes to copy.
  {
    CheckpointWriter::Options o;
    o.compression.codec = Compression::Codec::kZstd;
    auto z = CheckpointWriter::Create(tmp / "z", o);
    z->WriteChunk("v", DType::kInt32, {n}, Box::Full({n}), v.data());
    z->Commit();
  }
  auto zr = CheckpointReader::Open(tmp / "z");
  CHECK_FALSE(zr->LocateChunk("v", 0));
  zr->VerifyChunk("v", 0);
}

TEST_CASE("CheckpointWriter chunk streams copy across file systems (copy_file_range falls back to read/write)") {
  TempDir tmp("xfs");
  const fs::path shm = "/dev/shm";
  std::error_code ec;
  if (!fs::is_directory(shm, ec)) return;  // no second file system to copy from here
  // 3 MiB + 5 bytes on tmpfs, copied into a shard on the test directory's file system.
  const fs::path src = shm / ("ckpt-xfs-" + std::to_string(::getpid()));
  std::vector<uint8_t> v((3 << 20) + 5);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(i * 131 + (i >> 9));
  {
    std::ofstream(src, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size()));
  }
  const int64_t n = static_cast<int64_t>(v.size()) - 5;
  {
    auto w = CheckpointWriter::Create(tmp / "ck", {});
    auto s = w->OpenChunk("x", DType::kUInt8, {n}, Box::Full({n}));
    s->Copy(FileRange{src, 5, static_cast<uint64_t>(n)});
    s->Close();
    w->Commit();
  }
  fs::remove(src, ec);
  std::vector<uint8_t> back(static_cast<std::size_t>(n));
  CheckpointReader::Open(tmp / "ck")->ReadRegion("x", Box::Full({n}), back.data());  // checksum verified
  CHECK(std::equal(back.begin(), back.end(), v.begin() + 5));
}

TEST_CASE("a rank whose own state is invalid fails the save on every rank, naming that rank") {
  TempDir tmp("inv");
  std::vector<float> buf(40, 1.0f);
  std::atomic<int> threw{0};
  CHECK_THROWS_WITH_AS(RunThreads(3,
                                  [&](Comm& comm) {
                                    StateDict sd;
                                    // rank 2 claims rows [8, 12) of a 10-row tensor: out of bounds
                                    sd.Add("w", Tensor::Slice(DType::kFloat32, {10}, 0, comm.rank() * 4, 4, buf.data()));
                                    try {
                                      Save(tmp / "ck", sd, comm);
                                    } catch (const Error&) {
                                      ++threw;
                                      throw;
                                    }
                                  }),
                       doctest::Contains("rank 2: key 'w': chunk [8:12] lies outside the tensor [0:10]"), Error);
  CHECK(threw == 3);
  CHECK_FALSE(fs::exists(tmp / "ck"));
}

namespace {

// A state of every kind of key for `rank` of `world`: dim-0 parts (the save's fast path),
// one with fewer rows than ranks, a 2-D grid, a replica, scalars, json, bytes; `odd` makes
// rank 3 split its part of "emb" in two (which takes "emb" off the fast path).
StateDict MixedState(int rank, int world, std::vector<std::vector<float>>& keep, bool odd = false) {
  StateDict sd;
  auto data = [&](std::size_t n, float base) -> float* {
    std::vector<float>& v = keep.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
    return v.data();
  };
  const int64_t rows = 3 * world - 1, step = 3;  // the last part two rows
  const int64_t begin = rank * step, count = std::min(step, rows - begin);
  if (odd && rank == 3) {
    sd.Add("emb", Tensor::Sharded(DType::kFloat32, {rows, 4},
                                  {Chunk{Box{{begin, 0}, {1, 4}}, data(4, 100.0f * rank)},
                                   Chunk{Box{{begin + 1, 0}, {count - 1, 4}}, data(4 * (count - 1), 100.0f * rank + 4)}}));
  } else {
    sd.Add("emb", Tensor::Slice(DType::kFloat32, {rows, 4}, 0, begin, count, data(4 * count, 100.0f * rank)));
  }
  sd.Add("bias", Tensor::Full(DType::kFloat32, {5}, data(5, 1.0f)));  // replicated
  // Two rows: ranks past 1 hold no part.
  sd.Add("small", rank < 2 ? Tensor::Slice(DType::kFloat32, {2, 3}, 0, rank, 1, data(3, 7.0f * rank))
                           : Tensor::Sharded(DType::kFloat32, {2, 3}, {}));
  // A 2 x (world / 2) grid of columns: not the dim-0 rule.
  const int64_t cols = world / 2;
  sd.Add("grid", Tensor::Sharded(DType::kFloat32, {2, cols},
                                 {Chunk{Box{{rank / cols, rank % cols}, {1, 1}}, data(1, 9.0f * rank)}}));
  sd.Add("step", Scalar::Int(42));
  sd.Add("config", Json{R"({"layers": 2})"});
  sd.Add("rng.rank" + std::to_string(rank), Bytes{ckpt_test::RandomBytes(16 + rank, rank)});
  sd.Add("shared", Bytes{ckpt_test::RandomBytes(8, 99)});
  return sd;
}

// metadata.json of `dir` without what differs from one save to the next (its time and
// the phases' timings); every other byte as written.
std::string StableMetadata(const fs::path& dir) {
  std::ifstream in(dir / "metadata.json", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Metadata m = ParseMetadata(text);
  CHECK(SerializeMetadata(m) == text);  // so the comparison below is of the bytes written
  m.created.clear();
  m.save_timings.reset();
  return SerializeMetadata(m);
}

void SaveMixed(const fs::path& dir, int world, bool fast_plan, bool odd, const SaveOptions& opts = {}) {
  RunThreads(world, [&](Comm& comm) {
    std::vector<std::vector<float>> keep;
    const StateDict sd = MixedState(comm.rank(), world, keep, odd);
    internal::SaveContext context;
    context.fast_plan = fast_plan;
    internal::SaveWithContext(dir, sd, comm, opts, context);
  });
}

}  // namespace

TEST_CASE("the save's fast path writes the checkpoint that describing every entry writes") {
  TempDir tmp;
  for (int world : {4, 8}) {
    for (bool odd : {false, true}) {
      CAPTURE(world);
      CAPTURE(odd);
      SaveOptions opts;
      opts.compression = Compression{Compression::Codec::kZstd, 3};
      const fs::path fast = tmp / ("fast" + std::to_string(world) + std::to_string(odd));
      const fs::path slow = tmp / ("slow" + std::to_string(world) + std::to_string(odd));
      SaveMixed(fast, world, true, odd, opts);
      SaveMixed(slow, world, false, odd, opts);
      const std::string a = StableMetadata(fast), b = StableMetadata(slow);
      CHECK(a == b);  // files[].index: the digests of the shards' indexes too
      CHECK(a.find("\"emb\"") != std::string::npos);
      // And it loads back on every rank.
      RunThreads(world, [&](Comm& comm) {
        std::vector<std::vector<float>> keep;
        const StateDict saved = MixedState(comm.rank(), world, keep, odd);
        std::vector<std::vector<float>> into;
        StateDict sd = MixedState(comm.rank(), world, into, odd);
        for (auto& v : into) std::fill(v.begin(), v.end(), -1.0f);
        LoadOptions lo;
        lo.strict = false;  // the other ranks' rng.rank<r>
        Load(fast, sd, comm, lo);
        CHECK(into == keep);
      });
    }
  }
}

TEST_CASE("the save's fast path: disagreements are the same errors, naming the key") {
  TempDir tmp;
  for (bool fast_plan : {true, false}) {
    CAPTURE(fast_plan);
    CHECK_THROWS_WITH_AS(RunThreads(4,
                                    [&](Comm& comm) {
                                      std::vector<float> v(64, 1.0f);
                                      StateDict sd;
                                      sd.Add("w", Tensor::Slice(comm.rank() == 2 ? DType::kInt32 : DType::kFloat32,
                                                                {16}, 0, comm.rank() * 4, 4, v.data()));
                                      sd.Add("step", Scalar::Int(comm.rank() == 1 ? 2 : 1));
                                      internal::SaveContext context;
                                      context.fast_plan = fast_plan;
                                      internal::SaveWithContext(tmp / "ck", sd, comm, {}, context);
                                    }),
                         doctest::Contains("key 'step': rank 1 has value 2, another rank 1\n  "
                                           "key 'w': rank 2 has int32 [0:16], another rank float32 [0:16]"),
                         Error);
    CHECK_FALSE(fs::exists(tmp / "ck"));
  }
}

TEST_CASE("loads with O_DIRECT (LoadOptions::direct_io) return the bytes buffered loads do, resharded too") {
  TempDir tmp("direct");
  // Whether this file system does direct I/O at all (tmpfs does not): then every mode reads
  // buffered and says so.
  bool direct_fs = false;
  {
    std::ofstream(tmp / "probe") << "x";
    const int fd = ::open((tmp / "probe").c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
    direct_fs = fd >= 0;
    if (fd >= 0) ::close(fd);
  }
  // 1536 x 1024 float32 (6 MiB) saved by 2 ranks by rows, and a small tensor.
  const Shape shape{1536, 1024};
  std::vector<float> w(1536 * 1024), b(1000);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 9973) * 0.25f - 7.0f;
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i);
  RunThreads(2, [&](Comm& comm) {
    const int64_t r0 = comm.rank() * 768;
    StateDict sd;
    sd.Add("w", Tensor::Sharded(DType::kFloat32, shape, {Chunk{Box{{r0, 0}, {768, 1024}}, w.data() + r0 * 1024}}));
    sd.Add("b", Tensor::Full(DType::kFloat32, {1000}, b.data()));
    Save(tmp / "ck", sd, comm);
  });
  using DirectIo = LoadOptions::DirectIo;
  for (DirectIo mode : {DirectIo::kOn, DirectIo::kAuto, DirectIo::kOff}) {
    for (auto [world, verify] : {std::pair{1, true}, std::pair{3, true}, std::pair{3, false}}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(world);
      CAPTURE(verify);
      std::vector<std::vector<float>> got(static_cast<std::size_t>(world));
      std::vector<float> gb(1000);
      std::atomic<uint64_t> read{0}, read_direct{0};
      RunThreads(world, [&](Comm& comm) {
        const int64_t rows = 1536 / world, r0 = comm.rank() * rows;
        auto& mine = got[static_cast<std::size_t>(comm.rank())];
        mine.assign(static_cast<std::size_t>(rows * 1024), -1.0f);
        StateDict sd;
        sd.Add("w", Tensor::Sharded(DType::kFloat32, shape, {Chunk{Box{{r0, 0}, {rows, 1024}}, mine.data()}}));
        if (comm.rank() == 0) sd.Add("b", Tensor::Full(DType::kFloat32, {1000}, gb.data()));
        LoadOptions options;
        options.direct_io = mode;
        options.verify_checksums = verify;  // unverified reads take another path: direct too
        options.strict = false;  // ranks other than 0 leave "b" out
        const LoadReport r = Load(tmp / "ck", sd, comm, options);
        read += r.bytes_read;
        read_direct += r.bytes_read_direct;
      });
      for (int r = 0; r < world; ++r) {
        const std::size_t rows = static_cast<std::size_t>(1536 / world);
        CHECK(std::memcmp(got[static_cast<std::size_t>(r)].data(), w.data() + r * rows * 1024, rows * 1024 * 4) == 0);
      }
      CHECK(gb == b);
      CHECK(read_direct <= read);
      if (mode == DirectIo::kOff || !direct_fs) CHECK(read_direct == 0);
      // kOn reads the interiors of the large runs direct: most of the 6 MiB.
      if (mode == DirectIo::kOn && direct_fs) CHECK(read_direct >= (uint64_t{4} << 20));
    }
  }
}
