// The public helpers the tools library is built on, through libckpt.so's exported API only:
// box geometry (ckpt/tensor.h), chunk digests (ckpt/digest.h), staged outputs and files
// (ckpt/files.h).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/comm.h"
#include "ckpt/digest.h"
#include "ckpt/error.h"
#include "ckpt/files.h"
#include "ckpt/tensor.h"
#include "ckpt/verify.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

std::optional<ErrorCode> CodeOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.code();
  }
  return std::nullopt;  // nothing thrown
}

std::string MessageOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> Names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string Slurp(const fs::path& p) { return files::ReadSmallFile(p, 1 << 20); }

}  // namespace

TEST_CASE("box geometry: Intersect, Contains, Overlaps") {
  const Box a{{0, 0}, {4, 6}}, b{{2, 3}, {4, 4}};
  REQUIRE(Intersect(a, b).has_value());
  CHECK(*Intersect(a, b) == Box{{2, 3}, {2, 3}});
  CHECK_FALSE(Intersect(a, Box{{4, 0}, {1, 6}}).has_value());  // touching only
  CHECK_FALSE(Intersect(a, Box{{0}, {4}}).has_value());         // other rank
  CHECK(Intersect(Box{}, Box{}) == Box{});                      // 0-D: the one element
  CHECK(Contains(a, Box{{1, 1}, {3, 5}}));
  CHECK_FALSE(Contains(a, Box{{1, 1}, {4, 5}}));
  CHECK(Overlaps(a, b));
  CHECK_FALSE(Overlaps(a, Box{{0, 6}, {4, 1}}));
}

TEST_CASE("box geometry: ForEachRun copies a region between two layouts, CountRuns counts its runs") {
  const Box src{{0, 0, 0}, {4, 5, 6}};
  std::vector<int> src_buf(4 * 5 * 6);
  std::iota(src_buf.begin(), src_buf.end(), 0);
  for (const Box& dst : {Box{{1, 0, 0}, {2, 5, 6}}, Box{{1, 1, 2}, {3, 3, 4}}, Box{{0, 0, 0}, {4, 5, 6}}}) {
    const Box region = *Intersect(src, dst);
    std::vector<int> got(static_cast<std::size_t>(dst.NumElements()), -1);
    int64_t runs = 0;
    ForEachRun(src, dst, region, [&](const BoxRun& r) {
      std::memcpy(&got[r.dst], &src_buf[r.src], static_cast<std::size_t>(r.count) * sizeof(int));
      ++runs;
    });
    CHECK(runs == CountRuns(src, dst, region));
    for (int64_t i = 0; i < dst.sizes[0]; ++i)
      for (int64_t j = 0; j < dst.sizes[1]; ++j)
        for (int64_t k = 0; k < dst.sizes[2]; ++k) {
          const int64_t g0 = dst.offsets[0] + i, g1 = dst.offsets[1] + j, g2 = dst.offsets[2] + k;
          CHECK(got[(i * dst.sizes[1] + j) * dst.sizes[2] + k] == (g0 * 5 + g1) * 6 + g2);
        }
  }
  // Whole trailing dimensions merge: a block of whole rows is one run.
  CHECK(CountRuns(src, Box{{1, 0, 0}, {2, 5, 6}}, Box{{1, 0, 0}, {2, 5, 6}}) == 1);
  CHECK(CountRuns(src, src, Box{{0, 1, 2}, {4, 3, 4}}) == 12);
  CHECK(CountRuns(src, src, Box{{0, 0, 0}, {0, 5, 6}}) == 0);
}

TEST_CASE("box geometry: SplitBox, bounded blocks, in row-major order, covering the box exactly") {
  const Box whole = Box::Full({7, 5, 3});
  for (uint64_t budget : {4ull, 12ull, 60ull, 100ull, 1000ull, 100000ull}) {
    const auto blocks = SplitBox(whole, 4, budget);
    int64_t expect_next = 0, total = 0;
    for (const Box& b : blocks) {
      CHECK((static_cast<uint64_t>(b.NumElements()) * 4 <= budget || b.NumElements() == 1));
      // Each block is a contiguous row-major range starting where the previous ended.
      const int64_t start = (b.offsets[0] * 5 + b.offsets[1]) * 3 + b.offsets[2];
      CHECK(start == expect_next);
      expect_next = start + b.NumElements();
      total += b.NumElements();
    }
    CHECK(total == whole.NumElements());
  }
  CHECK(SplitBox(Box{}, 8, 1).size() == 1);  // 0-D
}

