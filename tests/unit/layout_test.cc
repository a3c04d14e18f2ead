// layout/box: intersections, runs and tiling checked against brute force.
#include <doctest/doctest.h>

#include <random>
#include <map>
#include <set>

#include "layout/box.h"

using namespace ckpt;
using namespace ckpt::layout;

namespace {

// Row-major offset of global index `idx` in a buffer laid out over `box`.
int64_t OffsetIn(const Box& box, const std::vector<int64_t>& idx) {
  int64_t off = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) off = off * box.sizes[d] + (idx[d] - box.offsets[d]);
  return off;
}

Box RandomBox(const Shape& shape, std::mt19937& rng) {
  Box b = Box::Full(shape);
  for (std::size_t d = 0; d < shape.size(); ++d) {
    b.offsets[d] = std::uniform_int_distribution<int64_t>(0, shape[d])(rng);
    b.sizes[d] = std::uniform_int_distribution<int64_t>(0, shape[d] - b.offsets[d])(rng);
  }
  return b;
}

}  // namespace

TEST_CASE("Intersect and Contains") {
  const Box a{{0, 0}, {4, 4}}, b{{2, 3}, {4, 4}};
  const auto i = Intersect(a, b);
  REQUIRE(i);
  CHECK(*i == Box{{2, 3}, {2, 1}});
  CHECK_FALSE(Intersect(a, Box{{4, 0}, {1, 4}}));
  CHECK(Contains(a, Box{{1, 1}, {3, 3}}));
  CHECK_FALSE(Contains(a, Box{{1, 1}, {4, 3}}));
  CHECK(Intersect(Box{}, Box{}) == Box{});  // 0-D: the single element
}

TEST_CASE("ForEachRun visits exactly the region's elements, mapped correctly, in row-major order") {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 400; ++iter) {
    const int rank = static_cast<int>(rng() % 5);
    Shape shape;
    for (int d = 0; d < rank; ++d) shape.push_back(1 + static_cast<int64_t>(rng() % 6));
    const Box src = RandomBox(shape, rng), dst = RandomBox(shape, rng);
    const auto region = Intersect(src, dst);
    if (!region) continue;
    // Brute force: every element of region in row-major order.
    std::vector<std::pair<int64_t, int64_t>> want;
    std::vector<int64_t> idx(rank);
    const int64_t n = region->NumElements();
    for (int64_t e = 0; e < n; ++e) {
      int64_t rem = e;
      for (int d = rank; d-- > 0;) {
        idx[d] = region->offsets[d] + rem % region->sizes[d];
        rem /= region->sizes[d];
      }
      want.emplace_back(OffsetIn(src, idx), OffsetIn(dst, idx));
    }
    std::vector<std::pair<int64_t, int64_t>> got;
    int64_t runs = 0;
    ForEachRun(src, dst, *region, [&](const Run& r) {
      ++runs;
      for (int64_t k = 0; k < r.count; ++k) got.emplace_back(r.src + k, r.dst + k);
    });
    CHECK(got == want);
    CHECK(runs == CountRuns(src, dst, *region));
  }
}

TEST_CASE("ForEachRun merges whole trailing dimensions into one run") {
  const Box src{{0, 0, 0}, {8, 4, 5}}, dst{{2, 0, 0}, {3, 4, 5}};
  const Box region{{2, 0, 0}, {3, 4, 5}};
  int runs = 0;
  ForEachRun(src, dst, region, [&](const Run& r) {
    ++runs;
    CHECK(r.count == 60);
    CHECK(r.src == 40);
  });
  CHECK(runs == 1);
}

