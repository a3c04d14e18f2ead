// Format v2 blocked checksums (FORMAT.md §7) in the storage layer: the Digest's block mode,
// the v2 shard index codec, and ShardReader verifying every byte it hands out by the
// blocks a read touches (and only those).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <random>

#include "ckpt/ckpt.h"
#include "storage/digest.h"
#include "storage/fs.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"
#include "storage/shard_writer.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ckpt;
using ckpt_test::TempDir;

namespace {

// The shards here are written with blocks of 1 MiB, whatever the default.
constexpr uint64_t kB = uint64_t{1} << 20;

std::string Hex16(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// FORMAT.md §7 written out independently: block digests, then XXH3 over them (8 bytes LE).
std::pair<std::string, std::string> Reference(const std::vector<uint8_t>& data, uint64_t b) {
  std::string blocks;
  std::vector<unsigned char> le;
  for (uint64_t at = 0; at < data.size(); at += b) {
    const uint64_t d = XXH3_64bits(data.data() + at, std::min<uint64_t>(b, data.size() - at));
    blocks += Hex16(d);
    for (int k = 0; k < 8; ++k) le.push_back(static_cast<unsigned char>(d >> (8 * k)));
  }
  return {"xxh3-64:" + Hex16(XXH3_64bits(le.data(), le.size())), blocks};
}

void FlipByte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x10));
}

std::string ErrorOf(const std::function<void()>& fn, ErrorCode* code = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A float32 [rows, cols] tensor of distinct values, written as one chunk into a shard.
struct Shard {
  TempDir tmp{"blocks"};
  std::string name = "shard-00000-of-00001.h5";
  int64_t rows, cols;
  std::vector<float> values;
  ChunkMeta chunk;

  Shard(int64_t r, int64_t c, Compression compression = {}, uint64_t block = kB)
      : rows(r), cols(c), values(static_cast<std::size_t>(r * c)) {
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
    storage::ShardWriter w(tmp.path(), name, compression, block);
    chunk = w.WriteChunk("w", DType::kFloat32, {rows, cols}, Box::Full({rows, cols}), values.data());
    w.Finish();
  }
  fs::path path() const { return tmp.path() / name; }
  uint64_t bytes() const { return values.size() * 4; }
  // Reads `region` verified (large reads direct where `direct`); returns what came back.
  std::vector<float> Read(const Box& region, const ChunkMeta& c, uint64_t* read = nullptr,
                          std::optional<storage::DirectReader::Policy> direct = std::nullopt,
                          uint64_t* read_direct = nullptr) const {
    storage::ShardReader r(tmp.path(), name);
    r.UseDirectIo(direct);
    std::vector<float> out(static_cast<std::size_t>(region.NumElements()));
    const uint64_t n = r.Read("w", DType::kFloat32, c, region, out.data(), region, true);
    if (read) *read = n;
    if (read_direct) *read_direct = r.bytes_read_direct();
    return out;
  }
  bool Matches(const Box& region, const std::vector<float>& got) const {
    std::size_t k = 0;
    for (int64_t i = region.offsets[0]; i < region.offsets[0] + region.sizes[0]; ++i)
      for (int64_t j = region.offsets[1]; j < region.offsets[1] + region.sizes[1]; ++j)
        if (got[k++] != values[static_cast<std::size_t>(i * cols + j)]) return false;
    return true;
  }
};

}  // namespace

TEST_CASE("block digests: any split of the bytes into pieces gives the digests FORMAT.md defines") {
  constexpr uint64_t b = 4096;
  for (const std::size_t n : {std::size_t{0}, std::size_t{100}, std::size_t{b}, std::size_t{3 * b},
                              std::size_t{3 * b + 17}}) {
    CAPTURE(n);
    const auto data = ckpt_test::RandomBytes(n, n + 1);
    const auto [checksum, blocks] = Reference(data, b);
    CHECK(blocks.size() == storage::BlockCount(n, b) * 16);
    storage::Digest whole(DType::kUInt8, false, b);
    whole.Update(data.data(), n);
    CHECK(whole.Checksum() == checksum);
    CHECK(whole.Blocks() == blocks);
    CHECK(storage::ChecksumOfBlocks(blocks) == checksum);
    // Pieces of every size from 1 byte up, splitting blocks anywhere.
    std::mt19937 rng(static_cast<unsigned>(n));
    storage::Digest pieces(DType::kUInt8, false, b);
    for (std::size_t at = 0; at < n;) {
      const std::size_t len = std::min<std::size_t>(n - at, 1 + rng() % (2 * b));
      pieces.Update(data.data() + at, len);
      at += len;
    }
    CHECK(pieces.Checksum() == checksum);
    CHECK(pieces.Blocks() == blocks);
  }
  // No bytes: no blocks, the hash of zero bytes (FORMAT.md §7).
  storage::Digest empty(DType::kFloat32, true, b);
  CHECK(empty.Blocks().empty());
  CHECK(empty.Checksum() == "xxh3-64:2d06800538d394c2");
  // v1 stays the hash of the bytes; the statistics do not depend on the mode.
  std::vector<float> f(5000);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) - 7.0f;
  storage::Digest v1(DType::kFloat32, true), v2(DType::kFloat32, true, b);
  v1.Update(f.data(), 4 * f.size());
  v2.Update(f.data(), 4 * f.size());
  CHECK(v1.Checksum() == "xxh3-64:" + Hex16(XXH3_64bits(f.data(), 4 * f.size())));
  CHECK(v1.Checksum() != v2.Checksum());
  CHECK(v1.Stats()->mean == v2.Stats()->mean);
  CHECK(v1.Stats()->l2 == v2.Stats()->l2);
}

