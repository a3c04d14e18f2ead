// The shard index's records and metadata.json's tensor entries are written by hand
// (format/chunk_record.cc, format/metadata_writer.cc, format/json_text.h): the text must be byte
// for byte what nlohmann's dump() makes of the same members, which the references below
// build as the writers did before, over random records and entries (keys that need escaping
// or are not ASCII, every dtype, every layout form, optional members, doubles of every
// magnitude, NaN and infinities).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "ckpt/dtype.h"
#include "ckpt/metadata.h"
#include "storage/digest.h"
#include "storage/shard_index.h"

using namespace ckpt;
using ordered_json = nlohmann::ordered_json;

namespace {

// The record as the nlohmann tree the writer built before (FORMAT.md §5.5).
std::string Reference(const storage::ShardIndexEntry& e) {
  const ChunkMeta& c = e.chunk;
  ordered_json j;
  j["key"] = e.key;
  if (e.bytes) {
    j["dtype"] = "bytes";
    j["size"] = c.box.sizes.empty() ? 0 : c.box.sizes[0];
  } else {
    j["dtype"] = DTypeName(e.dtype);
    j["shape"] = e.shape;
    j["offsets"] = c.box.offsets;
    j["sizes"] = c.box.sizes;
  }
  j["dataset"] = c.dataset;
  if (c.offset) j["offset"] = *c.offset;
  if (c.pack_offset) j["pack_offset"] = *c.pack_offset;
  j["stored_bytes"] = c.stored_bytes;
  if (c.compression.codec == Compression::Codec::kZstd)
    j["compression"] = {{"codec", "zstd"}, {"level", c.compression.level}, {"shuffle", true}};
  j["checksum"] = c.checksum;
  j["block_bytes"] = c.block_bytes;
  j["blocks"] = c.blocks;
  if (c.stats) {
    const ChunkStats& st = *c.stats;
    ordered_json o;
    for (const auto& [name, v] : {std::pair{"min", st.min}, {"max", st.max}, {"mean", st.mean}, {"l2", st.l2}})
      o[name] = std::isfinite(v) ? ordered_json(v) : ordered_json(nullptr);
    o["nan_count"] = st.nan_count;
    o["inf_count"] = st.inf_count;
    o["finite_count"] = st.finite_count;
    j["stats"] = std::move(o);
  }
  return j.dump();
}

double RandomDouble(std::mt19937_64& rng) {
  switch (rng() % 10) {
    case 0: return std::numeric_limits<double>::quiet_NaN();
    case 1: return (rng() % 2 ? 1 : -1) * std::numeric_limits<double>::infinity();
    case 2: return (rng() % 2) ? 0.0 : -0.0;
    case 3: return static_cast<double>(static_cast<int64_t>(rng() % 2000) - 1000);  // integral values: "3.0"
    case 4: return std::numeric_limits<double>::denorm_min() * static_cast<double>(rng() % 1000 + 1);
    case 5: return (rng() % 2 ? 1 : -1) * std::numeric_limits<double>::max() / static_cast<double>(rng() % 100 + 1);
    case 6: return static_cast<float>(std::ldexp(static_cast<double>(rng() % 100000), -static_cast<int>(rng() % 40)));
    default: {
      double d;
      const uint64_t bits = rng();
      std::memcpy(&d, &bits, sizeof d);
      return std::isfinite(d) ? d : 1.5;
    }
  }
}

std::string RandomKey(std::mt19937_64& rng) {
  static const char* const kPieces[] = {"model", ".", "layers", "0", "w", "@", "%", "/", "\"", "\\", "\n", "\t",
                                        "\x01", "\x7f", "é", "名前", " ", "{}", "[1]"};
  std::string key;
  const int n = 1 + static_cast<int>(rng() % 6);
  for (int i = 0; i < n; ++i) key += kPieces[rng() % std::size(kPieces)];
  return key;
}

storage::ShardIndexEntry RandomEntry(std::mt19937_64& rng) {
  storage::ShardIndexEntry e;
  e.key = RandomKey(rng);
  e.bytes = rng() % 8 == 0;
  ChunkMeta& c = e.chunk;
  if (e.bytes) {
    e.dtype = DType::kUInt8;
    c.box = Box{{0}, {static_cast<int64_t>(rng() % 100000)}};
  } else {
    e.dtype = kAllDTypes[rng() % std::size(kAllDTypes)];
    const int rank = static_cast<int>(rng() % 5);
    for (int d = 0; d < rank; ++d) {
      e.shape.push_back(static_cast<int64_t>(rng() % (int64_t{1} << (rng() % 40))));
      c.box.offsets.push_back(static_cast<int64_t>(rng() % 1000));
      c.box.sizes.push_back(static_cast<int64_t>(rng() % 1000));
    }
  }
  c.dataset = rng() % 3 == 0 ? ".ckpt_pack." + std::to_string(rng() % 100) : RandomKey(rng) + "@1,2";
  if (rng() % 2) c.offset = rng() >> (rng() % 64);
  if (rng() % 3 == 0) c.pack_offset = rng() >> (rng() % 64);
  c.stored_bytes = rng() >> (rng() % 64);
  if (rng() % 4 == 0) {
    c.compression.codec = Compression::Codec::kZstd;
    c.compression.level = static_cast<int>(rng() % 200) - 100;
  }
  c.checksum = storage::FormatChecksum(rng());
  c.block_bytes = uint64_t{4096} << (rng() % 15);
  for (uint64_t b = rng() % 5; b > 0; --b) c.blocks += storage::FormatChecksum(rng()).substr(8);
  if (rng() % 4 != 0) {
    ChunkStats st;
    st.min = RandomDouble(rng);
    st.max = RandomDouble(rng);
    st.mean = RandomDouble(rng);
    st.l2 = RandomDouble(rng);
    st.nan_count = static_cast<int64_t>(rng() >> (rng() % 63 + 1));
    st.inf_count = static_cast<int64_t>(rng() % 3);
    st.finite_count = static_cast<int64_t>(rng() >> 1);
    c.stats = st;
  }
  return e;
}

}  // namespace

