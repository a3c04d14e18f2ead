// format v2: layout rules (format/grid.h) and the v2 metadata.json codec with its digest.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <set>
#include <string>
#include <vector>

#include "ckpt/ckpt.h"
#include "format/grid.h"

using namespace ckpt;

namespace {

std::vector<grid::PlacedBox> Cells(const Shape& shape, const std::vector<std::vector<int64_t>>& cuts,
                                   const std::function<int32_t(const std::vector<int64_t>&)>& file) {
  // cuts[d]: the start offsets of the parts of dimension d.
  std::vector<grid::PlacedBox> out;
  std::vector<int64_t> idx(shape.size(), 0);
  for (;;) {
    grid::PlacedBox b;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      const int64_t begin = cuts[d][idx[d]];
      const int64_t end = idx[d] + 1 < static_cast<int64_t>(cuts[d].size()) ? cuts[d][idx[d] + 1] : shape[d];
      b.box.offsets.push_back(begin);
      b.box.sizes.push_back(end - begin);
    }
    b.file = file(idx);
    out.push_back(b);
    std::size_t d = shape.size();
    while (d > 0) {
      --d;
      if (++idx[d] < static_cast<int64_t>(cuts[d].size())) break;
      idx[d] = 0;
      if (d == 0) return out;
    }
    if (shape.empty()) return out;
  }
}

std::vector<std::pair<Box, int32_t>> All(const TensorLayout& l, const Shape& shape) {
  std::vector<std::pair<Box, int32_t>> out;
  grid::ForEachChunk(l, shape, [&](const Box& b, int32_t f) { out.emplace_back(b, f); });
  return out;
}

bool Meets(const Box& a, const Box& b) {
  for (std::size_t d = 0; d < a.offsets.size(); ++d)
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) return false;
  return true;
}

}  // namespace

TEST_CASE("DescribeLayout finds the step rule, explicit parts and an affine file map") {
  // FSDP: 10 rows over 4 ranks, torch.chunk's rule (3, 3, 3, 1), rank r in file r.
  const Shape shape{10, 6};
  auto fsdp = Cells(shape, {{0, 3, 6, 9}, {0}}, [](const auto& i) { return static_cast<int32_t>(i[0]); });
  TensorLayout l = grid::DescribeLayout(shape, fsdp);
  CHECK(l.kind == TensorLayout::Kind::kGrid);
  CHECK(l.grid[0].step == 3);
  CHECK(l.grid[0].sizes.empty());
  CHECK(l.grid[1].step == 6);
  CHECK(l.file_base == 0);
  CHECK(l.file_strides == std::vector<int64_t>{1, 0});
  CHECK(l.cell_files.empty());
  CHECK(grid::ChunkCount(l, shape) == 4);
  REQUIRE(All(l, shape).size() == 4);
  CHECK(All(l, shape)[3].first == Box{{9, 0}, {1, 6}});

  // Uneven parts (array_split: 4, 3, 3) are explicit; a 2-D grid rank = 2i + j is affine.
  auto tp = Cells(shape, {{0, 4, 7}, {0, 3}}, [](const auto& i) { return static_cast<int32_t>(2 * i[0] + i[1]); });
  l = grid::DescribeLayout(shape, tp);
  CHECK(l.grid[0].sizes == std::vector<int64_t>{4, 3, 3});
  CHECK(l.grid[1].step == 3);
  CHECK(l.file_strides == std::vector<int64_t>{2, 1});
  CHECK(grid::CheckLayout("w", l, shape, 6).empty());
  CHECK_FALSE(grid::CheckLayout("w", l, shape, 5).empty());  // file 5 is not among 5 files

  // Files no affine map fits: listed per cell.
  auto shuffled = Cells(shape, {{0, 5}, {0}}, [](const auto& i) { return static_cast<int32_t>(i[0] == 0 ? 3 : 1); });
  shuffled.push_back(shuffled[0]);  // not a grid any more: a cell twice
  CHECK(grid::DescribeLayout(shape, shuffled).kind == TensorLayout::Kind::kChunks);
  shuffled.pop_back();
  auto three = Cells(shape, {{0, 2, 5}, {0}}, [](const auto& i) { return static_cast<int32_t>(i[0] == 1 ? 0 : 2); });
  l = grid::DescribeLayout(shape, three);
  CHECK(l.cell_files == std::vector<int32_t>{2, 0, 2});

  // Not a grid (an L of boxes): the explicit list.
  std::vector<grid::PlacedBox> odd = {{Box{{0, 0}, {5, 6}}, 0}, {Box{{5, 0}, {5, 2}}, 1}, {Box{{5, 2}, {5, 4}}, 2}};
  l = grid::DescribeLayout(shape, odd);
  CHECK(l.kind == TensorLayout::Kind::kChunks);
  CHECK(l.pieces.size() == 3);

  // 0-D and zero-volume tensors: one chunk.
  l = grid::DescribeLayout({}, {{Box{{}, {}}, 0}});
  CHECK(l.kind == TensorLayout::Kind::kGrid);
  CHECK(grid::ChunkCount(l, {}) == 1);
  CHECK(All(l, {}).size() == 1);
  l = grid::DescribeLayout({0, 4}, {{Box{{0, 0}, {0, 4}}, 0}});
  CHECK(l.kind == TensorLayout::Kind::kGrid);
  CHECK(l.grid[0].step == 0);
  CHECK(grid::CheckLayout("z", l, {0, 4}, 1).empty());
  CHECK(All(l, {0, 4}).size() == 1);
}

