// layout/save_plan and layout/save_messages: the save's plan over simulated ranks (1, 4,
// 4096), every check it makes with its message, and the binary messages between ranks,
// round trips and malformed ones.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>

#include "ckpt/ckpt.h"
#include "format/grid.h"
#include "format/wire.h"
#include "layout/save_messages.h"
#include "layout/save_plan.h"

using namespace ckpt;
using namespace ckpt::layout;

namespace {

EntryClaim TensorClaim(std::string key, Shape shape, std::vector<Box> boxes, DType dtype = DType::kFloat32) {
  EntryClaim c;
  c.key = std::move(key);
  c.kind = EntryKind::kTensor;
  c.dtype = dtype;
  c.shape = std::move(shape);
  c.boxes = std::move(boxes);
  return c;
}

EntryClaim ScalarClaim(std::string key, std::string value, DType dtype = DType::kInt64) {
  EntryClaim c;
  c.key = std::move(key);
  c.kind = EntryKind::kScalar;
  c.dtype = dtype;
  c.value = std::move(value);
  return c;
}

EntryClaim BytesClaim(std::string key, uint64_t size) {
  EntryClaim c;
  c.key = std::move(key);
  c.kind = EntryKind::kBytes;
  c.size = size;
  return c;
}

EntryClaim JsonClaim(std::string key, std::string value) {
  EntryClaim c;
  c.key = std::move(key);
  c.kind = EntryKind::kJson;
  c.value = std::move(value);
  return c;
}

// Rows [rank * rows, (rank + 1) * rows) of a [world * rows, cols] tensor.
Box RowBlock(int rank, int64_t rows, int64_t cols) { return Box{{rank * rows, 0}, {rows, cols}}; }

// A plan from `world` ranks each describing `make(rank)`; with writers assigned.
template <typename Make>
SavePlan Plan(int world, Make&& make) {
  std::vector<RankDescription> d;
  for (int r = 0; r < world; ++r) d.push_back(make(r));
  SavePlan plan = PlanSave(std::move(d));
  AssignWriters(plan);
  return plan;
}

std::string PlanError(std::vector<RankDescription> d) {
  try {
    PlanSave(std::move(d));
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    return e.what();
  }
  FAIL("the plan was accepted");
  return "";
}

ChunkMeta SomeChunk(int64_t row) {
  ChunkMeta c;
  c.box = Box{{row, 0}, {4, 2}};
  c.file = "shard-00001-of-00002.h5";
  c.dataset = "w@" + std::to_string(row) + ",0";
  c.checksum = "xxh3-64:0123456789abcdef";
  c.stored_bytes = 32;
  c.compression.codec = Compression::Codec::kZstd;
  c.compression.level = -5;
  c.stats = ChunkStats{-1.5, 1e300, 0, 2, 1, 2, 8};
  return c;
}

}  // namespace

TEST_CASE("one rank: every kind of entry, written by rank 0 in the state's order") {
  const SavePlan plan = Plan(1, [](int) {
    return RankDescription{TensorClaim("w", {4, 2}, {Box{{0, 0}, {4, 2}}}), ScalarClaim("step", "7"),
                           BytesClaim("rng", 5), JsonClaim("cfg", "{\"a\":1}"), TensorClaim("s", {}, {Box{}})};
  });
  REQUIRE(plan.keys.size() == 5);
  CHECK(plan.keys[0].key == "w");
  CHECK(plan.keys[0].regular());  // one part of the dim-0 rule
  CHECK(plan.keys[0].RegionCount() == 1);
  CHECK(plan.keys[0].Region(0).bytes == 32);
  CHECK(plan.keys[1].RegionCount() == 0);
  CHECK(plan.keys[2].regions[0].box == Box{{0}, {5}});
  CHECK(plan.keys[2].regions[0].bytes == 5);
  CHECK(plan.keys[4].regions[0].bytes == 4);  // 0-D: one element
  const auto writes = WritesByRank(plan);
  REQUIRE(writes.size() == 1);
  REQUIRE(writes[0].size() == 3);  // w, rng, s
  CHECK(writes[0][1].ref == ChunkRef{2, 0});
  CHECK(writes[0][1].key == 2);
  CHECK(ReplicaRequests(plan)[0].empty());
}

TEST_CASE("four ranks: sharded rows, a replicated bias, keys in rank 0's order then the others'") {
  const SavePlan plan = Plan(4, [](int r) {
    // Rank 3 lists its keys in another order and has one of its own.
    RankDescription d{TensorClaim("w", {16, 8}, {RowBlock(3 - r, 4, 8)}), TensorClaim("b", {8}, {Box{{0}, {8}}}),
                      ScalarClaim("step", "3")};
    if (r == 3) {
      std::swap(d[0], d[2]);
      d.push_back(BytesClaim("only3", 9));
    }
    return d;
  });
  REQUIRE(plan.keys.size() == 4);
  CHECK(plan.keys[3].key == "only3");
  const SaveKey& w = plan.keys[0];
  REQUIRE(w.RegionCount() == 4);
  for (int g = 0; g < 4; ++g) {
    CHECK(w.Region(g).box == RowBlock(g, 4, 8));  // sorted by offsets
    CHECK(w.Region(g).writer == 3 - g);
    CHECK(w.RegionHolders(g).size() == 1);
  }
  const SaveKey& b = plan.keys[1];
  REQUIRE(b.regions.size() == 1);
  CHECK(b.regions[0].holder_count == 4);
  // Rank 3 holds w's rows [0, 4) like everyone holds one block, plus 9 bytes: the bias goes
  // to a rank without the extra load, the lowest one.
  CHECK(b.regions[0].writer == 0);
  const auto requests = ReplicaRequests(plan);
  CHECK(requests[0] == std::vector<ChunkRef>{{1, 0}});
  CHECK(requests[3] == std::vector<ChunkRef>{{1, 0}});
  const auto writes = WritesByRank(plan);
  CHECK(writes[0].size() == 2);
  CHECK(writes[3].size() == 2);  // w and only3
  CHECK(writes[3][0].ref == ChunkRef{2, 0});  // w is its entry 2
}

TEST_CASE("4096 simulated ranks: sharded and replicated keys, writers balanced") {
  constexpr int kWorld = 4096, kReplicated = 64;
  const SavePlan plan = Plan(kWorld, [](int r) {
    RankDescription d;
    d.push_back(TensorClaim("emb", {kWorld * 2, 16}, {RowBlock(r, 2, 16)}));
    // Two chunks per rank of a second tensor.
    d.push_back(TensorClaim("proj", {kWorld * 2, 8}, {Box{{2 * r, 0}, {1, 8}}, Box{{2 * r + 1, 0}, {1, 8}}}));
    for (int k = 0; k < kReplicated; ++k) d.push_back(TensorClaim("norm." + std::to_string(k), {64}, {Box{{0}, {64}}}));
    d.push_back(ScalarClaim("step", "100"));
    return d;
  });
  REQUIRE(plan.keys.size() == 3 + kReplicated);
  CHECK(plan.keys[0].RegionCount() == kWorld);
  CHECK(plan.keys[0].regular());
  CHECK(plan.keys[1].regions.size() == 2 * kWorld);
  CHECK(plan.keys[1].regions[5].box == Box{{5, 0}, {1, 8}});
  CHECK(plan.keys[1].HoldersOf(plan.keys[1].regions[5])[0].ref == ChunkRef{1, 1});
  std::vector<int> replicated_per_rank(kWorld, 0);
  for (int k = 0; k < kReplicated; ++k) {
    const SaveKey& p = plan.keys[2 + k];
    REQUIRE(p.regions.size() == 1);
    CHECK(p.regions[0].holder_count == kWorld);
    ++replicated_per_rank[p.regions[0].writer];
  }
  // Every rank carries the same sharded load, so the replicas go to distinct ranks.
  CHECK(*std::max_element(replicated_per_rank.begin(), replicated_per_rank.end()) == 1);
  const auto requests = ReplicaRequests(plan);
  CHECK(requests[kWorld - 1].size() == kReplicated);
  std::vector<std::vector<std::string>> digests(kWorld, std::vector<std::string>(kReplicated, "xxh3-64:same"));
  CheckReplicas(plan, digests);
  digests[77][3] = "xxh3-64:other";
  CHECK_THROWS_WITH_AS(CheckReplicas(plan, digests),
                       doctest::Contains("key 'norm.3' region [0:64]: replicas differ (ranks 77 vs ranks 0 1 2 "), Error);
  std::size_t total = 0;
  for (const auto& w : WritesByRank(plan)) total += w.size();
  CHECK(total == kWorld + 2 * kWorld + kReplicated);
}