TEST_CASE("ChunkDigest: v1 and v2 checksums, blocks and statistics as FORMAT.md spells them") {
  CHECK(ChunkDigest(DType::kUInt8, false).Checksum() == "xxh3-64:2d06800538d394c2");  // XXH3-64 of nothing
  std::vector<unsigned char> bytes(10000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 3);
  ChunkDigest v1(DType::kUInt8, false);
  v1.Update(bytes.data(), 3);  // pieces may split anywhere
  v1.Update(bytes.data() + 3, bytes.size() - 3);
  CHECK(v1.Checksum() == FormatChecksum(HashBlock(bytes.data(), bytes.size())));
  CHECK(v1.Blocks().empty());

  ChunkDigest v2(DType::kUInt8, false, kMinBlockBytes);
  v2.Update(bytes.data(), 5000);
  v2.Update(bytes.data() + 5000, 5000);
  CHECK(BlockCount(bytes.size(), kMinBlockBytes) == 3);
  REQUIRE(v2.BlockDigests().size() == 3);
  CHECK(v2.BlockDigests()[2] == HashBlock(bytes.data() + 8192, 10000 - 8192));
  CHECK(v2.Blocks().size() == 48);
  CHECK(v2.Blocks().substr(0, 16) == FormatChecksum(HashBlock(bytes.data(), 4096)).substr(8));
  CHECK(v2.Checksum() == ChecksumOfBlocks(v2.Blocks()));
  CHECK(v2.Checksum() != v1.Checksum());

  ChunkMeta meta;
  meta.checksum = v2.Checksum();
  meta.block_bytes = kMinBlockBytes;
  meta.blocks = v2.Blocks();
  v2.Check(meta, bytes.size(), "f.h5: w");
  meta.blocks[16] = meta.blocks[16] == '0' ? '1' : '0';  // block 1 disagrees
  const std::string msg = MessageOf([&] { v2.Check(meta, bytes.size(), "f.h5: w"); });
  CHECK(msg.find("f.h5: w block 1 (bytes 4096..8192)") == 0);
  CHECK(CodeOf([&] { v2.Check(meta, bytes.size(), "w"); }) == ErrorCode::kCorrupt);

  CHECK(CodeOf([] { ChunkDigest(DType::kUInt8, false, 3000); }) == ErrorCode::kInvalidArgument);
  CHECK(CodeOf([] { ChunkDigest(DType::kUInt8, false, kMaxBlockBytes * 2); }) == ErrorCode::kInvalidArgument);
  CHECK(CodeOf([] { ChecksumOfBlocks("0123"); }) == ErrorCode::kCorrupt);
  CHECK(CodeOf([] { ChecksumOfBlocks("0123456789ABCDEF"); }) == ErrorCode::kCorrupt);

  const float values[] = {1.0f, -2.0f, std::numeric_limits<float>::quiet_NaN(), 4.0f};
  ChunkDigest f(DType::kFloat32, true);
  f.Update(values, sizeof values);
  REQUIRE(f.Stats().has_value());
  CHECK(f.Stats()->min == -2.0);
  CHECK(f.Stats()->max == 4.0);
  CHECK(f.Stats()->nan_count == 1);
  CHECK(f.Stats()->finite_count == 3);
  CHECK_FALSE(ChunkDigest(DType::kInt32, true).Stats().has_value());
  ChunkDigest moved = std::move(f);
  CHECK(moved.Stats()->max == 4.0);
}

