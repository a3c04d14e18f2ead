// tests/hostile/hostile_test.cc: the matchers and checks that run on untrusted text and
// chunk lists stay linear and recursion-free (issue 8): the schema's pattern matcher
// against std::regex on short strings and alone on long ones, glob matching against
// fnmatch(3), tiling checks on thousands of identical or thin chunks, deep documents under
// a recursive schema, and files that are not regular files.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/metadata.h"
#include "layout/box.h"
#include "ops/json_schema.h"
#include "ops/util.h"
#include "test_util.h"

namespace {

using nlohmann::json;
using ckpt::Box;
using ckpt::Shape;
using ckpt::ops::detail::JsonSchema;

bool PatternMatches(const std::string& pattern, const std::string& text) {
  const JsonSchema s(json{{"type", "string"}, {"pattern", pattern}});
  return s.Validate(json(text)).empty();
}

const char* kPatterns[] = {
    // The shipped schema's:
    "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]+)?Z$",
    "^shard-[0-9]{5,}-of-[0-9]{5,}\\.h5$", "^[^/.][^/]*$", "^xxh3-64:[0-9a-f]{16}$",
    // And the rest of the subset:
    "a|b|", "(ab|a)*c$", "^(a+)+$", "x{2,3}y?", "[\\d\\-]+", "\\w\\s\\W", "^.*$", "a{0}b",
    "(?:ab){1,2}$", "[a-c-]z", "\\.\\/\\\\", "^$", "(a*)*b", "[^a-z]", "\\x41+", "a.c",
};

}  // namespace