TEST_CASE("shard index v2: records round-trip, compact, parsed strictly; v1 still parses") {
  storage::ShardIndexBuilder b;
  storage::ShardIndexEntry t;
  t.key = "layers.0.w";
  t.dtype = DType::kBFloat16;
  t.shape = {4, 4096};
  t.chunk.box = Box{{2, 0}, {2, 4096}};
  t.chunk.dataset = "layers.0.w@2,0";
  t.chunk.offset = 4096;
  t.chunk.stored_bytes = 16384;
  t.chunk.block_bytes = 4096;
  t.chunk.blocks = std::string(64, 'a');
  t.chunk.checksum = storage::ChecksumOfBlocks(t.chunk.blocks);
  t.chunk.compression.codec = Compression::Codec::kZstd;
  t.chunk.compression.level = 3;
  t.chunk.stats = ChunkStats{-1.0, 2.5, 0.25, 3.0, 1, 0, 8190};
  b.Add(t);
  storage::ShardIndexEntry y;
  y.key = "blob";
  y.bytes = true;
  y.shape = {0};
  y.chunk.box = Box{{0}, {0}};
  y.chunk.dataset = "blob";
  y.chunk.block_bytes = kB;
  y.chunk.checksum = storage::ChecksumOfBlocks(std::string());
  b.Add(y);
  const std::string text = b.Finish();
  CHECK(text.find(' ') == std::string::npos);
  CHECK(storage::IndexDigest(text) == "xxh3-64:" + Hex16(XXH3_64bits(text.data(), text.size())));
  const storage::ShardIndex idx = storage::ParseShardIndex(text, "f.h5");
  CHECK(idx.format_version == 2);
  REQUIRE(idx.entries.size() == 2);
  const ChunkMeta& c = idx.entries[0].chunk;
  CHECK(idx.entries[0].key == t.key);
  CHECK(idx.entries[0].dtype == DType::kBFloat16);
  CHECK(idx.entries[0].shape == t.shape);
  CHECK(c.box == t.chunk.box);
  CHECK(c.dataset == t.chunk.dataset);
  CHECK(c.offset == t.chunk.offset);
  CHECK(c.stored_bytes == 16384);
  CHECK(c.checksum == t.chunk.checksum);
  CHECK(c.block_bytes == 4096);
  CHECK(c.blocks == t.chunk.blocks);
  CHECK(c.compression.codec == Compression::Codec::kZstd);
  CHECK(c.compression.level == 3);
  REQUIRE(c.stats);
  CHECK(c.stats->max == 2.5);
  CHECK(c.stats->finite_count == 8190);
  CHECK(idx.entries[1].bytes);
  CHECK(idx.entries[1].chunk.blocks.empty());

  // Each damage is refused, naming the place.
  auto damaged = [&](const std::string& from, const std::string& to) {
    std::string s = text;
    const auto at = s.find(from);
    REQUIRE(at != std::string::npos);
    s.replace(at, from.size(), to);
    ErrorCode code{};
    const std::string e = ErrorOf([&] { storage::ParseShardIndex(s, "f.h5"); }, &code);
    CHECK(code == ErrorCode::kCorrupt);
    return e;
  };
  CHECK(Has(damaged("\"block_bytes\":4096", "\"block_bytes\":4097"), "power of two"));
  CHECK(Has(damaged("\"block_bytes\":4096", "\"block_bytes\":2048"), "power of two"));
  CHECK(Has(damaged(std::string(64, 'a'), std::string(48, 'a')), "hex digits"));
  CHECK(Has(damaged(std::string(64, 'a'), "A" + std::string(63, 'a')), "lowercase hex"));
  CHECK(Has(damaged("\"stored_bytes\":16384,", ""), "stored_bytes"));
  CHECK(Has(damaged("\"checksum\":\"xxh3-64:", "\"checksum\":\"xxh3-65:"), "checksum"));
  CHECK(Has(damaged(",\"blocks\":\"\"", ""), "blocks"));
  CHECK(Has(damaged("\"offset\":4096", "\"offset\":-1"), "offset"));

  // v1 records carry box, dataset and offset only.
  const storage::ShardIndex v1 = storage::ParseShardIndex(
      R"({"format":"ckpt-shard","format_version":1,"chunks":[{"key":"w","dtype":"float32","shape":[4],)"
      R"("offsets":[0],"sizes":[4],"dataset":"w","offset":2048}]})",
      "old.h5");
  CHECK(v1.format_version == 1);
  REQUIRE(v1.entries.size() == 1);
  CHECK(v1.entries[0].chunk.offset == 2048u);
  CHECK(v1.entries[0].chunk.block_bytes == 0);
}