TEST_CASE("regions: equal offsets keep the first claim's order; zero-size boxes are regions too") {
  const SavePlan plan = Plan(2, [](int r) {
    // Rank 0: an empty box at [0:0], then the whole tensor; rank 1 the whole tensor.
    if (r == 0) return RankDescription{TensorClaim("w", {4}, {Box{{0}, {0}}, Box{{0}, {4}}})};
    return RankDescription{TensorClaim("w", {4}, {Box{{0}, {4}}})};
  });
  const SaveKey& w = plan.keys[0];
  REQUIRE(w.regions.size() == 2);
  CHECK(w.regions[0].box == Box{{0}, {0}});
  CHECK(w.regions[1].holder_count == 2);
  CHECK(w.HoldersOf(w.regions[1])[0].ref == ChunkRef{0, 1});
  CHECK(w.HoldersOf(w.regions[1])[1].rank == 1);
}

namespace {

// Two plans' keys agree region for region: boxes, bytes, writers and holders.
void CheckSameRegions(const SaveKey& a, const SaveKey& b) {
  REQUIRE(a.RegionCount() == b.RegionCount());
  for (std::size_t g = 0; g < a.RegionCount(); ++g) {
    const SaveRegion x = a.Region(g), y = b.Region(g);
    CHECK(x.box == y.box);
    CHECK(x.bytes == y.bytes);
    CHECK(x.writer == y.writer);
    const std::vector<Holder> hx = a.RegionHolders(g), hy = b.RegionHolders(g);
    REQUIRE(hx.size() == hy.size());
    for (std::size_t i = 0; i < hx.size(); ++i) {
      CHECK(hx[i].rank == hy[i].rank);
      CHECK(hx[i].ref == hy[i].ref);
    }
  }
}

// The same descriptions planned compactly and with every key explicit agree region for
// region: boxes, bytes, writers, holders, replica requests and every rank's writes.
// Returns the compact plan; if planning fails, both fail with the same message and the
// plan is empty.
SavePlan CheckSameAsExplicit(const std::vector<RankDescription>& d) {
  std::string error_compact, error_explicit;
  SavePlan compact, expl;
  try {
    compact = PlanSave(d, true);
  } catch (const Error& e) {
    error_compact = e.what();
  }
  try {
    expl = PlanSave(d, false);
  } catch (const Error& e) {
    error_explicit = e.what();
  }
  CHECK(error_compact == error_explicit);
  if (!error_compact.empty() || !error_explicit.empty()) return SavePlan{};
  AssignWriters(compact);
  AssignWriters(expl);
  REQUIRE(compact.keys.size() == expl.keys.size());
  for (std::size_t k = 0; k < compact.keys.size(); ++k) {
    const SaveKey& a = compact.keys[k];
    const SaveKey& b = expl.keys[k];
    CAPTURE(a.key);
    CHECK_FALSE(b.regular());
    CHECK(a.key == b.key);
    CheckSameRegions(a, b);
  }
  CHECK(ReplicaRequests(compact) == ReplicaRequests(expl));
  const auto wa = WritesByRank(compact), wb = WritesByRank(expl);
  REQUIRE(wa.size() == wb.size());
  for (std::size_t r = 0; r < wa.size(); ++r) {
    REQUIRE(wa[r].size() == wb[r].size());
    for (std::size_t i = 0; i < wa[r].size(); ++i) {
      CHECK(wa[r][i].ref == wb[r][i].ref);
      CHECK(wa[r][i].key == wb[r][i].key);
      CHECK(wa[r][i].region == wb[r][i].region);
    }
  }
  return compact;
}

// Part `part` of the dim-0 step rule: rows [part * step, ...) of `shape`, whole in the rest.
Box Part(const Shape& shape, int64_t step, int64_t part) {
  Box b{Shape(shape.size(), 0), shape};
  b.offsets[0] = part * step;
  b.sizes[0] = std::min(step, shape[0] - part * step);
  return b;
}

template <typename Make>
std::vector<RankDescription> Ranks(int world, Make&& make) {
  std::vector<RankDescription> d;
  for (int r = 0; r < world; ++r) d.push_back(make(r));
  return d;
}

}  // namespace

TEST_CASE("regular keys: 16384 ranks of dim-0 parts are one run, not 16384 regions") {
  constexpr int kWorld = 16384;
  const Shape shape{4 * kWorld - 3, 8};  // step 4, the last part one row
  SavePlan plan = PlanSave(Ranks(kWorld, [&](int r) {
    return RankDescription{TensorClaim("emb", shape, {Part(shape, 4, r)}, DType::kBFloat16), ScalarClaim("step", "1")};
  }));
  AssignWriters(plan);
  const SaveKey& emb = plan.keys[0];
  REQUIRE(emb.regular());
  CHECK(emb.step == 4);
  CHECK(emb.regions.empty());
  CHECK(emb.holders.empty());
  REQUIRE(emb.runs.size() == 1);
  CHECK(emb.runs[0].count == kWorld);
  CHECK(emb.RegionCount() == kWorld);
  CHECK(emb.Region(7).box == Box{{28, 0}, {4, 8}});
  CHECK(emb.Region(7).bytes == 4 * 8 * 2);
  CHECK(emb.Region(7).writer == 7);
  CHECK(emb.Region(kWorld - 1).box == Box{{4 * kWorld - 4, 0}, {1, 8}});
  CHECK(emb.Region(kWorld - 1).bytes == 16);
  CHECK(emb.RegionHolders(kWorld - 1)[0].rank == kWorld - 1);
  const auto writes = WritesByRank(plan);
  CHECK(writes[123].size() == 1);
  CHECK(writes[123][0].region == 123);
  CHECK(ReplicaRequests(plan)[0].empty());
}