TEST_CASE("StagedOutput: written aside, committed by rename, discarded when dropped") {
  const ckpt_test::TempDir tmp("public_api_staged");
  const fs::path dir = tmp.path();
  const fs::path target = dir / "out.bin";
  {
    files::StagedOutput out(target, /*directory=*/false);
    CHECK(out.path().parent_path() == dir);
    CHECK(out.path() != target);
    files::File f = files::File::Create(out.path());
    f.WriteAt("hello", 5, 0);
    f.Sync();
    f.Close();
    CHECK_FALSE(fs::exists(target));  // nothing visible before the commit
    out.Commit(files::Replace::kNever);
    CHECK(out.committed());
  }
  CHECK(Slurp(target) == "hello");
  CHECK(Names(dir) == std::vector<std::string>{"out.bin"});

  {  // kNever refuses an existing target; the staging goes with the object
    files::StagedOutput out(target, false);
    files::File::Create(out.path()).Sync();
    CHECK(CodeOf([&] { out.Commit(files::Replace::kNever); }) == ErrorCode::kAlreadyExists);
  }
  CHECK(Names(dir) == std::vector<std::string>{"out.bin"});
  CHECK(Slurp(target) == "hello");

  {  // kExisting replaces it; two outputs commit together
    files::StagedOutput a(target, false), b(dir / "index.json", false);
    files::File fa = files::File::Create(a.path());
    fa.WriteAt("bye", 3, 0);
    fa.Sync();
    files::File fb = files::File::Create(b.path());
    fb.WriteAt("{}", 2, 0);
    fb.Sync();
    files::StagedOutput::CommitAll({&a, &b}, files::Replace::kExisting);
    CHECK(a.committed());
    CHECK(b.committed());
    CHECK(CodeOf([&] { a.Commit(files::Replace::kExisting); }) == ErrorCode::kInvalidArgument);
  }
  CHECK(Slurp(target) == "bye");
  CHECK(Slurp(dir / "index.json") == "{}");
  CHECK(Names(dir) == std::vector<std::string>{"index.json", "out.bin"});

  {  // a directory output; an explicit Discard
    files::StagedOutput d(dir / "sub", /*directory=*/true);
    CHECK(fs::is_directory(d.path()));
    files::StagedOutput moved = std::move(d);
    moved.Discard();
    moved.Discard();
  }
  CHECK(Names(dir) == std::vector<std::string>{"index.json", "out.bin"});
}

TEST_CASE("File: reads exactly, scans, copies, refuses symlinks unless a user named them") {
  const ckpt_test::TempDir tmp("public_api_file");
  const fs::path dir = tmp.path();
  {
    files::File w = files::File::Create(dir / "a");
    std::string text(300000, 'x');
    for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 26);
    w.WriteAt(text.data(), text.size(), 0);
    CHECK(w.Size() == text.size());
    CHECK(CodeOf([&] { files::File::Create(dir / "a"); }) == ErrorCode::kAlreadyExists);

    files::File c = files::File::Create(dir / "b");
    c.CopyFrom(w.fd(), w.path(), 100, 0, 1000);
    c.StartWriteback();
    c.Sync();
    char buf[4];
    c.ReadAt(buf, 4, 0);
    CHECK(std::string(buf, 4) == text.substr(100, 4));
    CHECK(CodeOf([&] { c.ReadAt(buf, 4, 998); }) == ErrorCode::kCorrupt);

    std::string scanned;
    uint64_t expect_pos = 0;
    w.Scan(7, text.size() - 7, [&](const unsigned char* p, std::size_t n, uint64_t pos) {
      CHECK(pos == expect_pos);
      expect_pos += n;
      scanned.append(reinterpret_cast<const char*>(p), n);
    });
    CHECK(scanned == text.substr(7));
    CHECK(CodeOf([&] { w.Scan(0, text.size() + 1, [](const unsigned char*, std::size_t, uint64_t) {}); }) ==
          ErrorCode::kCorrupt);
  }
  fs::create_symlink(dir / "a", dir / "link");
  CHECK(files::File::OpenForRead(dir / "link", /*follow_symlinks=*/true).Size() == 300000);
  CHECK(CodeOf([&] { files::File::OpenForRead(dir / "link"); }).has_value());
  CHECK(CodeOf([&] { files::File::OpenForRead(dir / "missing"); }) == ErrorCode::kNotFound);
  CHECK(CodeOf([&] { files::File::OpenForRead(dir); }) == ErrorCode::kCorrupt);
  files::File closed;
  CHECK(CodeOf([&] { closed.Size(); }) == ErrorCode::kInvalidArgument);
}