TEST_CASE("shard index: read in one pass, members in any order; repeats, bad values and bad JSON refused") {
  storage::ShardIndexBuilder b;
  storage::ShardIndexEntry t;
  t.key = "w";
  t.dtype = DType::kFloat32;
  t.shape = {8};
  t.chunk.box = Box{{0}, {8}};
  t.chunk.dataset = "w";
  t.chunk.offset = 2048;
  t.chunk.stored_bytes = 32;
  t.chunk.block_bytes = 4096;
  t.chunk.blocks = std::string(16, 'b');
  t.chunk.checksum = storage::ChecksumOfBlocks(t.chunk.blocks);
  t.chunk.stats = ChunkStats{-1.0, 2.5, 0.25, 3.0, 0, 0, 8};
  b.Add(t);
  const std::string text = b.Finish();
  // "chunks" first, before the header it depends on (the writer puts it last): the same records.
  const auto at = text.find(",\"chunks\":");
  REQUIRE(at != std::string::npos);
  const std::string reordered =
      "{" + text.substr(at + 1, text.size() - at - 2) + "," + text.substr(1, at - 1) + "}";
  CHECK(reordered != text);
  for (const std::string& s : {text, reordered}) {
    const storage::ShardIndex idx = storage::ParseShardIndex(s, "f.h5");
    CHECK(idx.format_version == 2);
    REQUIRE(idx.entries.size() == 1);
    const ChunkMeta& c = idx.entries[0].chunk;
    CHECK(idx.entries[0].key == "w");
    CHECK(c.box == t.chunk.box);
    CHECK(c.offset == 2048u);
    CHECK(c.checksum == t.chunk.checksum);
    CHECK(c.blocks == t.chunk.blocks);
    REQUIRE(c.stats);
    CHECK(c.stats->mean == 0.25);
    CHECK(c.stats->finite_count == 8);
  }
  // "chunks" before the header is read in a second pass: its problems worded as ever.
  std::string bad_first = reordered;
  bad_first.replace(bad_first.find("\"offset\":2048"), 13, "\"offset\":-1");
  CHECK(Has(ErrorOf([&] { storage::ParseShardIndex(bad_first, "f.h5"); }), "f.h5: key 'w': \"offset\" is not a byte offset"));
  for (const std::string chunks : {"{}", "7"}) {
    const std::string s = R"({"chunks":)" + chunks + R"(,"format":"ckpt-shard","format_version":2})";
    CHECK(Has(ErrorOf([&] { storage::ParseShardIndex(s, "f.h5"); }), "f.h5: \"chunks\" is not an array"));
  }
  auto refused = [&](const std::string& from, const std::string& to, ErrorCode want = ErrorCode::kCorrupt) {
    std::string s = text;
    const auto pos = s.find(from);
    REQUIRE(pos != std::string::npos);
    s.replace(pos, from.size(), to);
    ErrorCode code{};
    const std::string e = ErrorOf([&] { storage::ParseShardIndex(s, "f.h5"); }, &code);
    CHECK(code == want);
    CHECK(Has(e, "f.h5: "));
    return e;
  };
  // A repeated member is refused (FORMAT.md §8.1), not resolved to its last value.
  CHECK(Has(refused("\"dataset\":\"w\"", "\"dataset\":\"w\",\"dataset\":\"v\""), "duplicate key 'dataset'"));
  CHECK(Has(refused("\"format_version\":2", "\"format_version\":2,\"chunks\":[]"), "duplicate key 'chunks'"));
  CHECK(Has(refused("\"offset\":2048", "\"offset\":2048.0"), "\"offset\" is not a byte offset"));
  CHECK(Has(refused("\"shape\":[8]", "\"shape\":[8.5]"), "arrays of integers"));
  CHECK(Has(refused("\"shape\":[8]", "\"shape\":[true]"), "arrays of integers"));
  CHECK(Has(refused("\"min\":-1.0", "\"min\":\"x\""), "stats \"min\""));
  CHECK(Has(refused("\"finite_count\":8", "\"finite_count\":-8"), "stats \"finite_count\""));
  CHECK(Has(refused("\"stats\":{", "\"compression\":{\"codec\":\"lz4\"},\"stats\":{", ErrorCode::kUnsupported),
            "unknown compression {\"codec\":\"lz4\"}"));
  CHECK(Has(refused("\"stats\":{", "\"compression\":{\"codec\":\"zstd\",\"level\":99},\"stats\":{"),
            "zstd level 99 is out of range"));
  CHECK(Has(refused("\"format_version\":2", "\"format_version\":3", ErrorCode::kUnsupported), "newer"));
  CHECK(Has(refused("\"format\":\"ckpt-shard\"", "\"format\":\"ckpt\""), "not a ckpt-shard index"));
  CHECK(Has(refused("\"key\":\"w\",", ""), "\"key\""));
  // Not JSON: worded as nlohmann::json words it.
  CHECK(Has(refused("]}", "]"), "parse error"));
  CHECK(Has(refused("\"dtype\":\"float32\"", "\"dtype\":\"float32\"x"), "parse error"));
}

TEST_CASE("the writer records v2 chunks: block digests of the raw bytes, the index digest") {
  TempDir tmp("bw");
  std::vector<uint8_t> data = ckpt_test::RandomBytes(3 * kB + 5, 9);
  storage::ShardWriter w(tmp.path(), "s.h5", {}, kB);
  const ChunkMeta a = w.WriteChunk("a", DType::kUInt8, {static_cast<int64_t>(data.size())},
                                   Box::Full({static_cast<int64_t>(data.size())}), data.data());
  const auto [checksum, blocks] = Reference(data, kB);
  CHECK(a.block_bytes == kB);
  CHECK(a.checksum == checksum);
  CHECK(a.blocks == blocks);
  REQUIRE(a.offset);
  // Streamed in pieces that split blocks: the same digests.
  auto s = w.Begin("b", DType::kUInt8, {static_cast<int64_t>(data.size())}, Box::Full({static_cast<int64_t>(data.size())}));
  for (std::size_t at = 0; at < data.size(); at += 100001) s->Write(data.data() + at, std::min<std::size_t>(100001, data.size() - at));
  const ChunkMeta b = s->Finish();
  CHECK(b.checksum == checksum);
  CHECK(b.blocks == blocks);
  const ChunkMeta bytes = w.WriteBytes("blob", data.data(), 100);
  CHECK(bytes.blocks.size() == 16);
  const ChunkMeta empty = w.WriteChunk("e", DType::kFloat32, {0, 4}, Box::Full({0, 4}), nullptr);
  CHECK(empty.blocks.empty());
  CHECK(empty.checksum == "xxh3-64:2d06800538d394c2");
  const storage::ShardWriter::Written written = w.Finish();
  storage::ShardReader r(tmp.path(), "s.h5");
  CHECK(written.index == storage::IndexDigest(r.IndexText()));
  CHECK(written.bytes == fs::file_size(tmp / "s.h5"));
  const storage::ShardIndex& idx = r.Index();
  CHECK(idx.format_version == 2);
  REQUIRE(idx.entries.size() == 4);
  CHECK(idx.entries[0].chunk.blocks == blocks);
  CHECK(idx.entries[0].chunk.offset == a.offset);
  CHECK(idx.entries[2].bytes);
  CHECK(idx.entries[2].chunk.checksum == bytes.checksum);
  // The empty chunk reads (verified) as nothing.
  CHECK(r.Read("e", DType::kFloat32, empty, Box::Full({0, 4}), nullptr, Box::Full({0, 4}), true) == 0);
}