TEST_CASE("regular keys: the same plan as the explicit one, for every way a claim fits or breaks the rule") {
  constexpr int kWorld = 8;
  const Shape even{32, 3}, uneven{29, 3}, few{5, 2};
  SUBCASE("even, uneven last part, fewer parts than ranks, 1-D") {
    const SavePlan plan = CheckSameAsExplicit(Ranks(kWorld, [&](int r) {
      RankDescription d{TensorClaim("even", even, {Part(even, 4, r)}), TensorClaim("uneven", uneven, {Part(uneven, 4, r)}),
                        TensorClaim("few", few, r < 5 ? std::vector<Box>{Part(few, 1, r)} : std::vector<Box>{}),
                        TensorClaim("v", {16}, {Part({16}, 2, r)})};
      return d;
    }));
    REQUIRE(plan.keys.size() == 4);
    for (const SaveKey& k : plan.keys) CHECK(k.regular());
    CHECK(plan.keys[1].Region(7).box == Box{{28, 0}, {1, 3}});
  }
  SUBCASE("a rank whose claim breaks the rule halfway: two chunks, another box, an empty box") {
    for (int how = 0; how < 3; ++how) {
      const SavePlan plan = CheckSameAsExplicit(Ranks(kWorld, [&](int r) {
        std::vector<Box> boxes{Part(even, 4, r)};
        if (r == 4 && how == 0) boxes = {Box{{16, 0}, {2, 3}}, Box{{18, 0}, {2, 3}}};
        if (r == 4 && how == 1) boxes = {Box{{16, 0}, {4, 1}}, Box{{16, 1}, {4, 2}}};
        if (r == 4 && how == 2) boxes.push_back(Box{{0, 0}, {0, 3}});
        return RankDescription{TensorClaim("w", even, boxes)};
      }));
      REQUIRE(plan.keys.size() == 1);
      CHECK_FALSE(plan.keys[0].regular());
      CHECK(plan.keys[0].RegionCount() == 9u);
    }
  }
  SUBCASE("replicas: a part held twice, a tensor held whole by every rank") {
    const Shape seven{28, 3};  // parts 0..6 on ranks 0..6, and rank 7 holds part 2 again
    const SavePlan plan = CheckSameAsExplicit(Ranks(kWorld, [&](int r) {
      const std::vector<Box> boxes{Part(even, 4, r)};
      return RankDescription{TensorClaim("w", seven, {Part(seven, 4, r == 7 ? 2 : r)}), TensorClaim("x", even, boxes),
                             TensorClaim("norm", {6}, {Box{{0}, {6}}})};
    }));
    REQUIRE(plan.keys.size() == 3);
    CHECK_FALSE(plan.keys[0].regular());
    CHECK(plan.keys[0].Region(2).holder_count == 2);
    CHECK(ReplicaRequests(plan)[7] == std::vector<ChunkRef>{{0, 0}, {2, 0}});  // w and norm
    CHECK(plan.keys[1].regular());
    CHECK_FALSE(plan.keys[2].regular());
    CHECK(plan.keys[2].Region(0).holder_count == kWorld);
  }
  SUBCASE("parts in reverse rank order, keys in another order on some ranks: more runs, still regular") {
    const SavePlan plan = CheckSameAsExplicit(Ranks(kWorld, [&](int r) {
      RankDescription d{TensorClaim("rev", even, {Part(even, 4, kWorld - 1 - r)}), TensorClaim("w", uneven, {Part(uneven, 4, r)}),
                        ScalarClaim("step", "2")};
      if (r % 3 == 1) std::swap(d[1], d[2]);
      return d;
    }));
    REQUIRE(plan.keys.size() == 3);
    CHECK(plan.keys[0].regular());
    CHECK(plan.keys[0].runs.size() == kWorld);
    CHECK(plan.keys[1].regular());
    CHECK(plan.keys[1].runs.size() > 1);
    CHECK(plan.keys[1].RegionHolders(4)[0].ref == ChunkRef{2, 0});  // rank 4 listed w third
  }
  SUBCASE("what is not the rule stays explicit: a grid over dim 1, a zero extent, a 0-D tensor, whole tensors") {
    const SavePlan plan = CheckSameAsExplicit(Ranks(kWorld, [&](int r) {
      const Shape grid{2, 8};
      return RankDescription{TensorClaim("grid", grid, {Box{{r / 4, (r % 4) * 2}, {1, 2}}}),
                             // (a tensor of zero volume is claimed whole, as layout::Describe claims it)
                             TensorClaim("zero", {8, 0}, {Box{{0, 0}, {8, 0}}}), TensorClaim("s", {}, r == 0 ? std::vector<Box>{Box{}} : std::vector<Box>{}),
                             TensorClaim("only0", {5}, r == 0 ? std::vector<Box>{Box{{0}, {5}}} : std::vector<Box>{})};
    }));
    REQUIRE(plan.keys.size() == 4);
    CHECK_FALSE(plan.keys[0].regular());
    CHECK_FALSE(plan.keys[1].regular());
    CHECK_FALSE(plan.keys[2].regular());
    CHECK(plan.keys[3].regular());  // one part, held by rank 0
  }
  SUBCASE("a first claim that is a short last part guesses the step wrong: explicit, same plan") {
    const SavePlan plan = CheckSameAsExplicit(Ranks(4, [&](int r) {
      const Shape s{13, 2};  // step 4: parts of 4, 4, 4, 1 rows; rank 0 holds the last
      return RankDescription{TensorClaim("w", s, {Part(s, 4, 3 - r)})};
    }));
    REQUIRE(plan.keys.size() == 1);
    CHECK_FALSE(plan.keys[0].regular());
    CHECK(plan.keys[0].RegionCount() == 4);
  }
  SUBCASE("extents near INT64_MAX: part counts without overflow, byte counts checked alike") {
    const int64_t big = INT64_MAX, half = int64_t{1} << 62;
    SavePlan plan = CheckSameAsExplicit(Ranks(2, [&](int r) {
      return RankDescription{TensorClaim("huge", {big}, {Part({big}, half, r)}, DType::kUInt8)};
    }));
    REQUIRE(plan.keys.size() == 1);
    CHECK(plan.keys[0].regular());
    CHECK(plan.keys[0].RegionCount() == 2);
    CHECK(plan.keys[0].Region(1).bytes == static_cast<uint64_t>(big - half));
    plan = CheckSameAsExplicit(Ranks(2, [&](int r) {
      return RankDescription{TensorClaim("huge", {big}, {Part({big}, half, r)}, DType::kFloat32)};
    }));
    CHECK(plan.keys.empty());  // both refuse: 2^62 float32 elements overflow a byte count
  }
  SUBCASE("random mixes of regular ranks and breaking ones") {
    std::mt19937 rng(5);
    int regular = 0, broken = 0, failed = 0;
    for (int trial = 0; trial < 200; ++trial) {
      const int world = 1 + static_cast<int>(rng() % 9);
      const int64_t step = 1 + static_cast<int64_t>(rng() % 3);
      const Shape shape{step * world - static_cast<int64_t>(rng() % step), 2};
      const int breaker = static_cast<int>(rng() % (2 * world));  // >= world: none
      const int kind = static_cast<int>(rng() % 4);
      const SavePlan plan = CheckSameAsExplicit(Ranks(world, [&](int r) {
        std::vector<Box> boxes;
        if (r * step < shape[0]) boxes.push_back(Part(shape, step, r));
        if (r == breaker) {
          if (kind == 0) boxes.clear();                              // a gap
          if (kind == 1) boxes.push_back(Part(shape, step, 0));      // a replica, or a duplicate
          if (kind == 2 && !boxes.empty()) boxes[0].sizes[1] = 1;    // half a part: a gap
          if (kind == 3) boxes = {Box{{0, 0}, {shape[0], 2}}};       // the whole tensor
        }
        const Shape v{shape[0]};
        std::vector<Box> vb;
        if (r * step < v[0]) vb.push_back(Part(v, step, r));
        return RankDescription{TensorClaim("w", shape, boxes), TensorClaim("v", v, vb)};
      }));
      if (plan.keys.empty()) {
        ++failed;
      } else {
        ++(plan.keys[0].regular() ? regular : broken);
      }
    }
    CHECK(regular > 20);
    CHECK(broken > 20);
    CHECK(failed > 20);
  }
}