TEST_CASE("schema patterns: the same answers as std::regex on short strings") {
  std::mt19937 rng(8);
  const std::string alphabet = "ab0123456789-:.TZxyz/sharde_fohAc \n\\";
  std::vector<std::string> texts = {"", "2024-01-02T03:04:05Z", "2024-01-02T03:04:05.123Z", "shard-00001-of-00002.h5",
                                    "shard-1-of-2.h5", "w", ".hidden", "a/b", "xxh3-64:0123456789abcdef", "aaaa",
                                    "abab", "xxy", "{}", "abc"};
  for (int i = 0; i < 400; ++i) {
    std::string t;
    for (std::size_t n = rng() % 12; n-- > 0;) t += alphabet[rng() % alphabet.size()];
    texts.push_back(t);
  }
  for (const char* p : kPatterns) {
    std::regex re;
    try {
      re = std::regex(p, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
      FAIL("std::regex refuses ", p);
    }
    for (const auto& t : texts) {
      INFO("pattern ", p, " text ", json(t).dump());
      CHECK(PatternMatches(p, t) == std::regex_search(t, re));
    }
  }
}

TEST_CASE("schema patterns: linear on long strings (std::regex overflowed the stack at ~30,000)") {
  const std::string long_text(1 << 20, 'a');  // 1 MiB
  CHECK(PatternMatches("^[^/.][^/]*$", long_text));
  CHECK_FALSE(PatternMatches("^shard-[0-9]{5,}-of-[0-9]{5,}\\.h5$", long_text));
  CHECK_FALSE(PatternMatches("^(a+)+$", long_text + "b"));  // exponential when backtracking
}

TEST_CASE("schema patterns: what the matcher does not support is refused with the schema") {
  for (const char* p : {"(a", "a)", "[a", "*a", "\\1", "(?=a)", "a{3,2}", "\\b", "\\"}) {
    INFO(p);
    CHECK_THROWS_AS(JsonSchema(json{{"pattern", p}}), ckpt::Error);
  }
}

TEST_CASE("schema: a deep document under a recursive schema is reported, not a stack overflow") {
  const JsonSchema tree(json::parse(R"({"type": "array", "items": {"$ref": "#"}})"));
  json doc = json::array();
  for (int i = 0; i < 100000; ++i) doc = json::array({std::move(doc)});
  const auto errors = tree.Validate(doc);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].find("nested more than") != std::string::npos);
  // A $ref cycle that reads nothing ends too.
  const JsonSchema cycle(json::parse(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"));
  CHECK(cycle.Validate(json(1)).size() == 1);
  // A long or deep value in a message is cut short, not dumped whole.
  const JsonSchema str(json::parse(R"({"type": "string"})"));
  const auto deep = str.Validate(doc);
  REQUIRE(deep.size() == 1);
  CHECK(deep[0].size() < 200);
}

TEST_CASE("glob: the same answers as fnmatch(3), linear on a 1 MB key") {
  std::mt19937 rng(9);
  const std::string pat_alphabet = "ab.*?[]!-\\:=";
  const std::string text_alphabet = "ab.-]!";
  std::vector<std::string> pats = {"*", "optimizer.*", "*.w", "a?b", "[ab]*", "[!a]*", "[]a]", "[a-b]", "\\*",
                                   "[[:alpha:]]*", "a[", "*a*b*", "", "[[:nope:]]", "[[.a.]]", "[[=b=]]*", "[[.ab.]]"};
  for (int i = 0; i < 300; ++i) {
    std::string p;
    for (std::size_t n = 1 + rng() % 7; n-- > 0;) p += pat_alphabet[rng() % pat_alphabet.size()];
    pats.push_back(p);
  }
  for (const auto& p : pats)
    for (int i = 0; i < 40; ++i) {
      std::string t;
      for (std::size_t n = rng() % 8; n-- > 0;) t += text_alphabet[rng() % text_alphabet.size()];
      INFO("pattern ", p, " text ", t);
      CHECK(ckpt::ops::detail::GlobMatch(p, t) == (::fnmatch(p.c_str(), t.c_str(), 0) == 0));
    }
  const std::string key(1 << 20, 'a');
  CHECK_FALSE(ckpt::ops::detail::GlobMatch("*a*a*a*a*a*a*b", key));
  CHECK(ckpt::ops::detail::MatchesAny({"x*", "*a"}, key));
}

TEST_CASE("tiling: n identical chunks give a few reports, in linear time") {
  for (const int n : {6000, 60000}) {
    std::vector<Box> boxes(static_cast<std::size_t>(n), Box{{0, 0}, {8, 4}});
    const auto problems = ckpt::layout::TilingProblems({8, 4}, boxes);
    REQUIRE(problems.size() == 1);
    CHECK(problems[0].find("is listed " + std::to_string(n) + " times") != std::string::npos);
  }
  // Many overlapping, not identical: at most 20 pairs named.
  std::vector<Box> shifted;
  for (int i = 0; i < 20000; ++i) shifted.push_back(Box{{0, i % 2}, {8, 3}});
  for (int i = 0; i < 20000; ++i) shifted.push_back(Box{{i % 7, 0}, {1, 4}});
  const auto problems = ckpt::layout::TilingProblems({8, 4}, shifted);
  CHECK(problems.size() <= 45);
  CHECK_FALSE(problems.empty());
}

TEST_CASE("tiling: exact tilings of many thin chunks pass in n log n (columns, grids, 3-D)") {
  std::vector<Box> cols;
  for (int64_t j = 0; j < 50000; ++j) cols.push_back(Box{{0, j}, {16, 1}});
  CHECK(ckpt::layout::TilingProblems({16, 50000}, cols).empty());
  cols.pop_back();
  const auto gap = ckpt::layout::TilingProblems({16, 50000}, cols);
  REQUIRE(gap.size() == 1);
  CHECK(gap[0].find("gap") != std::string::npos);
  std::vector<Box> grid;
  for (int64_t i = 0; i < 40; ++i)
    for (int64_t j = 0; j < 40; ++j)
      for (int64_t k = 0; k < 10; ++k) grid.push_back(Box{{i * 2, j * 3, k}, {2, 3, 1}});
  CHECK(ckpt::layout::TilingProblems({80, 120, 10}, grid).empty());
}

TEST_CASE("tiling agrees with brute-force coverage on random 3-D box sets") {
  std::mt19937 rng(12);
  int exact_seen = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    const Shape shape{1 + static_cast<int64_t>(rng() % 3), 1 + static_cast<int64_t>(rng() % 3),
                      1 + static_cast<int64_t>(rng() % 3)};
    std::vector<Box> boxes;
    // Cut the tensor into a random grid, then maybe damage it.
    std::vector<std::vector<int64_t>> cuts(3);
    for (int d = 0; d < 3; ++d) {
      cuts[d] = {0};
      for (int64_t x = 1; x < shape[d]; ++x)
        if (rng() % 2) cuts[d].push_back(x);
      cuts[d].push_back(shape[d]);
    }
    for (std::size_t a = 0; a + 1 < cuts[0].size(); ++a)
      for (std::size_t b = 0; b + 1 < cuts[1].size(); ++b)
        for (std::size_t c = 0; c + 1 < cuts[2].size(); ++c)
          boxes.push_back(Box{{cuts[0][a], cuts[1][b], cuts[2][c]},
                              {cuts[0][a + 1] - cuts[0][a], cuts[1][b + 1] - cuts[1][b], cuts[2][c + 1] - cuts[2][c]}});
    switch (rng() % 4) {
      case 0: break;
      case 1: boxes.erase(boxes.begin() + static_cast<long>(rng() % boxes.size())); break;
      case 2: boxes.push_back(boxes[rng() % boxes.size()]); break;
      default: {
        Box& b = boxes[rng() % boxes.size()];
        const std::size_t d = rng() % 3;
        if (b.sizes[d] > 1) --b.sizes[d];
        else if (b.offsets[d] > 0) --b.offsets[d], ++b.sizes[d];
      }
    }
    std::vector<int> cover(static_cast<std::size_t>(shape[0] * shape[1] * shape[2]), 0);
    for (const Box& b : boxes)
      for (int64_t i = 0; i < b.sizes[0]; ++i)
        for (int64_t j = 0; j < b.sizes[1]; ++j)
          for (int64_t k = 0; k < b.sizes[2]; ++k)
            ++cover[static_cast<std::size_t>(((b.offsets[0] + i) * shape[1] + b.offsets[1] + j) * shape[2] +
                                             b.offsets[2] + k)];
    bool exact = true;
    for (int c : cover) exact = exact && c == 1;
    exact_seen += exact;
    INFO("iteration ", iter);
    CHECK(ckpt::layout::TilingProblems(shape, boxes).empty() == exact);
  }
  CHECK(exact_seen > 100);
}

TEST_CASE("files the user names: a FIFO, a device and a directory are refused without blocking") {
  ckpt_test::TempDir tmp("hostile-files");
  const auto fifo = tmp / "x.safetensors";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(ckpt::ops::detail::ReadFileText(fifo), doctest::Contains("not a regular file"), ckpt::Error);
  std::filesystem::create_symlink("/dev/zero", tmp / "zero");
  CHECK_THROWS_WITH_AS(ckpt::ops::detail::ReadFileText(tmp / "zero"), doctest::Contains("not a regular file"),
                       ckpt::Error);
  CHECK_THROWS_AS(ckpt::ops::detail::ReadFileText(tmp.path()), ckpt::Error);
  {
    const int fd = ::open((tmp / "big").c_str(), O_CREAT | O_WRONLY, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t{3} << 30) == 0);  // sparse
    ::close(fd);
  }
  CHECK_THROWS_WITH_AS(ckpt::ops::detail::ReadFileText(tmp / "big"), doctest::Contains("exceeds the limit"),
                       ckpt::Error);
}