TEST_CASE("a flipped byte is caught by exactly the reads that touch its block") {
  // 1280 x 1024 float32: 5 MiB, 5 blocks of 1 MiB, 256 rows per block.
  Shard s(1280, 1024);
  REQUIRE(s.chunk.block_bytes == kB);
  const int64_t rows_per_block = static_cast<int64_t>(kB / (4 * 1024));
  for (int flipped : {0, 2, 4}) {
    CAPTURE(flipped);
    Shard f(1280, 1024);
    FlipByte(f.path(), *f.chunk.offset + flipped * kB + 4097);
    for (int64_t block = 0; block < 5; ++block) {
      CAPTURE(block);
      // Three rows inside `block`, away from its edges.
      const Box rows{{block * rows_per_block + 100, 0}, {3, 1024}};
      uint64_t read = 0;
      std::vector<float> got;
      const std::string e = ErrorOf([&] { got = f.Read(rows, f.chunk, &read); });
      if (block == flipped) {
        CHECK(Has(e, f.name + ": tensor 'w' chunk " + f.chunk.box.ToString() + " block " + std::to_string(block) +
                         " (bytes " + std::to_string(block * kB) + ".." + std::to_string((block + 1) * kB) +
                         "): checksum mismatch: index says "));
      } else {
        CHECK(e == "");
        CHECK(f.Matches(rows, got));
        CHECK(read == kB);  // one block read, not the chunk
      }
    }
    // A column slice touches every block; one over the rows of other blocks does not.
    const Box column{{0, 300}, {1280, 341}};
    CHECK(Has(ErrorOf([&] { f.Read(column, f.chunk); }), "block " + std::to_string(flipped) + " "));
    const int64_t other = flipped == 0 ? 1 : 0;
    const Box clean{{other * rows_per_block, 300}, {rows_per_block, 341}};
    CHECK(f.Matches(clean, f.Read(clean, f.chunk)));
    // Whole reads and Verify see it too.
    CHECK(Has(ErrorOf([&] { f.Read(f.chunk.box, f.chunk); }), "checksum mismatch"));
    storage::ShardReader r(f.tmp.path(), f.name);
    CHECK(Has(ErrorOf([&] { r.Verify("w", DType::kFloat32, f.chunk); }), "block " + std::to_string(flipped) + " "));
  }
  // Intact: every shape of read returns the right values.
  for (const Box& region : {Box{{0, 0}, {1280, 1024}}, Box{{255, 0}, {2, 1024}}, Box{{0, 1023}, {1280, 1}},
                            Box{{1000, 17}, {280, 1000}}, Box{{1279, 0}, {1, 1024}}}) {
    CAPTURE(region.ToString());
    CHECK(s.Matches(region, s.Read(region, s.chunk)));
  }
  storage::ShardReader r(s.tmp.path(), s.name);
  CHECK(r.Verify("w", DType::kFloat32, s.chunk) == s.bytes());
}

TEST_CASE("a chunk smaller than a block, and the block list checked against the checksum") {
  Shard f(5, 5);
  REQUIRE(f.chunk.blocks.size() == 16);
  CHECK(f.Matches(Box{{1, 1}, {2, 2}}, f.Read(Box{{1, 1}, {2, 2}}, f.chunk)));
  ChunkMeta lying = f.chunk;  // a block list that does not hash to the checksum
  lying.blocks = storage::BlocksHex({storage::HashBlock(f.values.data(), 4)});
  CHECK(Has(ErrorOf([&] { f.Read(f.chunk.box, lying); }), "the block digests hash to"));
  ChunkMeta short_list = f.chunk;
  short_list.blocks.clear();
  CHECK(Has(ErrorOf([&] { f.Read(Box{{0, 0}, {1, 1}}, short_list); }), "lists 0 block digests"));
  FlipByte(f.path(), *f.chunk.offset + 99);
  CHECK(Has(ErrorOf([&] { f.Read(Box{{0, 0}, {1, 1}}, f.chunk); }), "block 0 (bytes 0..100)"));
}