TEST_CASE("CheckpointReader: Reopen reads the pinned checkpoint, PinnedPath names its files, OpenShard reads one shard") {
  const ckpt_test::TempDir tmp("public_api_reader");
  const fs::path dir = tmp.path() / "ck";
  std::vector<float> w(6 * 4);
  std::iota(w.begin(), w.end(), 0.0f);
  std::vector<int32_t> v(10, 7);
  {
    StateDict sd;
    sd.Add("w", Tensor::Full(DType::kFloat32, {6, 4}, w.data()));
    sd.Add("v", Tensor::Full(DType::kInt32, {10}, v.data()));
    SingleComm comm;
    Save(dir, sd, comm);
  }
  CHECK_FALSE(IsObjectUrl(dir));
  CHECK(IsObjectUrl("s3://bucket/prefix"));

  ReaderOptions o;
  o.resolve = false;
  auto reader = CheckpointReader::Open(dir, o);
  CHECK(reader->StructureProblems().empty());
  reader->CheckStructure();
  CHECK(reader->metadata().Find("w")->ChunkCount() == 1);
  const auto pinned = reader->PinnedPath("metadata.json");
  REQUIRE(pinned.has_value());
  CHECK(files::ReadSmallFile(*pinned, 1 << 20, /*follow_symlinks=*/true) == Slurp(dir / "metadata.json"));

  // A Reopen reads the same checkpoint, on another thread.
  auto early = reader->Reopen();
  std::vector<float> first(w.size());
  std::thread([&] { early->ReadRegion("w", Box::Full({6, 4}), first.data()); }).join();
  CHECK(first == w);
  early = reader->Reopen();
  // Another checkpoint committed at the same path.
  std::vector<float> w2(6 * 4, -1.0f);
  {
    StateDict sd;
    sd.Add("w", Tensor::Full(DType::kFloat32, {6, 4}, w2.data()));
    SingleComm comm;
    SaveOptions so;
    so.overwrite = true;
    Save(dir, sd, comm, so);
  }
  // The pinned checkpoint's files went with it: its readers fail with kChanged, never read
  // the new one; its metadata is still the one read.
  CHECK(CodeOf([&] { reader->ThrowIfReplaced(); }) == ErrorCode::kChanged);
  CHECK(CodeOf([&] { early->ThrowIfReplaced(); }) == ErrorCode::kChanged);
  std::vector<float> got(w.size());
  CHECK(CodeOf([&] { early->ReadRegion("w", Box::Full({6, 4}), got.data()); }) == ErrorCode::kChanged);
  CHECK(reader->Reopen()->metadata().Find("v") != nullptr);
  auto fresh = CheckpointReader::Open(dir);
  CHECK(fresh->metadata().Find("v") == nullptr);
  fresh->ThrowIfReplaced();

  // One shard on its own: what its index lists, no checksums to check.
  fs::path shard;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".h5") shard = e.path();
  REQUIRE(!shard.empty());
  auto lone = CheckpointReader::OpenShard(shard);
  REQUIRE(lone->metadata().Find("w") != nullptr);
  CHECK(lone->metadata().Find("w")->chunks.size() == 1);
  lone->ReadRegion("w", Box{{2, 0}, {2, 4}}, got.data());
  CHECK(got[0] == -1.0f);
  lone->VerifyChunk("w", 0);
  CHECK(lone->LocateChunk("w", 0).has_value());
  CHECK(lone->StructureProblems().empty());
  CHECK(CodeOf([&] { lone->ReadRegion("nope", Box{}, got.data()); }) == ErrorCode::kNotFound);
  CHECK(lone->Reopen()->metadata().entries.size() == lone->metadata().entries.size());
  CHECK_FALSE(lone->PinnedPath("x").has_value());
}