TEST_CASE("regular keys: gaps and overlaps are reported as for explicit keys") {
  const Shape shape{16, 2};
  for (bool compact : {true, false}) {
    CAPTURE(compact);
    auto error = [&](const std::function<std::vector<Box>(int)>& boxes) {
      try {
        PlanSave(Ranks(4, [&](int r) { return RankDescription{TensorClaim("w", shape, boxes(r))}; }), compact);
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    const std::string head = "save: the state cannot be saved as given:\n  key 'w': ";
    CHECK(error([&](int r) { return r == 2 ? std::vector<Box>{} : std::vector<Box>{Part(shape, 4, r)}; }) ==
          head + "chunks cover 24 of 32 elements of [0:16, 0:2] (a gap)");
    CHECK(error([&](int r) { return std::vector<Box>{Part(shape, 4, r == 3 ? 0 : r)}; }) ==
          head + "chunks cover 24 of 32 elements of [0:16, 0:2] (a gap)");
  }
}

TEST_CASE("each disagreement between ranks is an error naming the key and rank") {
  auto two = [](EntryClaim a, EntryClaim b) {
    return std::vector<RankDescription>{RankDescription{std::move(a)}, RankDescription{std::move(b)}};
  };
  const std::string head = "save: the state cannot be saved as given:\n  ";
  CHECK(PlanError(two(TensorClaim("w", {4}, {Box{{0}, {4}}}), ScalarClaim("w", "1"))) ==
        head + "key 'w': rank 1 has a scalar, another rank a tensor");
  CHECK(PlanError(two(TensorClaim("w", {4}, {Box{{0}, {2}}}), TensorClaim("w", {4}, {Box{{2}, {2}}}, DType::kInt32))) ==
        head + "key 'w': rank 1 has int32 [0:4], another rank float32 [0:4]\n  key 'w': chunks cover 2 of 4 elements of [0:4] (a gap)");
  CHECK(PlanError(two(TensorClaim("w", {4}, {Box{{0}, {4}}}), TensorClaim("w", {5}, {Box{{0}, {5}}}))) ==
        head + "key 'w': rank 1 has float32 [0:5], another rank float32 [0:4]");
  CHECK(PlanError(two(BytesClaim("rng", 5), BytesClaim("rng", 6))) ==
        head + "key 'rng': rank 1 has 6 bytes, another rank 5");
  CHECK(PlanError(two(ScalarClaim("step", "1"), ScalarClaim("step", "2"))) ==
        head + "key 'step': rank 1 has value 2, another rank 1");
  CHECK(PlanError(two(ScalarClaim("step", "1"), ScalarClaim("step", "1", DType::kInt32))) ==
        head + "key 'step': rank 1 has value 1, another rank 1");
  CHECK(PlanError(two(JsonClaim("cfg", "{}"), JsonClaim("cfg", "[]"))) == head + "key 'cfg': rank 1 has value [], another rank {}");
  CHECK(PlanError(two(TensorClaim("w", {10}, {Box{{0}, {6}}}), TensorClaim("w", {10}, {Box{{4}, {6}}}))) ==
        head + "key 'w': chunks [0:6] and [4:10] overlap");
  CHECK(PlanError(two(TensorClaim("w", {10}, {Box{{0}, {3}}}), TensorClaim("w", {10}, {Box{{5}, {5}}}))) ==
        head + "key 'w': chunks cover 8 of 10 elements of [0:10] (a gap)");
  // A box from a message, not checked by Describe, is still caught.
  CHECK(PlanError(two(TensorClaim("w", {4}, {Box{{0}, {4}}}), TensorClaim("w", {4}, {Box{{2}, {4}}}))) ==
        head + "key 'w': chunk [2:6] lies outside the tensor [0:4]");
}

TEST_CASE("more than 50 problems are summarised") {
  std::vector<RankDescription> d(2);
  for (int k = 0; k < 60; ++k) {
    d[0].push_back(ScalarClaim("k" + std::to_string(k), "1"));
    d[1].push_back(ScalarClaim("k" + std::to_string(k), "2"));
  }
  const std::string msg = PlanError(std::move(d));
  CHECK(msg.find("key 'k49': rank 1") != std::string::npos);
  CHECK(msg.find("key 'k50'") == std::string::npos);
  CHECK(msg.ends_with("\n  ... and 10 more"));
}

TEST_CASE("SavePlanner: a wrong number of descriptions is an internal error") {
  SavePlanner planner(2);
  planner.Add(RankDescription{});
  CHECK_THROWS_WITH_AS(planner.Finish(), "save plan: 1 descriptions for 2 ranks", Error);
}

TEST_CASE("replica checks: differing copies name the groups of ranks; miscounted answers are kComm") {
  const SavePlan plan = Plan(3, [](int) { return RankDescription{TensorClaim("w", {4}, {Box{{0}, {4}}}), BytesClaim("rng", 3)}; });
  const auto requests = ReplicaRequests(plan);
  REQUIRE(requests.size() == 3);
  CHECK(requests[1] == std::vector<ChunkRef>{{0, 0}, {1, 0}});
  CheckReplicas(plan, {{"a", "x"}, {"a", "x"}, {"a", "x"}});
  CHECK_THROWS_WITH_AS(CheckReplicas(plan, {{"a", "x"}, {"a", "y"}, {"b", "x"}}),
                       "save: replicated tensors differ between ranks (a data-parallel desync?):\n"
                       "  key 'w' region [0:4]: replicas differ (ranks 0 1 vs ranks 2)\n"
                       "  key 'rng' region [0:3]: replicas differ (ranks 0 2 vs ranks 1)",
                       Error);
  try {
    CheckReplicas(plan, {{"a", "x"}, {"a"}, {"a", "x"}});
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kComm);
    CHECK(std::string(e.what()) == "save: rank 1 sent 1 replica digests, expected 2");
  }
  CHECK_THROWS_AS(CheckReplicas(plan, {{"a", "x"}}), Error);
}

TEST_CASE("writers: replicated regions balance bytes, largest first") {
  // 8 equal replicated tensors on 4 ranks: two each.
  SavePlan plan = Plan(4, [](int) {
    RankDescription d;
    for (int i = 0; i < 8; ++i) d.push_back(TensorClaim("w" + std::to_string(i), {256}, {Box{{0}, {256}}}));
    return d;
  });
  std::vector<int> per_rank(4, 0);
  for (const SaveKey& k : plan.keys) ++per_rank[k.regions[0].writer];
  CHECK(per_rank == std::vector<int>{2, 2, 2, 2});
  // A big replica and small ones: the big one first, to rank 0; the small ones elsewhere.
  plan = Plan(2, [](int) {
    return RankDescription{TensorClaim("small", {4}, {Box{{0}, {4}}}), TensorClaim("big", {400}, {Box{{0}, {400}}})};
  });
  CHECK(plan.keys[1].regions[0].writer == 0);
  CHECK(plan.keys[0].regions[0].writer == 1);
}

TEST_CASE("Assemble: entries in plan order, layouts from the plan, files of ranks that wrote, totals per key") {
  const SavePlan plan = Plan(3, [](int r) {
    RankDescription d{TensorClaim("w", {8, 2}, {Box{{4 - 4 * r, 0}, {4, 2}}}), ScalarClaim("step", "5"),
                      JsonClaim("cfg", "null")};
    if (r == 2) d[0] = TensorClaim("w", {8, 2}, {});  // rank 2 holds no part of w: it writes nothing
    d.push_back(BytesClaim("blob", 10));
    return d;
  });
  const auto writes = WritesByRank(plan);
  std::vector<RankResult> results(3);
  std::vector<KeyTotals> totals(plan.keys.size());
  for (int r = 0; r < 3; ++r) {
    results[r].file = writes[r].empty() ? "" : "shard-" + std::to_string(r);
    results[r].bytes = 100 + r;
    results[r].index = "xxh3-64:000000000000000" + std::to_string(r);
    results[r].chunks = writes[r].size();
  }
  const std::size_t w_key = 0;
  REQUIRE(plan.keys[w_key].key == "w");
  for (int r = 0; r < 2; ++r) totals[w_key].Add(SomeChunk(4 - 4 * r));
  Metadata m;
  Assemble(plan, writes, results, totals, Compression{Compression::Codec::kZstd, 7}, m);
  CHECK_FALSE(m.resolved);
  std::vector<std::string> files;
  for (const FileMeta& f : m.files) files.push_back(f.name + "@" + std::to_string(f.rank) + ":" + std::to_string(f.bytes));
  const bool blob_on_2 = !writes[2].empty();
  CHECK(files.size() == (blob_on_2 ? 3u : 2u));
  CHECK(files[0] == "shard-0@0:100");
  CHECK(files[1] == "shard-1@1:101");
  REQUIRE(m.entries.size() == 4);
  const EntryMeta* w = m.Find("w");
  REQUIRE(w);
  CHECK(w->chunks.empty());  // v2: the records stay in the shard indexes
  CHECK(w->layout.kind == TensorLayout::Kind::kGrid);
  CHECK(w->stored_bytes == 64);
  CHECK(w->compression.codec == Compression::Codec::kZstd);
  CHECK(w->compression.level == 7);
  REQUIRE(w->stats);
  CHECK(w->stats->finite_count == 16);
  CHECK(w->stats->max == 1e300);
  CHECK(w->stats->min == -1.5);
  CHECK(w->stats->nan_count == 2);
  // The layout names the file of each part's writer: rows [0, 4) are rank 1's.
  const Metadata parsed = ParseMetadata(SerializeMetadata(m));
  const EntryMeta* pw = parsed.Find("w");
  REQUIRE(pw);
  CHECK(pw->layout.kind == TensorLayout::Kind::kGrid);
  std::vector<std::string> cells;
  grid::ForEachCell(pw->layout, pw->shape, Box::Full({8, 2}), [&](const Box& box, int32_t file) {
    cells.push_back(box.ToString() + "@" + parsed.files.at(static_cast<std::size_t>(file)).name);
  });
  CHECK(cells == std::vector<std::string>{Box{{0, 0}, {4, 2}}.ToString() + "@shard-1",
                                          Box{{4, 0}, {4, 2}}.ToString() + "@shard-0"});
  CHECK(m.Find("step")->value == "5");
  CHECK(m.Find("step")->dtype == DType::kInt64);
  CHECK(m.Find("cfg")->kind == EntryKind::kJson);
  const EntryMeta* blob = m.Find("blob");
  REQUIRE(blob);
  REQUIRE(blob->layout.pieces.size() == 1);
  CHECK(m.files.at(static_cast<std::size_t>(blob->layout.pieces[0].file)).rank == plan.keys[3].Region(0).writer);
  CHECK(ParseMetadata(SerializeMetadata(m)).Find("blob")->size == 10);
  // A rank that reports another number of chunks than it was given, totals of another
  // plan: kComm.
  results[1].chunks = 0;
  Metadata bad;
  CHECK_THROWS_WITH_AS(Assemble(plan, writes, results, totals, {}, bad),
                       "save: rank 1 reported 0 chunks written, expected 1", Error);
  results[1].chunks = 1;
  totals.pop_back();
  CHECK_THROWS_WITH_AS(Assemble(plan, writes, results, totals, {}, bad), "save: totals of 3 keys, expected 4", Error);
}

TEST_CASE("StatsAccumulator: reduced from partial sums as CombineStats gives, up to the order of the sums") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-10, 10);
  std::vector<ChunkStats> parts(40);
  for (ChunkStats& c : parts) {
    c.min = u(rng);
    c.max = c.min + 5;
    c.mean = (c.min + c.max) / 2;
    c.l2 = std::abs(u(rng));
    c.finite_count = static_cast<int64_t>(rng() % 5);  // some with no finite element
    c.nan_count = static_cast<int64_t>(rng() % 3);
    c.inf_count = static_cast<int64_t>(rng() % 2);
  }
  std::vector<const ChunkStats*> all;
  for (const ChunkStats& c : parts) all.push_back(&c);
  const ChunkStats want = *CombineStats(all);
  // Four "ranks", each with every fourth part; their sums reduced as save.cc does.
  StatsAccumulator::Sums total;
  for (int r = 0; r < 4; ++r) {
    StatsAccumulator a;
    for (std::size_t i = static_cast<std::size_t>(r); i < parts.size(); i += 4) a.Add(&parts[i]);
    const StatsAccumulator::Sums s = a.sums();
    total.sum += s.sum;
    total.sumsq += s.sumsq;
    total.min = std::min(total.min, s.min);
    total.max = std::max(total.max, s.max);
    total.nan_count += s.nan_count;
    total.inf_count += s.inf_count;
    total.finite_count += s.finite_count;
    total.parts += s.parts;
    total.missing += s.missing;
  }
  const std::optional<ChunkStats> got = StatsAccumulator::FromSums(total).Result();
  REQUIRE(got);
  CHECK(got->min == want.min);
  CHECK(got->max == want.max);
  CHECK(got->finite_count == want.finite_count);
  CHECK(got->nan_count == want.nan_count);
  CHECK(got->inf_count == want.inf_count);
  CHECK(got->mean == doctest::Approx(want.mean).epsilon(1e-12));
  CHECK(got->l2 == doctest::Approx(want.l2).epsilon(1e-12));
  // A rank with no part adds nothing; a null part anywhere makes the result absent.
  CHECK(StatsAccumulator::FromSums(StatsAccumulator().sums()).Result() == std::nullopt);
  StatsAccumulator with_null;
  with_null.Add(&parts[0]);
  with_null.Add(nullptr);
  StatsAccumulator::Sums s = with_null.sums();
  CHECK(s.missing == 1);
  CHECK(StatsAccumulator::FromSums(s).Result() == std::nullopt);
}