TEST_CASE("a v1 chunk read in part is read whole and checked") {
  Shard f(1280, 1024);
  ChunkMeta v1 = f.chunk;  // as format v1 describes it: checksum over the bytes, no blocks
  v1.block_bytes = 0;
  v1.blocks.clear();
  v1.offset.reset();
  v1.checksum = storage::ChecksumOf(f.values.data(), f.bytes());
  const Box rows{{10, 0}, {3, 1024}};
  uint64_t read = 0;
  CHECK(f.Matches(rows, f.Read(rows, v1, &read)));
  CHECK(read == f.bytes());
  FlipByte(f.path(), *f.chunk.offset + 4 * kB + 8);  // far from the rows read
  CHECK(Has(ErrorOf([&] { f.Read(rows, v1); }), "checksum mismatch: metadata says"));
  CHECK(f.Matches(rows, f.Read(rows, f.chunk)));  // v2: that block is not read
}

TEST_CASE("a compressed chunk read in part: the blocks touched decompressed and checked") {
  Compression z;
  z.codec = Compression::Codec::kZstd;
  Shard f(1280, 1024, z);
  REQUIRE(f.chunk.compression.codec == Compression::Codec::kZstd);
  REQUIRE(f.chunk.blocks.size() == 5 * 16);
  CHECK_FALSE(f.chunk.offset);
  for (const Box& region : {Box{{300, 0}, {5, 1024}}, Box{{0, 500}, {1280, 300}}, Box{{255, 1000}, {2, 24}}}) {
    CAPTURE(region.ToString());
    CHECK(f.Matches(region, f.Read(region, f.chunk)));
  }
  // Change one value the way h5py would (through HDF5: the data still decompresses).
  {
    const hid_t file = H5Fopen(f.path().c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(file >= 0);
    const hid_t ds = H5Dopen2(file, f.chunk.dataset.c_str(), H5P_DEFAULT);
    const hid_t space = H5Dget_space(ds);
    const hsize_t start[2] = {2 * 256 + 7, 9}, count[2] = {1, 1};
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
    const hsize_t one = 1;
    const hid_t mem = H5Screate_simple(1, &one, nullptr);
    const float v = 99;
    CHECK(H5Dwrite(ds, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &v) >= 0);
    H5Sclose(mem);
    H5Sclose(space);
    H5Dclose(ds);
    H5Fclose(file);
  }
  CHECK(f.Matches(Box{{300, 0}, {5, 1024}}, f.Read(Box{{300, 0}, {5, 1024}}, f.chunk)));  // block 1
  CHECK(Has(ErrorOf([&] { f.Read(Box{{2 * 256 + 7, 0}, {1, 16}}, f.chunk); }), "block 2 (bytes "));
  CHECK(Has(ErrorOf([&] { f.Read(Box{{0, 0}, {1280, 1}}, f.chunk); }), "block 2 "));
  storage::ShardReader r(f.tmp.path(), f.name);
  CHECK(Has(ErrorOf([&] { r.Verify("w", DType::kFloat32, f.chunk); }), "block 2 "));
}

TEST_CASE("a carried-over chunk is checked block by block as it is copied") {
  Shard f(1280, 1024);
  TempDir out("copy");
  const storage::Fd src = storage::OpenRegularFile(f.path());
  {
    storage::ShardWriter w(out.path(), "c.h5", {}, kB);
    auto s = w.Begin("w", DType::kFloat32, {1280, 1024}, Box::Full({1280, 1024}));
    s->Copy(src.get(), *f.chunk.offset, f.bytes(), f.path(), &f.chunk, "source chunk");
    const ChunkMeta copied = s->Finish();
    CHECK(copied.checksum == f.chunk.checksum);
    CHECK(copied.blocks == f.chunk.blocks);
    w.Finish();
  }
  FlipByte(f.path(), *f.chunk.offset + kB + 3);
  storage::ShardWriter w(out.path(), "d.h5", {}, 4096);  // the copy's own block size differs
  auto s = w.Begin("w", DType::kFloat32, {1280, 1024}, Box::Full({1280, 1024}));
  const std::string e = ErrorOf([&] { s->Copy(src.get(), *f.chunk.offset, f.bytes(), f.path(), &f.chunk, "source chunk"); });
  CHECK(Has(e, "source chunk block 1 (bytes " + std::to_string(kB) + ".." + std::to_string(2 * kB) + "): checksum mismatch"));
}

TEST_CASE("copied chunks on a block boundary lend their checked block digests: the result is the bytes' digest") {
  Shard a(896, 1024), b(512, 1024);  // 3.5 and 2 blocks
  const storage::Fd fa = storage::OpenRegularFile(a.path()), fb = storage::OpenRegularFile(b.path());
  TempDir out("adopt");
  const int64_t n = static_cast<int64_t>((2 * b.bytes() + 2 * a.bytes()) / 4);
  storage::ShardWriter w(out.path(), "c.h5", {}, kB);
  auto s = w.Begin("w", DType::kFloat32, {n}, Box::Full({n}));
  s->Copy(fb.get(), *b.chunk.offset, b.bytes(), b.path(), &b.chunk, "b");  // at block 0: lent
  s->Copy(fa.get(), *a.chunk.offset, a.bytes(), a.path(), &a.chunk, "a");  // at block 2: lent, half a block on
  s->Copy(fb.get(), *b.chunk.offset, b.bytes(), b.path(), &b.chunk, "b");  // at 5.5 blocks: hashed here
  s->Copy(fa.get(), *a.chunk.offset, a.bytes(), a.path(), nullptr, "");     // at 7.5 blocks, unchecked
  const ChunkMeta m = s->Finish();
  std::vector<uint8_t> all;
  for (const Shard* f : {&b, &a, &b, &a}) {
    const auto* p = reinterpret_cast<const uint8_t*>(f->values.data());
    all.insert(all.end(), p, p + f->bytes());
  }
  const auto [checksum, blocks] = Reference(all, kB);
  CHECK(m.checksum == checksum);
  CHECK(m.blocks == blocks);
  w.Finish();
  // A lent digest is checked before it is lent: a flipped byte in the source is refused.
  FlipByte(b.path(), *b.chunk.offset + 5);
  storage::ShardWriter w2(out.path(), "d.h5", {}, kB);
  auto s2 = w2.Begin("w", DType::kFloat32, {n}, Box::Full({n}));
  CHECK(Has(ErrorOf([&] { s2->Copy(fb.get(), *b.chunk.offset, b.bytes(), b.path(), &b.chunk, "b"); }),
            "b block 0 (bytes 0.." + std::to_string(kB) + "): checksum mismatch"));
}

TEST_CASE("a resharded read through the checkpoint reader catches a changed value in the part it reads") {
  TempDir tmp("reshard");
  std::vector<float> v(2 * 512 * 1024);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  {
    CheckpointWriter::Options o;
    o.num_files = 2;
    auto w = CheckpointWriter::Create(tmp / "ck", o);
    for (int r = 0; r < 2; ++r)
      w->WriteChunk("w", DType::kFloat32, {1024, 1024}, Box{{512 * r, 0}, {512, 1024}}, v.data() + r * 512 * 1024, r);
    w->Commit();
  }
  auto reader = CheckpointReader::Open(tmp / "ck");
  const ChunkMeta& second = reader->metadata().Find("w")->chunks[1];
  const auto range = reader->LocateChunk("w", 1);
  REQUIRE(range);
  const uint64_t flip = 300 * 4096 + 40;  // row 812 = 512 + 300
  FlipByte(range->file, range->offset + flip);
  // Rows 88..90 of the second chunk: another block.
  std::vector<float> out(3 * 1024);
  reader->ReadRegion("w", Box{{600, 0}, {3, 1024}}, out.data());
  CHECK(out[0] == v[600 * 1024]);
  // A region 3 ranks would take (rows 682..1024) touches the changed block.
  std::vector<float> part(342 * 1024);
  const std::string e = ErrorOf([&] { reader->ReadRegion("w", Box{{682, 0}, {342, 1024}}, part.data()); });
  CHECK(Has(e, second.file));
  CHECK(Has(e, "tensor 'w' chunk " + second.box.ToString() + " block " + std::to_string(flip / second.block_bytes) + " "));
}

TEST_CASE("runs close together share one read; blocks between them are not hashed") {
  // Rows of 16 KiB, blocks of 4 KiB: the first 16 columns of every row are in every fourth
  // block; the three blocks between are read with them (one read) but not checked.
  Shard f(320, 4096, {}, 4096);
  FlipByte(f.path(), *f.chunk.offset + 4096 + 5);  // row 0, columns 1024.., block 1
  const Box narrow{{0, 0}, {320, 16}};
  uint64_t read = 0;
  CHECK(f.Matches(narrow, f.Read(narrow, f.chunk, &read)));
  CHECK(read < f.bytes());  // windows of at most 16 MiB, not past the last run
  CHECK(Has(ErrorOf([&] { f.Read(Box{{0, 1000}, {320, 30}}, f.chunk); }), "block 1 (bytes 4096..8192)"));
  CHECK(Has(ErrorOf([&] { f.Read(Box{{0, 0}, {1, 4096}}, f.chunk); }), "block 1 "));
}

TEST_CASE("reserved chunks: datasets made in batches (small ones written by HDF5), read back verified; "
          "written out of order is refused") {
  TempDir tmp("br");
  // More chunks than one batch (256), of different sizes (some empty, one 0-D), and a
  // bytes entry and an unreserved stream between them.
  const int kChunks = 600;
  std::vector<std::vector<uint8_t>> data;
  storage::ShardWriter w(tmp.path(), "s.h5", {});
  for (int i = 0; i < kChunks; ++i) {
    // Up to 64 KiB (written by HDF5 with the dataset when the data is given) and a few larger.
    const std::size_t size = i == 10 ? 4 : i % 7 == 3 ? 0 : i % 50 == 1 ? (std::size_t{96} << 10) : 4 * (1 + i * 37 % 500);
    data.push_back(ckpt_test::RandomBytes(size, i + 1));
  }
  for (int i = 0; i < kChunks; ++i) {
    const int64_t n = static_cast<int64_t>(data[i].size() / 4);
    const void* given = i % 3 ? data[i].data() : nullptr;  // some announced with their data, some without
    if (i == 10) {
      w.Reserve("t10", DType::kFloat32, {}, Box::Full({}), given);
    } else {
      w.Reserve("t" + std::to_string(i), DType::kFloat32, {n * 2}, Box{{n}, {n}}, given);  // the tensor's second half
    }
  }
  std::vector<ChunkMeta> metas;
  for (int i = 0; i < kChunks; ++i) {
    const int64_t n = static_cast<int64_t>(data[i].size() / 4);
    if (i == 10) {
      metas.push_back(w.WriteChunk("t10", DType::kFloat32, {}, Box::Full({}), data[i].data()));
    } else {
      metas.push_back(w.WriteChunk("t" + std::to_string(i), DType::kFloat32, {n * 2}, Box{{n}, {n}}, data[i].data()));
    }
    if (i == 300) {
      w.WriteBytes("blob", data[i].data(), data[i].size());
      auto s = w.Begin("streamed", DType::kUInt8, {4}, Box::Full({4}));
      s->Write(data[0].data(), 4);
      s->Finish();
    }
  }
  w.Finish();
  storage::ShardReader r(tmp.path(), "s.h5");
  REQUIRE(r.Index().entries.size() == kChunks + 2);
  for (int i = 0; i < kChunks; ++i) {
    CAPTURE(i);
    const ChunkMeta& m = metas[static_cast<std::size_t>(i)];
    const bool whole = i == 10 || data[i].empty();  // an empty chunk is its whole (empty) tensor
    CHECK(m.dataset == (whole ? "t" + std::to_string(i) : "t" + std::to_string(i) + "@" + std::to_string(data[i].size() / 4)));
    CHECK(m.offset.has_value() == !data[i].empty());
    std::vector<uint8_t> back(std::max<std::size_t>(data[i].size(), 1));
    const Box box = i == 10 ? Box::Full({}) : m.box;
    r.Read("t" + std::to_string(i), DType::kFloat32, m, box, back.data(), box, true);
    back.resize(data[i].size());
    CHECK(back == data[i]);
  }

  // Written in another order than reserved: refused, nothing written.
  storage::ShardWriter bad(tmp.path(), "bad.h5", {});
  const std::vector<uint8_t> four(16, 1);
  bad.Reserve("a", DType::kFloat32, {4}, Box::Full({4}));
  bad.Reserve("b", DType::kFloat32, {4}, Box::Full({4}));
  ErrorCode code{};
  CHECK(ErrorOf([&] { bad.WriteChunk("b", DType::kFloat32, {4}, Box::Full({4}), four.data()); }, &code)
            .find("out of the order") != std::string::npos);
  CHECK(code == ErrorCode::kInternal);
  // A reserved chunk that cannot be made fails when its turn comes, with its own error, not
  // the one of the batch it was first tried in.
  storage::ShardWriter twice(tmp.path(), "twice.h5", {});
  twice.Reserve("a", DType::kFloat32, {4}, Box::Full({4}));
  twice.Reserve("a", DType::kFloat32, {4}, Box::Full({4}));
  twice.WriteChunk("a", DType::kFloat32, {4}, Box::Full({4}), four.data());
  CHECK(Has(ErrorOf([&] { twice.WriteChunk("a", DType::kFloat32, {4}, Box::Full({4}), four.data()); }, &code),
            "writes dataset 'a' twice"));
  CHECK(code == ErrorCode::kInvalidArgument);
}

namespace {

// Whether the file system under `dir` does direct I/O (tmpfs does not): a test of the direct
// path says so and checks the buffered fallback instead.
bool DirectIoAt(const fs::path& dir) {
  const fs::path probe = dir / "direct-probe";
  { std::ofstream(probe) << "x"; }
  storage::Fd fd = storage::OpenRegularFile(probe);
  return storage::DirectReader::Open(fd.get(), probe, storage::DirectReader::Policy::kAlways) != nullptr;
}

// The type of the file system `path` lies on, as /proc/self/mounts names it (the mount with
// the longest mount point that holds the path; "" where that cannot be read): an oracle for
// OnLocalDiskFileSystem that does not ask fstatfs.
std::string MountType(const fs::path& path) {
  std::ifstream mounts("/proc/self/mounts");
  const std::string p = fs::weakly_canonical(path).string();
  std::string device, point, type, rest, best_type;
  std::size_t best = 0;
  while (mounts >> device >> point >> type && std::getline(mounts, rest)) {
    const bool holds = point == "/" || p == point || p.rfind(point + "/", 0) == 0;
    if (holds && point.size() >= best) best = point.size(), best_type = type;
  }
  return best_type;
}

bool LocalDiskType(const std::string& type) {
  for (const char* t : {"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs"})
    if (type == t) return true;
  return false;
}

}  // namespace

TEST_CASE("DirectReader: any offset, length and destination alignment; past the end is kCorrupt") {
  TempDir tmp("direct");
  const bool direct = DirectIoAt(tmp.path());
  if (!direct) MESSAGE("no direct I/O under " << tmp.path() << ": checking the buffered fallback only");
  // 5 MiB and an odd tail: not a whole number of any alignment unit.
  std::vector<uint8_t> data((std::size_t{5} << 20) + 777);
  std::mt19937_64 rng(7);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const fs::path file = tmp / "f.bin";
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(data.data()),
                                              static_cast<std::streamsize>(data.size()));
  storage::Fd fd = storage::OpenRegularFile(file);
  auto reader = storage::DirectReader::Open(fd.get(), file, storage::DirectReader::Policy::kAlways);
  REQUIRE(static_cast<bool>(reader) == direct);
  if (!reader) return;
  // An aligned buffer, read into at a shift: aligned destinations go straight in, others
  // through the scratch buffer.
  std::vector<uint8_t> buf(data.size() + 8192);
  uint8_t* base = buf.data() + (4096 - reinterpret_cast<uintptr_t>(buf.data()) % 4096);
  const std::size_t size = data.size();
  for (std::size_t shift : {0, 1, 16, 511, 512}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{511}, uint64_t{4096}, (uint64_t{1} << 20) + 3}) {
      for (std::size_t n : {std::size_t{1}, std::size_t{511}, std::size_t{4096}, (std::size_t{4} << 20) + 4099,
                            size - static_cast<std::size_t>(offset)}) {
        if (offset + n > size) continue;
        CAPTURE(shift);
        CAPTURE(offset);
        CAPTURE(n);
        std::memset(base + shift, 0, n);
        reader->Read(base + shift, n, offset);
        CHECK(std::memcmp(base + shift, data.data() + offset, n) == 0);
        // With a sink: every byte handed over once, in order, the piece holding the file's
        // bytes, and everything up to its end already in the destination.
        std::memset(base + shift, 0, n);
        std::size_t handed = 0;
        bool in_order = true, piece_ok = true, dest_ok = true;
        reader->Read(base + shift, n, offset, [&](const unsigned char* p, std::size_t k, std::size_t pos) {
          in_order = in_order && pos == handed && k > 0;
          piece_ok = piece_ok && std::memcmp(p, data.data() + offset + pos, k) == 0;
          dest_ok = dest_ok && std::memcmp(base + shift, data.data() + offset, pos + k) == 0;
          handed = pos + k;
        });
        CHECK(in_order);
        CHECK(piece_ok);
        CHECK(dest_ok);
        CHECK(handed == n);
      }
    }
  }
  CHECK(reader->bytes() > 0);
  ErrorCode code{};
  const std::string e = ErrorOf([&] { reader->Read(base, 8192, size - 100); }, &code);
  CHECK(code == ErrorCode::kCorrupt);
  CHECK(Has(e, file.string() + ": unexpected end of file"));
}