TEST_CASE("ForEachCell visits exactly the chunks a region meets (against brute force)") {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    const std::size_t rank = 1 + rng() % 3;
    Shape shape;
    std::vector<std::vector<int64_t>> cuts;
    for (std::size_t d = 0; d < rank; ++d) {
      shape.push_back(1 + static_cast<int64_t>(rng() % 12));
      std::set<int64_t> c{0};
      const int parts = static_cast<int>(rng() % 4);
      for (int p = 0; p < parts; ++p) c.insert(static_cast<int64_t>(rng() % shape[d]));
      cuts.emplace_back(c.begin(), c.end());
    }
    int32_t next = 0;
    const auto chunks = Cells(shape, cuts, [&](const auto&) { return next++ % 5; });
    const TensorLayout l = grid::DescribeLayout(shape, chunks);
    REQUIRE(grid::CheckLayout("k", l, shape, 5).empty());
    CHECK(grid::ChunkCount(l, shape) == static_cast<int64_t>(chunks.size()));
    Box region;
    for (std::size_t d = 0; d < rank; ++d) {
      const int64_t a = static_cast<int64_t>(rng() % shape[d]);
      region.offsets.push_back(a);
      region.sizes.push_back(1 + static_cast<int64_t>(rng() % (shape[d] - a)));
    }
    std::vector<std::pair<Box, int32_t>> want, got;
    for (const auto& c : chunks)
      if (Meets(c.box, region)) want.emplace_back(c.box, c.file);
    grid::ForEachCell(l, shape, region, [&](const Box& b, int32_t f) { got.emplace_back(b, f); });
    CAPTURE(round);
    CHECK(got == want);
  }
}