TEST_CASE("Describe checks this rank's state alone, with the messages Save gives") {
  std::vector<float> buf(100, 1.0f);
  auto error = [](const StateDict& sd) {
    try {
      Describe(sd);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  StateDict sd;
  sd.Add("w", Tensor::Slice(DType::kFloat32, {10}, 0, 8, 4, buf.data()));
  CHECK(error(sd) == "key 'w': chunk [8:12] lies outside the tensor [0:10]");
  sd = StateDict();
  sd.Add("w", Tensor::Sharded(DType::kFloat32, {10}, {Chunk{Box{{0}, {6}}, buf.data()}, Chunk{Box{{4}, {6}}, buf.data()}}));
  CHECK(error(sd) == "key 'w': this rank's chunks [0:6] and [4:10] overlap");
  sd = StateDict();
  sd.Add("w", Tensor::Sharded(DType::kFloat32, {10}, {Chunk{Box{{0}, {6}}, nullptr}}));
  CHECK(error(sd) == "key 'w': chunk [0:6] has no data");
  sd = StateDict();
  sd.Add("w", Tensor::Full(DType::kFloat32, Shape(33, 1), buf.data()));
  CHECK(error(sd) == "key 'w': more than 32 dimensions");
  sd = StateDict();
  sd.Add("lr", Scalar::Float(std::nan("")));
  CHECK(error(sd).find("is not finite") != std::string::npos);
  sd = StateDict();
  sd.Add("cfg", Json{"{bad"});
  CHECK(error(sd).starts_with("key 'cfg': invalid JSON value: "));

  sd = StateDict();
  sd.Add("w", Tensor::Slice(DType::kFloat32, {10, 10}, 0, 0, 5, buf.data()));
  sd.Add("step", Scalar::Int(3));
  sd.Add("lr", Scalar::Float(0.5, DType::kFloat32));
  sd.Add("on", Scalar::Int(1, DType::kBool));
  sd.Add("rng", Bytes{{1, 2, 3}});
  sd.Add("cfg", Json{"{ \"a\" : [1, 2] }"});
  const RankDescription d = Describe(sd);
  REQUIRE(d.size() == 6);
  CHECK(d[0].boxes == std::vector<Box>{Box{{0, 0}, {5, 10}}});
  CHECK(d[1].value == "3");
  CHECK(d[2].value == "0.5");
  CHECK(d[3].value == "true");
  CHECK(d[4].size == 3);
  CHECK(d[5].value == "{\"a\":[1,2]}");
}

TEST_CASE("messages round-trip") {
  const RankDescription d{TensorClaim("w", {1LL << 40, 3}, {Box{{0, 0}, {1LL << 39, 3}}, Box{{1LL << 39, 0}, {1, 3}}}, DType::kBFloat16),
                          TensorClaim("s", {}, {Box{}}), ScalarClaim("step", "-9223372036854775808"),
                          BytesClaim("rng", UINT64_MAX), JsonClaim("cfg", std::string("{\"\\u0000\":1}")),
                          TensorClaim(std::string("k\0\xff", 3), {0}, {})};
  const RankDescription back = DecodeDescription(EncodeDescription(d), 2);
  REQUIRE(back.size() == d.size());
  for (std::size_t i = 0; i < d.size(); ++i) {
    CHECK(back[i].key == d[i].key);
    CHECK(back[i].kind == d[i].kind);
    CHECK(back[i].shape == d[i].shape);
    CHECK(back[i].boxes == d[i].boxes);
    CHECK(back[i].value == d[i].value);
    CHECK(back[i].size == d[i].size);
    if (d[i].kind == EntryKind::kTensor || d[i].kind == EntryKind::kScalar) CHECK(back[i].dtype == d[i].dtype);
  }

  const std::vector<std::vector<ChunkRef>> requests{{}, {{1, 2}, {UINT32_MAX, 0}}, {}};
  for (int r = 0; r < 3; ++r) {
    bool any = false;
    CHECK(DecodeRequests(EncodeRequests(requests), r, 3, any) == requests[r]);
    CHECK(any);
  }
  bool any = true;
  CHECK(DecodeRequests(EncodeRequests({{}, {}}), 1, 2, any).empty());
  CHECK_FALSE(any);

  const std::vector<std::string> digests{"xxh3-64:0123456789abcdef", "", std::string(1000, 'x')};
  CHECK(DecodeDigests(EncodeDigests(digests), 1) == digests);

  const std::vector<std::vector<Write>> writes{{Write{{3, 4}, 0, 0}}, {}, {Write{{0, 0}, 1, 1}, Write{{5, 1}, 2, 0}}};
  const PlanMessage p = DecodePlan(EncodePlan("/tmp/x.staging", 3, writes), 2, 3);
  CHECK(p.staging == "/tmp/x.staging");
  CHECK(p.key_count == 3);
  CHECK(p.writes == std::vector<ChunkRef>{{0, 0}, {5, 1}});
  CHECK(p.keys == std::vector<uint32_t>{1, 2});
  CHECK(DecodePlan(EncodePlan("", 3, writes), 1, 3).writes.empty());
  CHECK_THROWS_WITH_AS(DecodePlan(EncodePlan("", 2, writes), 2, 3), doctest::Contains("a write of key 2 of 2"), Error);

  RankResult res;
  res.file = "shard-00001-of-00002.h5";
  res.bytes = 12345;
  res.index = "xxh3-64:0123456789abcdef";
  res.chunks = 1ULL << 40;
  const RankResult rb = DecodeResult(EncodeResult(res), 1);
  CHECK(rb.file == res.file);
  CHECK(rb.bytes == res.bytes);
  CHECK(rb.index == res.index);
  CHECK(rb.chunks == res.chunks);
}

TEST_CASE("malformed messages are kComm errors naming the message, never a crash") {
  RankResult res;
  res.file = "f";
  res.index = "xxh3-64:0123456789abcdef";
  res.chunks = 3;
  const std::vector<std::pair<Message, std::function<void(std::span<const uint8_t>)>>> cases{
      {EncodeDescription({TensorClaim("w", {4, 4}, {Box{{0, 0}, {4, 4}}}), ScalarClaim("s", "1"), BytesClaim("b", 300),
                          JsonClaim("j", "[]")}),
       [](std::span<const uint8_t> m) { DecodeDescription(m, 3); }},
      {EncodeRequests({{{1, 2}}, {{300, 0}}}),
       [](std::span<const uint8_t> m) {
         bool any;
         DecodeRequests(m, 1, 2, any);
       }},
      {EncodeDigests({"abc", "de"}), [](std::span<const uint8_t> m) { DecodeDigests(m, 1); }},
      {EncodePlan("dir", 2, {{Write{{1, 0}, 0, 0}}, {Write{{2, 0}, 1, 1}}}), [](std::span<const uint8_t> m) { DecodePlan(m, 1, 2); }},
      {EncodeResult(res), [](std::span<const uint8_t> m) { DecodeResult(m, 1); }},
      {EncodeDescription({TensorClaim("w", {4, 4}, {Box{{0, 0}, {4, 4}}}), BytesClaim("b", 300)}, std::vector<uint32_t>{2, 7}),
       [](std::span<const uint8_t> m) {
         std::vector<uint32_t> entries;
         DecodeDescription(m, 3, entries);
       }},
      {EncodeKeyTable(MakeKeyTable({TensorClaim("w", {8, 4}, {Box{{0, 0}, {2, 4}}}), ScalarClaim("s", "1"),
                                    BytesClaim("b", 300), JsonClaim("j", "[]")},
                                   4)),
       [](std::span<const uint8_t> m) {
         // Rank 0's table names rank 0 in its errors ("save: rank 0's key table").
         DecodeKeyTable(m, 4);
       }},
      {EncodePlan("dir", 3, {{Write{{1, 0}, 0, 0}}, {Write{{2, 0}, 2, 1}}}),
       [](std::span<const uint8_t> m) {
         const std::vector<uint8_t> fast{0, 1};
         const std::vector<Write> mine{Write{{1, 0}, 1, 1}};
         DecodePlan(m, 1, 2, fast, mine);
       }},
  };
  auto expect_comm = [](const std::function<void(std::span<const uint8_t>)>& decode, std::span<const uint8_t> m) {
    try {
      decode(m);
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kComm);
      CHECK(std::string(e.what()).starts_with("save: rank "));
      CHECK(std::string(e.what()).find("malformed message") != std::string::npos);
      return true;
    }
    return false;
  };
  std::mt19937 rng(11);
  for (const auto& [message, decode] : cases) {
    decode(message);  // the intact message is fine
    for (std::size_t n = 0; n < message.size(); ++n) {
      CHECK_MESSAGE(expect_comm(decode, std::span<const uint8_t>(message.data(), n)), "truncated to ", n, " bytes");
    }
    Message longer = message;
    longer.push_back(0);
    CHECK(expect_comm(decode, longer));
    Message wrong_tag = message;
    wrong_tag[0] ^= 0x20;
    CHECK(expect_comm(decode, wrong_tag));
    // Random damage: decoded or refused, never undefined behaviour (the sanitizers run this).
    for (int i = 0; i < 2000; ++i) {
      Message m = message;
      const int flips = 1 + static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) m[rng() % m.size()] = static_cast<uint8_t>(rng());
      m[0] = message[0];
      try {
        decode(m);
      } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::kComm);
      }
    }
  }
  // Counts the bytes cannot hold are refused before anything is allocated.
  internal::WireWriter w('D');
  w.U8(0);  // no positions
  w.Varint(UINT64_MAX / 2);
  const Message huge = w.Take();
  CHECK_THROWS_WITH_AS(DecodeDescription(huge, 5), doctest::Contains("does not fit in the 0 bytes left"), Error);
  // Varints longer than 64 bits, an unknown kind or dtype.
  Message overlong{'H', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
  CHECK_THROWS_WITH_AS(DecodeDigests(overlong, 0), doctest::Contains("a number overflows 64 bits"), Error);
  CHECK_THROWS_WITH_AS(DecodeDescription(Message{'D', 0, 1, 1, 'k', 9}, 0), doctest::Contains("unknown entry kind 9"), Error);
  CHECK_THROWS_WITH_AS(DecodeDescription(Message{'D', 0, 1, 1, 'k', 1, 200, 0}, 0), doctest::Contains("unknown dtype 200"), Error);
  CHECK_THROWS_WITH_AS(DecodePlan(EncodePlan("d", 0, {{}, {}}), 0, 3), doctest::Contains("lists for 2 ranks, the group has 3"),
                       Error);
  CHECK_THROWS_WITH_AS(DecodeDescription(Message{}, 4),
                       "save: rank 4's description: malformed message (truncated: 1 more bytes needed, at byte 0 of 0)",
                       Error);
}