TEST_CASE("shard index records written by hand are byte-identical to nlohmann's dump, over random records") {
  std::mt19937_64 rng(2024);
  for (int round = 0; round < 20; ++round) {
    storage::ShardIndexBuilder builder;
    std::string want = R"({"format":"ckpt-shard","format_version":2,"chunks":[)";
    const int n = 1 + static_cast<int>(rng() % 300);
    for (int i = 0; i < n; ++i) {
      const storage::ShardIndexEntry e = RandomEntry(rng);
      builder.Add(e);
      want += (i ? "," : "") + Reference(e);
    }
    want += "]}";
    const std::string got = builder.Finish();
    REQUIRE(got.size() == want.size());
    CHECK(got == want);
  }
  // An empty index, and a key that is not UTF-8: refused as nlohmann refuses it.
  CHECK(storage::ShardIndexBuilder().Finish() == R"({"format":"ckpt-shard","format_version":2,"chunks":[]})");
  storage::ShardIndexEntry bad = RandomEntry(rng);
  bad.key = "a\xff";
  storage::ShardIndexBuilder b;
  CHECK_THROWS_AS(b.Add(bad), nlohmann::json::exception);
}

TEST_CASE("hand-written records parse back to what was written") {
  std::mt19937_64 rng(7);
  storage::ShardIndexBuilder builder;
  std::vector<storage::ShardIndexEntry> written;
  for (int i = 0; i < 200; ++i) {
    storage::ShardIndexEntry e;
    e.key = RandomKey(rng);
    e.dtype = DType::kFloat32;
    e.shape = {100, 8};
    e.chunk.box = Box{{static_cast<int64_t>(rng() % 50)}, {10}};
    e.chunk.box.offsets.push_back(0);
    e.chunk.box.sizes.push_back(8);
    e.chunk.dataset = "d" + std::to_string(i);
    e.chunk.offset = 1000 + 320 * static_cast<uint64_t>(i);
    e.chunk.stored_bytes = 320;
    e.chunk.checksum = storage::FormatChecksum(rng());
    e.chunk.block_bytes = 4096;
    e.chunk.blocks = storage::FormatChecksum(rng()).substr(8);
    ChunkStats st;
    st.min = RandomDouble(rng);
    st.max = RandomDouble(rng);
    st.mean = 0.1;
    st.l2 = 1e-300;
    st.finite_count = 80;
    e.chunk.stats = st;
    builder.Add(e);
    written.push_back(e);
  }
  const storage::ShardIndex parsed = storage::ParseShardIndex(builder.Finish(), "test");
  REQUIRE(parsed.entries.size() == written.size());
  for (std::size_t i = 0; i < written.size(); ++i) {
    const auto& a = written[i].chunk;
    const auto& b = parsed.entries[i].chunk;
    CHECK(parsed.entries[i].key == written[i].key);
    CHECK(b.box == a.box);
    CHECK(b.offset == a.offset);
    CHECK(b.checksum == a.checksum);
    REQUIRE(b.stats);
    for (const auto& [x, y] : {std::pair{a.stats->min, b.stats->min}, {a.stats->max, b.stats->max}}) {
      if (std::isfinite(x)) CHECK(std::memcmp(&x, &y, sizeof x) == 0);  // -0.0 too
      else CHECK(std::isnan(y));
    }
    CHECK(b.stats->l2 == a.stats->l2);
  }
}