TEST_CASE("LayoutBuilder, chunk by chunk in any order, describes what DescribeLayout does over them all") {
  auto sorted = [](std::vector<grid::PlacedBox> v) {
    std::sort(v.begin(), v.end(), [](const grid::PlacedBox& a, const grid::PlacedBox& b) {
      return std::tie(a.box.offsets, a.box.sizes, a.file) < std::tie(b.box.offsets, b.box.sizes, b.file);
    });
    return v;
  };
  auto same = [](const std::vector<grid::PlacedBox>& a, const std::vector<grid::PlacedBox>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!(a[i].box == b[i].box) || a[i].file != b[i].file) return false;
    return true;
  };
  std::mt19937 rng(11);
  int grids = 0, lists = 0;
  for (int round = 0; round < 600; ++round) {
    const std::size_t rank = rng() % 4;
    Shape shape;
    std::vector<std::vector<int64_t>> cuts;
    for (std::size_t d = 0; d < rank; ++d) {
      shape.push_back(1 + static_cast<int64_t>(rng() % 10));
      std::set<int64_t> c{0};
      const int parts = static_cast<int>(rng() % 5);
      for (int p = 0; p < parts; ++p) c.insert(static_cast<int64_t>(rng() % shape[d]));
      cuts.emplace_back(c.begin(), c.end());
    }
    const int files = 1 + static_cast<int>(rng() % 4);
    const bool affine = rng() % 2;
    auto chunks = Cells(shape, cuts, [&](const std::vector<int64_t>& i) {
      if (!affine) return static_cast<int32_t>(rng() % static_cast<unsigned>(files));
      int64_t f = 0;
      for (int64_t x : i) f = f * 2 + x;
      return static_cast<int32_t>(f % 7);
    });
    const int order = static_cast<int>(rng() % 3);  // row-major, reversed, shuffled
    if (order == 1) std::reverse(chunks.begin(), chunks.end());
    if (order == 2) std::shuffle(chunks.begin(), chunks.end(), rng);
    // Sometimes not a grid: a cell missing, one twice, one cut in two, one grown over another.
    const int damage = static_cast<int>(rng() % 6);
    if (damage == 1 && chunks.size() > 1) chunks.erase(chunks.begin() + static_cast<std::ptrdiff_t>(rng() % chunks.size()));
    if (damage == 2) chunks.push_back(chunks[rng() % chunks.size()]);
    if (damage == 3 && rank > 0) {
      auto& c = chunks[rng() % chunks.size()];
      if (c.box.sizes[0] > 1) {
        grid::PlacedBox half = c;
        c.box.sizes[0] /= 2;
        half.box.offsets[0] += c.box.sizes[0];
        half.box.sizes[0] -= c.box.sizes[0];
        chunks.push_back(half);
      }
    }
    if (damage == 4 && rank > 0) chunks[rng() % chunks.size()].box.sizes[0] += 1;
    grid::LayoutBuilder b(rank);
    for (const auto& c : chunks) b.Add(c.box, c.file);
    const std::vector<grid::PlacedBox> back = b.Finish();
    CAPTURE(round);
    CAPTURE(damage);
    // Nothing lost, nothing made up.
    REQUIRE(same(sorted(back), sorted(chunks)));
    const TensorLayout want = grid::DescribeLayout(shape, chunks), got = grid::DescribeLayout(shape, back);
    CHECK(got.kind == want.kind);
    if (want.kind == TensorLayout::Kind::kGrid) {
      ++grids;
      CHECK(got == want);
      CHECK_FALSE(b.listed());
    } else {
      ++lists;
    }
  }
  CHECK(grids > 200);
  CHECK(lists > 50);

  // In write order, a 1-D grid of 100,000 chunks costs a file position per chunk and no
  // more; a 2-D grid written column by column (8 columns) stays a grid too.
  grid::LayoutBuilder rows(2);
  for (int64_t i = 0; i < 100000; ++i) rows.Add(Box{{i * 3, 0}, {3, 16}}, static_cast<int32_t>(i % 64));
  CHECK_FALSE(rows.listed());
  CHECK(rows.HeapBytes() <= 100000 * 4 * 2 + 1024);  // a vector that doubled: at most twice
  grid::LayoutBuilder cols(2);
  for (int64_t j = 0; j < 8; ++j)
    for (int64_t i = 0; i < 2048; ++i) cols.Add(Box{{i * 2, j * 5}, {2, 5}}, static_cast<int32_t>(i * 8 + j));
  CHECK_FALSE(cols.listed());
  const TensorLayout l = grid::DescribeLayout({4096, 40}, cols.Finish());
  CHECK(l.kind == TensorLayout::Kind::kGrid);
  CHECK(l.file_strides == std::vector<int64_t>{8, 1});
}

TEST_CASE("CheckLayout refuses layouts a reader could not walk") {
  TensorLayout l;
  l.kind = TensorLayout::Kind::kGrid;
  l.grid = {DimSplit{1, {}}};
  l.file_strides = {0};
  CHECK(grid::CheckLayout("k", l, {int64_t{1} << 40}, 1).front().find("cells") != std::string::npos);
  l.grid = {DimSplit{0, {}}};
  CHECK_FALSE(grid::CheckLayout("k", l, {8}, 1).empty());  // step 0 on a non-empty extent
  l.grid = {DimSplit{0, {3, 4}}};
  CHECK_FALSE(grid::CheckLayout("k", l, {8}, 1).empty());  // parts do not sum to 8
  l.grid = {DimSplit{2, {}}};
  l.file_strides = {int64_t{1} << 62};
  CHECK_FALSE(grid::CheckLayout("k", l, {8}, 1).empty());  // overflows
  l.file_strides = {1};
  CHECK(grid::CheckLayout("k", l, {8}, 4).empty());
  CHECK_FALSE(grid::CheckLayout("k", l, {8}, 3).empty());
  l.file_strides = {};
  l.cell_files = {0, 1, 2};
  CHECK_FALSE(grid::CheckLayout("k", l, {8}, 4).empty());  // 3 files for 4 cells
}