TEST_CASE("wire: varints and zigzag at their limits") {
  internal::WireWriter w('x');
  const std::vector<int64_t> ints{0, -1, 1, INT64_MIN, INT64_MAX, -64, 63, 64};
  const std::vector<uint64_t> uints{0, 127, 128, UINT64_MAX, 1ULL << 63};
  for (int64_t i : ints) w.Signed(i);
  for (uint64_t u : uints) w.Varint(u);
  w.F64(-0.0);
  const Message m = w.Take();
  internal::WireReader r(m, "test", 'x');
  for (int64_t i : ints) CHECK(r.Signed() == i);
  for (uint64_t u : uints) CHECK(r.Varint() == u);
  CHECK(std::signbit(r.F64()));
  r.Finish();
}

namespace {

// What step 1's fast path (checkpoint/save.cc) does, over simulated ranks: rank 0's key
// table through its message, each rank's FastEntries, their minimum, each rank's other
// claims through a description message, and the plan; `gathered` gets the bytes rank 0
// receives from the others.
struct FastPlanned {
  KeyTable table;
  std::vector<uint8_t> fast;
  SavePlan plan;
  std::string error;
  std::size_t gathered = 0, table_bytes = 0;
};

FastPlanned PlanFast(const std::vector<RankDescription>& d) {
  FastPlanned out;
  const int world = static_cast<int>(d.size());
  const Message table = EncodeKeyTable(MakeKeyTable(d[0], world));
  out.table_bytes = table.size();
  out.table = DecodeKeyTable(table, world);
  out.fast.assign(out.table.size(), 1);
  for (int r = 0; r < world; ++r) {
    const std::vector<uint8_t> mine = FastEntries(out.table, d[r], r);
    for (std::size_t k = 0; k < mine.size(); ++k) out.fast[k] = std::min(out.fast[k], mine[k]);
  }
  try {
    SavePlanner planner(world);
    planner.Add(d[0]);
    planner.AddFastParts(out.fast);
    for (int r = 1; r < world; ++r) {
      std::vector<uint32_t> entries;
      const RankDescription claims = SlowClaims(out.table, out.fast, d[r], entries);
      const Message m = EncodeDescription(claims, entries);
      out.gathered += m.size();
      RankDescription slow = DecodeDescription(m, r, entries);
      planner.Add(std::move(slow), std::move(entries));
    }
    out.plan = planner.Finish();
  } catch (const Error& e) {
    out.error = e.what();
  }
  return out;
}

// Every rank's writes as it decodes them from the plan message (with its own fast writes).
std::vector<PlanMessage> DecodedWrites(const SavePlan& plan, const KeyTable& table, const std::vector<uint8_t>& fast) {
  const Message m = EncodePlan("dir", static_cast<uint32_t>(plan.keys.size()), WritesByRank(plan, fast));
  std::vector<PlanMessage> out;
  for (int r = 0; r < plan.world; ++r) out.push_back(DecodePlan(m, r, plan.world, fast, FastWrites(table, fast, r)));
  return out;
}

// The fast path gives the plan, the errors and every rank's writes that every rank
// describing everything gives. Returns the fast path's result.
FastPlanned CheckFastSameAsSlow(const std::vector<RankDescription>& d) {
  std::string slow_error;
  SavePlan slow;
  try {
    slow = PlanSave(d);
  } catch (const Error& e) {
    slow_error = e.what();
  }
  FastPlanned fast = PlanFast(d);
  CHECK(fast.error == slow_error);
  if (!slow_error.empty() || !fast.error.empty()) return fast;
  AssignWriters(slow);
  AssignWriters(fast.plan);
  SavePlan& a = fast.plan;
  REQUIRE(a.keys.size() == slow.keys.size());
  for (std::size_t k = 0; k < a.keys.size(); ++k) {
    const SaveKey& x = a.keys[k];
    const SaveKey& y = slow.keys[k];
    CAPTURE(x.key);
    CHECK(x.key == y.key);
    CHECK(x.kind == y.kind);
    CHECK(x.dtype == y.dtype);
    CHECK(x.shape == y.shape);
    CHECK(x.value == y.value);
    CHECK(x.size == y.size);
    CHECK(x.step == y.step);
    CHECK(x.row_bytes == y.row_bytes);
    REQUIRE(x.runs.size() == y.runs.size());
    for (std::size_t i = 0; i < x.runs.size(); ++i) {
      CHECK(x.runs[i].first_rank == y.runs[i].first_rank);
      CHECK(x.runs[i].first_part == y.runs[i].first_part);
      CHECK(x.runs[i].count == y.runs[i].count);
      CHECK(x.runs[i].entry == y.runs[i].entry);
    }
    CheckSameRegions(x, y);
  }
  CHECK(ReplicaRequests(a) == ReplicaRequests(slow));
  const std::vector<PlanMessage> wa = DecodedWrites(a, fast.table, fast.fast);
  const std::vector<PlanMessage> wb = DecodedWrites(slow, {}, {});
  const std::vector<uint64_t> counts = WriteCounts(a);
  REQUIRE(wa.size() == wb.size());
  for (std::size_t r = 0; r < wa.size(); ++r) {
    CAPTURE(r);
    CHECK(wa[r].writes == wb[r].writes);
    CHECK(wa[r].keys == wb[r].keys);
    CHECK(counts[r] == wb[r].writes.size());
  }
  return fast;
}

}  // namespace