TEST_CASE("TilingProblems: exact tilings pass; gaps, overlaps, out of bounds are named") {
  const Shape s{10, 4};
  CHECK(TilingProblems(s, {Box{{0, 0}, {5, 4}}, Box{{5, 0}, {5, 4}}}).empty());
  CHECK(TilingProblems(s, {Box{{0, 0}, {10, 2}}, Box{{0, 2}, {10, 2}}}).empty());
  CHECK(TilingProblems({}, {Box{}}).empty());
  // A tensor of zero volume is exactly one chunk, the whole tensor (FORMAT.md §3.3, §9.1).
  CHECK(TilingProblems({0, 3}, {Box{{0, 0}, {0, 3}}}).empty());
  const auto first = [](const std::vector<std::string>& p) { return p.empty() ? std::string() : p[0]; };
  CHECK(first(TilingProblems({0, 3}, {})).find("exactly one chunk") != std::string::npos);
  CHECK(first(TilingProblems({4, 0}, {Box{{0, 0}, {2, 0}}, Box{{2, 0}, {2, 0}}})).find("exactly one chunk") !=
        std::string::npos);
  CHECK_FALSE(TilingProblems({4, 0}, {Box{{0, 0}, {2, 0}}}).empty());  // one chunk, not the whole
  CHECK_FALSE(TilingProblems({0, 3}, {Box{{0, 0}, {0, 3}}, Box{{0, 0}, {0, 3}}}).empty());
  const auto gap = TilingProblems(s, {Box{{0, 0}, {5, 4}}});
  REQUIRE(gap.size() == 1);
  CHECK(gap[0].find("gap") != std::string::npos);
  const auto overlap = TilingProblems(s, {Box{{0, 0}, {6, 4}}, Box{{5, 0}, {5, 4}}});
  REQUIRE(overlap.size() == 1);
  CHECK(overlap[0].find("[0:6, 0:4] and [5:10, 0:4] overlap") != std::string::npos);
  const auto oob = TilingProblems(s, {Box{{0, 0}, {11, 4}}});
  CHECK(oob[0].find("outside") != std::string::npos);
  const auto rank = TilingProblems(s, {Box{{0}, {10}}});
  CHECK(rank[0].find("rank") != std::string::npos);
  CHECK(TilingProblems({4}, {Box{{0}, {4}}, Box{{0}, {4}}})[0].find("overlap") != std::string::npos);
}

TEST_CASE("TilingProblems agrees with brute-force coverage on random box sets") {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 300; ++iter) {
    const Shape shape{1 + static_cast<int64_t>(rng() % 5), 1 + static_cast<int64_t>(rng() % 5)};
    std::vector<Box> boxes;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) boxes.push_back(RandomBox(shape, rng));
    std::map<std::pair<int64_t, int64_t>, int> cover;
    for (const Box& b : boxes)
      for (int64_t i = 0; i < b.sizes[0]; ++i)
        for (int64_t j = 0; j < b.sizes[1]; ++j) ++cover[{b.offsets[0] + i, b.offsets[1] + j}];
    bool exact = static_cast<int64_t>(cover.size()) == shape[0] * shape[1];
    for (const auto& [k, v] : cover) exact = exact && v == 1;
    CHECK(TilingProblems(shape, boxes).empty() == exact);
  }
}

TEST_CASE("BalancedSplit is balanced, in order, and tiles the range") {
  static_assert(ckpt::BalancedSplit(10, 4, 0) == ckpt::SplitPart{0, 3});  // as FSDP splits rows
  static_assert(ckpt::BalancedSplit(10, 4, 1) == ckpt::SplitPart{3, 3});
  static_assert(ckpt::BalancedSplit(10, 4, 3) == ckpt::SplitPart{8, 2});
  for (int64_t n : {0, 1, 5, 12, 20, 30})
    for (int parts : {1, 2, 3, 4, 7}) {
      int64_t next = 0;
      for (int p = 0; p < parts; ++p) {
        const auto [b, c] = ckpt::BalancedSplit(n, parts, p);
        CHECK(b == next);
        CHECK(c == n / parts + (p < n % parts ? 1 : 0));
        next = b + c;
      }
      CHECK(next == n);
    }
}