namespace {

// A v2 tensor entry's line as the nlohmann path wrote it: the layout a nlohmann::json (its
// members sorted), the rest an ordered_json.
std::string ReferenceEntry(const std::string& key, const EntryMeta& e) {
  using json = nlohmann::json;
  json lay;
  if (e.layout.kind == TensorLayout::Kind::kChunks) {
    json chunks = json::array();
    for (const auto& p : e.layout.pieces)
      chunks.push_back({{"offsets", p.box.offsets}, {"sizes", p.box.sizes}, {"file", p.file}});
    lay["chunks"] = std::move(chunks);
  } else {
    json grid = json::array();
    for (const DimSplit& d : e.layout.grid) grid.push_back(d.sizes.empty() ? json{{"step", d.step}} : json{{"sizes", d.sizes}});
    lay["grid"] = std::move(grid);
    if (!e.layout.cell_files.empty()) lay["files"] = e.layout.cell_files;
    else lay["files"] = {{"base", e.layout.file_base}, {"strides", e.layout.file_strides}};
  }
  ordered_json j;
  j["type"] = "tensor";
  j["dtype"] = DTypeName(e.dtype);
  j["shape"] = e.shape;
  j["layout"] = lay;
  j["stored_bytes"] = e.stored_bytes;
  if (e.compression.codec == Compression::Codec::kZstd)
    j["compression"] = {{"codec", "zstd"}, {"level", e.compression.level}, {"shuffle", true}};
  if (e.stats) {
    auto real = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
    const ChunkStats& s = *e.stats;
    j["stats"] = ordered_json{{"min", real(s.min)}, {"max", real(s.max)}, {"mean", real(s.mean)}, {"l2", real(s.l2)},
                              {"nan_count", s.nan_count}, {"inf_count", s.inf_count}, {"finite_count", s.finite_count}};
  }
  return ordered_json(key).dump() + ": " + j.dump();
}

}  // namespace

TEST_CASE("metadata.json tensor entries written by hand are byte-identical to nlohmann's dump") {
  std::mt19937_64 rng(99);
  Metadata m;
  m.format_version = 2;
  m.world_size = 2;
  m.files = {FileMeta{"shard-00000-of-00002.h5", 0, 10, storage::FormatChecksum(1)},
             FileMeta{"shard-00001-of-00002.h5", 1, 10, storage::FormatChecksum(2)}};
  for (int i = 0; i < 400; ++i) {
    EntryMeta e;
    e.kind = EntryKind::kTensor;
    e.dtype = kAllDTypes[rng() % std::size(kAllDTypes)];
    const int rank = static_cast<int>(rng() % 4);
    for (int d = 0; d < rank; ++d) e.shape.push_back(static_cast<int64_t>(rng() % 100000));
    TensorLayout& l = e.layout;
    if (rng() % 3 == 0) {
      l.kind = TensorLayout::Kind::kChunks;
      for (int p = static_cast<int>(rng() % 4); p >= 0; --p) {
        TensorLayout::Piece piece;
        for (int d = 0; d < rank; ++d) {
          piece.box.offsets.push_back(static_cast<int64_t>(rng() % 50));
          piece.box.sizes.push_back(static_cast<int64_t>(rng() % 50));
        }
        piece.file = static_cast<int32_t>(rng() % 2);
        l.pieces.push_back(piece);
      }
    } else {
      l.kind = TensorLayout::Kind::kGrid;
      for (int d = 0; d < rank; ++d) {
        DimSplit split;
        if (rng() % 2) split.step = static_cast<int64_t>(rng() % 1000) + 1;
        else split.sizes = {static_cast<int64_t>(rng() % 9), static_cast<int64_t>(rng() % 9)};
        l.grid.push_back(split);
      }
      if (rng() % 2) {
        for (int c = static_cast<int>(rng() % 5); c >= 0; --c) l.cell_files.push_back(static_cast<int32_t>(rng() % 2));
      } else {
        l.file_base = static_cast<int64_t>(rng() % 2);
        for (int d = 0; d < rank; ++d) l.file_strides.push_back(static_cast<int64_t>(rng() % 3));
      }
    }
    e.stored_bytes = rng() >> (rng() % 64);
    if (rng() % 4 == 0) {
      e.compression.codec = Compression::Codec::kZstd;
      e.compression.level = static_cast<int>(rng() % 40) - 20;
    }
    if (rng() % 3) {
      ChunkStats st;
      st.min = RandomDouble(rng);
      st.max = RandomDouble(rng);
      st.mean = RandomDouble(rng);
      st.l2 = RandomDouble(rng);
      st.nan_count = static_cast<int64_t>(rng() % 10);
      st.inf_count = static_cast<int64_t>(rng() >> 2);
      st.finite_count = static_cast<int64_t>(rng() % 100000);
      e.stats = st;
    }
    m.entries.emplace_back(RandomKey(rng) + std::to_string(i), std::move(e));
  }
  const std::string text = SerializeMetadata(m);
  // One entry a line, in order, each exactly the reference.
  std::size_t at = text.find("\"entries\": {\n");
  REQUIRE(at != std::string::npos);
  at += std::string("\"entries\": {\n").size();
  for (std::size_t i = 0; i < m.entries.size(); ++i) {
    const std::size_t end = text.find('\n', at);
    REQUIRE(end != std::string::npos);
    std::string line = text.substr(at, end - at);
    CHECK(line.rfind("    ", 0) == 0);
    line = line.substr(4);
    if (!line.empty() && line.back() == ',') line.pop_back();
    CHECK(line == ReferenceEntry(m.entries[i].first, m.entries[i].second));
    at = end + 1;
  }
}