TEST_CASE("fast path: regular keys, equal scalars and json are not described; bytes and odd keys are") {
  constexpr int kWorld = 8;
  const Shape big{8 * 3 - 1, 4}, small{5, 2}, one{16};  // small: shape[0] < world, parts past 5 empty
  const auto d = Ranks(kWorld, [&](int r) {
    RankDescription out{TensorClaim("a", big, {Part(big, 3, r)}),
                        TensorClaim("b", small, r < 5 ? std::vector<Box>{Part(small, 1, r)} : std::vector<Box>{}),
                        TensorClaim("c", one, r < 2 ? std::vector<Box>{Part(one, 8, r)} : std::vector<Box>{}, DType::kInt32),
                        ScalarClaim("step", "7"), JsonClaim("cfg", "{\"lr\":1}"), BytesClaim("rng", 16)};
    if (r == 6) out.push_back(ScalarClaim("only6", "1"));
    return out;
  });
  const FastPlanned f = CheckFastSameAsSlow(d);
  REQUIRE(f.error.empty());
  CHECK(f.fast == std::vector<uint8_t>{1, 1, 1, 1, 1, 0});
  CHECK(f.plan.keys[0].runs.size() == 1);
  CHECK(f.plan.keys[0].runs[0].count == kWorld);
  CHECK(f.plan.keys[1].runs[0].count == 5);
  CHECK(f.plan.keys[2].runs[0].count == 2);
  CHECK(f.plan.keys.back().key == "only6");
  // Ranks 1..7 described only their bytes (and rank 6 its extra key): a few bytes each.
  const std::size_t slow_bytes = [&] {
    std::size_t n = 0;
    for (int r = 1; r < kWorld; ++r) n += EncodeDescription(d[r]).size();
    return n;
  }();
  CHECK(f.gathered * 5 < slow_bytes);
}