TEST_CASE("reads with O_DIRECT are verified as buffered ones are: a flipped byte is caught, intact data matches") {
  // 1280 x 1024 float32: 5 MiB, 5 blocks of 1 MiB.
  Shard s(1280, 1024);
  const bool direct = DirectIoAt(s.tmp.path());
  const auto always = storage::DirectReader::Policy::kAlways;
  for (const Box& region : {Box{{0, 0}, {1280, 1024}}, Box{{200, 0}, {700, 1024}}, Box{{0, 5}, {1280, 1000}}}) {
    CAPTURE(region.ToString());
    uint64_t read = 0, read_direct = 0;
    CHECK(s.Matches(region, s.Read(region, s.chunk, &read, always, &read_direct)));
    // Rows across whole blocks are read direct; a column slice's runs are small (windows).
    if (direct && region.sizes[1] == 1024) CHECK(read_direct >= kB);
    if (!direct || region.sizes[1] != 1024) CHECK(read_direct == 0);
  }
  // Blocks of 1 MiB span several of the pieces a direct read hands over (checked in the
  // destination), blocks of 64 KiB lie whole in one (checked in the piece, in cache).
  for (uint64_t block : {kB, uint64_t{64} << 10}) {
    for (uint64_t flipped : {uint64_t{0}, uint64_t{3}, uint64_t{79}}) {
      if (flipped * block >= 5 * kB) continue;
      CAPTURE(block);
      CAPTURE(flipped);
      Shard f(1280, 1024, {}, block);
      CHECK(f.Matches(f.chunk.box, f.Read(f.chunk.box, f.chunk, nullptr, always)));
      FlipByte(f.path(), *f.chunk.offset + flipped * block + 4097);
      CHECK(Has(ErrorOf([&] { f.Read(f.chunk.box, f.chunk, nullptr, always); }),
                "block " + std::to_string(flipped) + " (bytes "));
    }
  }
}