TEST_CASE("a step larger than the extent is one part, up to 2^63 - 1, without overflow (issue 32.3)") {
  // FORMAT.md §3.3: for n > 0, s >= 1; a larger s means one part. ceil(n / s) computed as
  // (n + s - 1) / s overflowed for s near 2^63: no part, so nothing was read or checked.
  for (const int64_t step : {int64_t{9}, int64_t{1} << 40, (int64_t{1} << 62) + 1, INT64_MAX - 1, INT64_MAX}) {
    CAPTURE(step);
    TensorLayout l;
    l.kind = TensorLayout::Kind::kGrid;
    l.grid = {DimSplit{step, {}}, DimSplit{4, {}}};
    l.file_strides = {0, 0};
    const Shape shape{8, 4};
    CHECK(grid::CheckLayout("k", l, shape, 1).empty());
    CHECK(grid::ChunkCount(l, shape) == 1);
    const auto all = All(l, shape);
    REQUIRE(all.size() == 1);
    CHECK(all[0].first == Box::Full(shape));
    std::vector<Box> met;
    grid::ForEachCell(l, shape, Box{{3, 1}, {5, 2}}, [&](const Box& b, int32_t) { met.push_back(b); });
    REQUIRE(met.size() == 1);
    CHECK(met[0] == Box::Full(shape));
    CHECK(grid::CellLocator(l, shape).FileOf(Box::Full(shape)) == 0);
  }
}

namespace {

Metadata TwoRankV2() {
  Metadata m;
  m.state_dict_type = StateDictType::kSharded;
  m.world_size = 2;
  m.files = {{"shard-00000-of-00002.h5", 0, 100, "xxh3-64:0123456789abcdef"},
             {"shard-00001-of-00002.h5", 1, 90, "xxh3-64:fedcba9876543210"}};
  EntryMeta t;
  t.kind = EntryKind::kTensor;
  t.dtype = DType::kFloat32;
  t.shape = {4, 2};
  for (int r = 0; r < 2; ++r) {
    ChunkMeta c;
    c.box = Box{{2 * r, 0}, {2, 2}};
    c.file = m.files[r].name;
    c.dataset = "w@" + std::to_string(2 * r) + ",0";
    c.checksum = "xxh3-64:0000000000000000";
    c.stored_bytes = 16;
    c.stats = ChunkStats{-1.0 - r, 1.0 + r, 0, 2, 0, 0, 4};
    t.chunks.push_back(c);
  }
  m.entries.emplace_back("w", t);
  EntryMeta b;
  b.kind = EntryKind::kBytes;
  b.dtype = DType::kUInt8;
  b.size = 3;
  ChunkMeta bc;
  bc.box = Box{{0}, {3}};
  bc.file = m.files[1].name;
  bc.stored_bytes = 3;
  b.chunks.push_back(bc);
  m.entries.emplace_back("blob", b);
  EntryMeta s;
  s.kind = EntryKind::kScalar;
  s.dtype = DType::kInt64;
  s.value = "1";
  m.entries.emplace_back("step", s);
  return m;
}

}  // namespace

TEST_CASE("metadata v2: layouts, aggregate stats and index digests; parsed back and written identically") {
  const std::string text = SerializeMetadata(TwoRankV2());
  CHECK(text.find("\"chunks\"") == std::string::npos);  // no chunk list for a grid
  CHECK(text.find("\"digest\": \"xxh3-64:") != std::string::npos);
  const Metadata back = ParseMetadata(text);
  CHECK(back.format_version == 2);
  CHECK_FALSE(back.resolved);
  CHECK(back.files[1].index == "xxh3-64:fedcba9876543210");
  const EntryMeta& w = *back.Find("w");
  CHECK(w.chunks.empty());
  CHECK(w.layout.kind == TensorLayout::Kind::kGrid);
  CHECK(w.layout.grid[0].step == 2);
  CHECK(w.layout.file_strides == std::vector<int64_t>{1, 0});
  CHECK(w.stored_bytes == 32);
  REQUIRE(w.stats);
  CHECK(w.stats->min == -2);
  CHECK(w.stats->max == 2);
  CHECK(w.stats->finite_count == 8);
  CHECK(back.Find("blob")->layout.pieces.at(0).file == 1);
  CHECK(back.Find("step")->value == "1");
  CHECK(SerializeMetadata(back) == text);
}

TEST_CASE("metadata v2: every single-bit flip anywhere in the file is refused") {
  const std::string text = SerializeMetadata(TwoRankV2());
  std::size_t refused = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = text;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      try {
        ParseMetadata(flipped);
        FAIL("accepted a flip of bit " << bit << " of byte " << i << " ('" << text[i] << "')");
      } catch (const Error&) {
        ++refused;
      }
    }
  }
  CHECK(refused == text.size() * 8);
  // The digest member removed, the rest valid JSON: a version 2 document without it is refused.
  const std::string no_digest = text.substr(0, text.rfind(",\n  \"digest\"")) + "\n}\n";
  CHECK_THROWS_WITH_AS(ParseMetadata(no_digest), doctest::Contains("no digest"), Error);
  CHECK_THROWS_WITH_AS(ParseMetadata(std::string(text).replace(text.find("\"w\""), 3, "\"v\"")),
                       doctest::Contains("digest mismatch"), Error);
}