TEST_CASE("fast path: what breaks it falls back to the slow path, with the same plan and errors") {
  constexpr int kWorld = 6;
  const Shape s{12, 3};
  auto base = [&](int r) {
    return RankDescription{TensorClaim("w", s, {Part(s, 2, r)}), TensorClaim("v", s, {Part(s, 2, r)}),
                           ScalarClaim("step", "3"), BytesClaim("rng", 4)};
  };
  SUBCASE("regular on every rank but one: that rank splits its part in two") {
    const auto d = Ranks(kWorld, [&](int r) {
      RankDescription out = base(r);
      if (r == 4) out[0].boxes = {Box{{8, 0}, {1, 3}}, Box{{9, 0}, {1, 3}}};
      return out;
    });
    const FastPlanned f = CheckFastSameAsSlow(d);
    CHECK(f.fast == std::vector<uint8_t>{0, 1, 1, 0});
    REQUIRE(f.error.empty());
    CHECK_FALSE(f.plan.keys[0].regular());
    CHECK(f.plan.keys[0].regions.size() == 7);
  }
  SUBCASE("another rank's part (a rank holds part r + 1): the same rule, not the fast path") {
    const auto d = Ranks(kWorld, [&](int r) {
      RankDescription out = base(r);
      out[1].boxes = {Part(s, 2, (r + 1) % kWorld)};
      return out;
    });
    const FastPlanned f = CheckFastSameAsSlow(d);
    CHECK(f.fast[1] == 0);
    CHECK(f.plan.keys[1].regular());  // regular all the same, from the descriptions
  }
  SUBCASE("a rank without a key: a scalar (fine) and a tensor part (a gap, the same error)") {
    const auto scalar = Ranks(kWorld, [&](int r) {
      RankDescription out = base(r);
      if (r == 3) out.erase(out.begin() + 2);
      return out;
    });
    CHECK(CheckFastSameAsSlow(scalar).fast == std::vector<uint8_t>{1, 1, 0, 0});
    const auto tensor = Ranks(kWorld, [&](int r) {
      RankDescription out = base(r);
      if (r == 3) out.erase(out.begin() + 1);
      return out;
    });
    const FastPlanned f = CheckFastSameAsSlow(tensor);
    CHECK(f.error.find("key 'v'") != std::string::npos);
  }
  SUBCASE("dtype and shape disagreements are reported naming the key and rank, as without it") {
    const auto dtype = Ranks(kWorld, [&](int r) {
      RankDescription out = base(r);
      if (r == 2) out[0].dtype = DType::kInt32;
      if (r == 5) out[1].shape = {12, 4};
      return out;
    });
    const FastPlanned f = CheckFastSameAsSlow(dtype);
    CHECK(f.error.find("key 'w': rank 2 has int32") != std::string::npos);
    CHECK(f.error.find("key 'v': rank 5 has") != std::string::npos);
    const auto value = Ranks(kWorld, [&](int r) {
      RankDescription out = base(r);
      if (r == 1) out[2].value = "4";
      return out;
    });
    CHECK(CheckFastSameAsSlow(value).error.find("key 'step': rank 1 has value 4") != std::string::npos);
  }
  SUBCASE("replicas: every rank holds the whole tensor") {
    const auto d = Ranks(kWorld, [&](int r) {
      RankDescription out = base(r);
      out[1].boxes = {Box::Full(s)};
      return out;
    });
    const FastPlanned f = CheckFastSameAsSlow(d);
    CHECK(f.fast[1] == 0);
    REQUIRE(f.error.empty());
    CHECK(f.plan.keys[1].regions.at(0).holder_count == kWorld);
  }
  SUBCASE("an empty chunk past the last part, where the others hold none") {
    const Shape few{3, 3};
    const auto d = Ranks(kWorld, [&](int r) {
      RankDescription out = base(r);
      out[1] = TensorClaim("v", few, r < 3 ? std::vector<Box>{Part(few, 1, r)} : std::vector<Box>{});
      if (r == 4) out[1].boxes = {Box{{3, 0}, {0, 3}}};
      return out;
    });
    const FastPlanned f = CheckFastSameAsSlow(d);
    CHECK(f.fast[1] == 0);
  }
  SUBCASE("keys in another order on one rank, and rank 0 without a rule (two chunks)") {
    const auto d = Ranks(kWorld, [&](int r) {
      RankDescription out = base(r);
      if (r == 2) std::swap(out[0], out[1]);
      if (r == 0) out[1].boxes = {Box{{0, 0}, {1, 3}}, Box{{1, 0}, {1, 3}}};
      return out;
    });
    const FastPlanned f = CheckFastSameAsSlow(d);
    CHECK(f.fast == std::vector<uint8_t>{0, 0, 1, 0});
    CHECK(f.table[1].step == 0);
  }
  SUBCASE("one rank") {
    const auto d = Ranks(1, [&](int) { return RankDescription{TensorClaim("w", s, {Box::Full(s)}), BytesClaim("b", 1)}; });
    CHECK(CheckFastSameAsSlow(d).fast == std::vector<uint8_t>{1, 0});
  }
}

TEST_CASE("fast path: random states plan as without it") {
  std::mt19937 rng(5);
  int fast_keys = 0, slow_keys = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int world = 1 + static_cast<int>(rng() % 6);
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 9), step = 1 + static_cast<int64_t>(rng() % 3);
    const Shape s{rows, 2};
    std::vector<RankDescription> d;
    for (int r = 0; r < world; ++r) {
      RankDescription out;
      for (int k = 0; k < 3; ++k) {
        std::vector<Box> boxes;
        if (r * step < rows) boxes.push_back(Part(s, step, r));
        switch (rng() % 8) {
          case 0: boxes.clear(); break;                                  // a gap (or nothing missing)
          case 1: boxes = {Box::Full(s)}; break;                         // a replica
          case 2: if (!boxes.empty()) boxes[0].offsets[1] = 0; break;   // as it was
          default: break;
        }
        if (rng() % 10 != 0) out.push_back(TensorClaim("t" + std::to_string(k), s, std::move(boxes)));
      }
      if (rng() % 3 != 0) out.push_back(ScalarClaim("s", rng() % 5 ? "1" : "2"));
      d.push_back(std::move(out));
    }
    if (d[0].empty()) continue;
    CAPTURE(trial);
    const FastPlanned f = CheckFastSameAsSlow(d);
    for (uint8_t k : f.fast) ++(k ? fast_keys : slow_keys);
  }
  CHECK(fast_keys > 50);  // both paths are taken
  CHECK(slow_keys > 50);
}

TEST_CASE("fast path: messages that contradict it are kComm errors") {
  const Shape s{4, 2};
  const RankDescription rank0{TensorClaim("w", s, {Part(s, 2, 0)}), BytesClaim("b", 3)};
  const KeyTable table = MakeKeyTable(rank0, 2);
  REQUIRE(table[0].step == 2);
  CHECK(MakeKeyTable(rank0, 1)[0].step == 0);  // two parts, one rank
  const std::vector<uint8_t> fast{1, 0};
  // A description naming a key that every rank said was on the fast path.
  SavePlanner planner(2);
  planner.Add(rank0);
  planner.AddFastParts(fast);
  CHECK_THROWS_WITH_AS(planner.Add({TensorClaim("w", s, {Part(s, 2, 1)})}, {0}),
                       "save: rank 1's description: key 'w' is on the fast path, which no rank describes", Error);
  // A plan listing a write of a fast-path key, or writes out of plan order.
  const Message listed = EncodePlan("d", 2, {{}, {Write{{0, 0}, 0, 1}}});
  CHECK_THROWS_WITH_AS(DecodePlan(listed, 1, 2, fast, FastWrites(table, fast, 1)),
                       doctest::Contains("a write of key 0, which is on the fast path"), Error);
  const Message unordered = EncodePlan("d", 2, {{}, {Write{{1, 0}, 1, 0}, Write{{0, 0}, 0, 0}}});
  CHECK_THROWS_WITH_AS(DecodePlan(unordered, 1, 2), doctest::Contains("a write of key 0 after one of key 1"), Error);
  // A table whose step is not some rows of dim 0.
  KeyTable bad = table;
  bad[0].step = 5;
  try {
    DecodeKeyTable(EncodeKeyTable(bad), 2);
    FAIL("a step of 5 rows of 4 decoded");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kComm);
    CHECK(std::string(e.what()).find("save: rank 0's key table: malformed message (key 'w': a step of 5 rows") == 0);
  }
  CHECK_THROWS_WITH_AS(DecodeKeyTable(EncodeKeyTable(table), 1), doctest::Contains("a step of 2 rows for 1 ranks"), Error);
  // Positions that overflow 32 bits.
  internal::WireWriter w('D');
  w.U8(1);
  w.Varint(1);
  w.Varint(uint64_t{1} << 33);
  const Message far = w.Take();
  std::vector<uint32_t> entries;
  CHECK_THROWS_WITH_AS(DecodeDescription(far, 1, entries), doctest::Contains("an entry position of 8589934592 exceeds 32 bits"),
                       Error);
  // A wrong AddFastParts (a key rank 0 does not hold as part 0) is the planner's own error.
  SavePlanner wrong(2);
  wrong.Add({TensorClaim("w", s, {Part(s, 2, 1)})});
  CHECK_THROWS_AS(wrong.AddFastParts(std::vector<uint8_t>{1}), Error);
}