TEST_CASE("DirectReader's auto policy: direct only on a local disk's file system") {
  // fstatfs against /proc/self/mounts' type, in the temp dir (a local disk here, ext4) and in
  // /dev/shm (tmpfs, where O_DIRECT opens on Linux 6.6 and later but is a copy all the same).
  // kAuto's own answer on tmpfs would prove nothing: tmpfs keeps every page cached, so kAuto
  // stays buffered there anyway; the next test shows kAuto reading direct on a local disk.
  TempDir tmp("direct-local");
  std::vector<fs::path> dirs = {tmp.path()};
  std::error_code ec;
  if (fs::is_directory("/dev/shm", ec)) dirs.push_back("/dev/shm");
  for (const fs::path& dir : dirs) {
    const fs::path file = dir / ("ckpt-direct-auto-" + std::to_string(::getpid()));
    { std::ofstream(file) << "x"; }
    const std::string type = MountType(dir);
    CAPTURE(dir);
    CAPTURE(type);
    CHECK_FALSE(type.empty());
    CHECK(storage::OnLocalDiskFileSystem(storage::OpenRegularFile(file).get()) == LocalDiskType(type));
    fs::remove(file, ec);
  }
}

TEST_CASE("DirectReader's auto policy: buffered while the page cache holds most of the file") {
  TempDir tmp("direct-auto");
  const fs::path file = tmp / "f.bin";
  std::vector<uint8_t> data(std::size_t{2} << 20, 0x5a);
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(data.data()),
                                              static_cast<std::streamsize>(data.size()));
  storage::Fd fd = storage::OpenRegularFile(file);
  storage::ReadExact(fd.get(), data.data(), data.size(), 0, file);  // in the page cache now
  CHECK(storage::CachedFraction(fd.get(), 0, data.size()) > 0.9);
  CHECK_FALSE(storage::DirectReader::Open(fd.get(), file, storage::DirectReader::Policy::kAuto));
  // tmpfs keeps its pages; off a local disk (overlayfs, NFS) kAuto stays buffered
  if (!DirectIoAt(tmp.path()) || !LocalDiskType(MountType(tmp.path()))) return;
  REQUIRE(::fsync(fd.get()) == 0);
  REQUIRE(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED) == 0);
  CHECK(storage::CachedFraction(fd.get(), 0, data.size()) < 0.1);
  auto reader = storage::DirectReader::Open(fd.get(), file, storage::DirectReader::Policy::kAuto);
  REQUIRE(reader);
  std::vector<uint8_t> got(data.size());
  reader->Read(got.data(), got.size(), 0);
  CHECK(got == data);
  CHECK(reader->bytes() == data.size());
}