TEST_CASE("CheckpointReader: an unsound structure is refused at open, or listed with check_structure off") {
  const ckpt_test::TempDir tmp("public_api_structure");
  const fs::path dir = tmp.path() / "ck";
  std::vector<float> a(8, 1.0f), b(8, 2.0f);
  {
    StateDict sd;  // two ranks' rows, saved as one rank holding both halves
    sd.Add("w", Tensor::Sharded(DType::kFloat32, {4, 4},
                                {Chunk{Box{{0, 0}, {2, 4}}, a.data()}, Chunk{Box{{2, 0}, {2, 4}}, b.data()}}));
    SingleComm comm;
    Save(dir, sd, comm);
  }
  // w's stored_bytes raised in metadata.json, its digest made consistent (FORMAT.md §3.6):
  // only the sum of the records (§3.5) tells.
  std::string text = Slurp(dir / "metadata.json");
  const auto key = text.find("\"w\":");
  REQUIRE(key != std::string::npos);
  const std::string member = "\"stored_bytes\":";
  const auto at = text.find(member, key);
  REQUIRE(at != std::string::npos);
  text.insert(at + member.size(), "1");  // 64 -> 164
  const auto digest = text.rfind("\"digest\"");
  const std::string body = text.substr(0, digest);
  text = body + "\"digest\": \"" + FormatChecksum(HashBlock(body.data(), body.size())) + "\"}\n";
  files::CommitFile(dir / "metadata.json", text);

  CHECK(CodeOf([&] { CheckpointReader::Open(dir); }) == ErrorCode::kCorrupt);
  ReaderOptions o;
  o.check_structure = false;
  auto reader = CheckpointReader::Open(dir, o);
  const std::vector<std::string> problems = reader->StructureProblems();
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("'w'") != std::string::npos);
  CHECK(CodeOf([&] { reader->CheckStructure(); }) == ErrorCode::kCorrupt);
  std::vector<float> got(16);
  reader->ReadRegion("w", Box::Full({4, 4}), got.data());  // the data itself is sound
  CHECK(got[15] == 2.0f);
}

TEST_CASE("VerifyCheckpoint: a sound checkpoint passes, a flipped byte is named, callers' checks go first and last") {
  const ckpt_test::TempDir tmp("public_api_verify");
  const fs::path dir = tmp.path() / "ck";
  std::vector<float> w(64 * 64);
  std::iota(w.begin(), w.end(), 0.0f);
  {
    StateDict sd;
    sd.Add("w", Tensor::Full(DType::kFloat32, {64, 64}, w.data()));
    SingleComm comm;
    Save(dir, sd, comm);
  }
  CheckOptions o;
  uint64_t last_done = 0, last_total = 1;
  o.progress = [&](uint64_t done, uint64_t total) {
    last_done = done;
    last_total = total;
  };
  VerifyReport r = VerifyCheckpoint(dir, o);
  CHECK(r.ok());
  CHECK(r.keys == 1);
  CHECK(r.format_version == 2);
  CHECK(r.bytes_read == w.size() * sizeof(float));
  CHECK(last_done == last_total);

  // A byte of w's data flipped (found through the public reader), the shard's size unchanged.
  const auto range = CheckpointReader::Open(dir)->LocateChunk("w", 0);
  REQUIRE(range.has_value());
  {
    files::File f = files::File::OpenForRead(range->file);
    std::string bytes(static_cast<std::size_t>(f.Size()), '\0');
    f.ReadAt(bytes.data(), bytes.size(), 0);
    f.Close();
    bytes[static_cast<std::size_t>(range->offset + 4000)] ^= 0x40;
    std::filesystem::permissions(range->file, fs::perms::owner_write, fs::perm_options::add);
    files::File g = files::File::Create(tmp.path() / "copy");
    g.WriteAt(bytes.data(), bytes.size(), 0);
    g.Sync();
    g.Close();
    fs::rename(tmp.path() / "copy", range->file);
  }
  o.check_text = [](const std::string& text) {
    return std::vector<VerifyProblem>{{"mine", "metadata.json", "", std::to_string(text.size()) + " bytes"}};
  };
  o.check_metadata = [](const Metadata& md) {
    return std::vector<VerifyProblem>{{"expect", "", "w", std::to_string(md.entries.size()) + " keys"}};
  };
  r = VerifyCheckpoint(dir, o);
  REQUIRE(r.problems.size() == 3);
  CHECK(r.problems[0].check == "mine");
  CHECK(r.problems[1].check == "checksums");
  CHECK(r.problems[1].key == "w");
  CHECK(r.problems[1].message.find("block 0") != std::string::npos);
  CHECK(r.problems[2].message == "1 keys");
  o.quick = true;
  o.check_text = nullptr;
  o.check_metadata = nullptr;
  CHECK(VerifyCheckpoint(dir, o).ok());  // quick reads no data
  CHECK(CodeOf([&] { VerifyCheckpoint(tmp.path() / "none", o); }) == ErrorCode::kNotFound);
  VerifyReport none = VerifyCheckpoint(tmp.path(), o);  // a directory without metadata.json
  REQUIRE(none.problems.size() == 1);
  CHECK(none.problems[0].check == "metadata");
}
