// Save and load across real processes (mpiexec -n N): what threads can hide — separate
// address spaces, one HDF5 library per process, files really shared through the disk.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

#include "checkpoint/save.h"
#include "ckpt/ckpt.h"
#include "ckpt/mpi.h"
#include "fault/fault_fs.h"

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

fs::path g_dir;
constexpr int64_t kRows = 37, kCols = 12;
float Value(int64_t r, int64_t c) { return static_cast<float>(r * 1000 + c); }

// This rank's uneven row block of a kRows x kCols tensor.
std::pair<int64_t, int64_t> Rows(int rank, int size) {
  const int64_t base = kRows / size, extra = kRows % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, base + (rank < extra ? 1 : 0)};
}

}  // namespace

TEST_CASE("processes save row shards; every process then loads columns; a sub-group loads full") {
  auto comm = MpiWorld();
  const int rank = comm->rank(), size = comm->size();
  const fs::path dir = g_dir / "ck";
  const auto [begin, count] = Rows(rank, size);
  std::vector<float> rows(static_cast<std::size_t>(count * kCols));
  for (int64_t r = 0; r < count; ++r)
    for (int64_t c = 0; c < kCols; ++c) rows[r * kCols + c] = Value(begin + r, c);
  std::vector<double> bias(kCols, 0.25);  // replicated on every process
  StateDict sd;
  sd.Add("model.w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 0, begin, count, rows.data()));
  sd.Add("model.b", Tensor::Full(DType::kFloat64, {kCols}, bias.data()));
  sd.Add("rng.rank" + std::to_string(rank), Bytes{std::vector<uint8_t>(16, static_cast<uint8_t>(rank))});
  sd.Add("step", Scalar::Int(42));
  Save(dir, sd, *comm);

  const Metadata md = ReadMetadata(dir);
  CHECK(md.world_size == size);
  CHECK(md.Find("model.b")->chunks.size() == 1);  // the replica is stored once

  // Columns: process r holds columns [r*k, ...).
  const int64_t cbegin = kCols * rank / size, cend = kCols * (rank + 1) / size;
  std::vector<float> cols(static_cast<std::size_t>(kRows * (cend - cbegin)));
  std::vector<double> b(kCols);
  StateDict target;
  target.Add("model.w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 1, cbegin, cend - cbegin, cols.data()));
  target.Add("model.b", Tensor::Full(DType::kFloat64, {kCols}, b.data()));
  for (int r = 0; r < size; ++r) target.Add("rng.rank" + std::to_string(r), Bytes{});
  target.Add("step", Scalar{});
  Load(dir, target, *comm);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = cbegin; c < cend; ++c) REQUIRE(cols[r * (cend - cbegin) + (c - cbegin)] == Value(r, c));
  CHECK(b == bias);
  CHECK(std::get<Bytes>(target.At("rng.rank" + std::to_string(size - 1))).data ==
        std::vector<uint8_t>(16, static_cast<uint8_t>(size - 1)));

  // A sub-communicator (all but the last process) loads the whole tensor on each member.
  auto sub = comm->Split(rank == size - 1 ? 1 : 0, rank);
  if (rank != size - 1) {
    std::vector<float> full(static_cast<std::size_t>(kRows * kCols));
    StateDict t;
    t.Add("model.w", Tensor::Full(DType::kFloat32, {kRows, kCols}, full.data()));
    LoadOptions lo;
    lo.strict = false;
    const LoadReport report = Load(dir, t, *sub, lo);
    CHECK(report.unexpected_keys.size() == static_cast<std::size_t>(size) + 2);
    CHECK(full[36 * kCols + 11] == Value(36, 11));
  }
  comm->Barrier();
}

TEST_CASE("one process failing before commit fails the save on every process") {
  auto comm = MpiWorld();
  const fs::path dir = g_dir / "failing";
  std::vector<int32_t> v(8, comm->rank());
  StateDict sd;
  sd.Add("x", Tensor::Slice(DType::kInt32, {8 * static_cast<int64_t>(comm->size())}, 0, 8 * comm->rank(), 8, v.data()));
  // Process 1's disk fails while it writes its shard (the seam).
  ckpt_test::FaultFs failing(1, EIO, "shard-00001-of-");
  std::optional<ckpt_test::Installed> injected;
  if (comm->rank() == 1) injected.emplace(failing);
  CHECK_THROWS_WITH_AS(Save(dir, sd, *comm), doctest::Contains("rank 1: "), Error);
  injected.reset();
  comm->Barrier();
  CHECK_FALSE(fs::exists(dir));
}

TEST_CASE("an async save across processes: snapshot, background write over a Dup, failure on every process") {
  auto comm = MpiWorld();
  const int rank = comm->rank(), size = comm->size();
  std::vector<int32_t> v(64, rank);
  StateDict sd;
  sd.Add("x", Tensor::Slice(DType::kInt32, {64 * static_cast<int64_t>(size)}, 0, 64 * rank, 64, v.data()));
  SaveHandle h = SaveAsync(g_dir / "async", sd, *comm);
  std::fill(v.begin(), v.end(), -1);  // the snapshot was taken: this is not saved
  comm->Barrier();                    // the caller's communicator while the background one writes
  h.Wait();
  const Metadata md = ReadMetadata(g_dir / "async", false);
  REQUIRE(md.save_timings.has_value());
  CHECK(md.save_timings->async);
  std::vector<int32_t> all(static_cast<std::size_t>(64 * size));
  CheckpointReader::Open(g_dir / "async")->ReadRegion("x", Box::Full({64 * static_cast<int64_t>(size)}), all.data());
  for (std::size_t i = 0; i < all.size(); ++i) REQUIRE(all[i] == static_cast<int32_t>(i / 64));

  // Process 1's disk fails in the background: every process's Wait throws it. Reported there,
  // it is not thrown again: the next SaveAsync commits.
  ckpt_test::FaultFs failing(1, EIO, "shard-00001-of-");
  std::optional<ckpt_test::Installed> injected;
  if (rank == 1) injected.emplace(failing);
  h = SaveAsync(g_dir / "async-failing", sd, *comm);
  CHECK_THROWS_WITH_AS(h.Wait(), doctest::Contains("rank 1: "), Error);
  injected.reset();
  SaveAsync(g_dir / "async-next", sd, *comm).Wait();
  WaitForSaves(*comm);
  comm->Barrier();
  CHECK_FALSE(fs::exists(g_dir / "async-failing"));
  CHECK(fs::exists(g_dir / "async-next" / kMetadataFileName));
  // Failing again, and waited for by no process: each one's next SaveAsync throws it.
  ckpt_test::FaultFs failing_again(1, EIO, "shard-00001-of-");
  if (rank == 1) injected.emplace(failing_again);
  h = SaveAsync(g_dir / "async-failing", sd, *comm);
  h.WaitQuietly();
  injected.reset();
  CHECK_THROWS_WITH_AS(SaveAsync(g_dir / "async-after", sd, *comm), doctest::Contains("rank 1: "), Error);
  WaitForSaves(*comm);
  comm->Barrier();
  CHECK_FALSE(fs::exists(g_dir / "async-after"));
}

TEST_CASE("replicas that differ between processes are refused, naming the ranks") {
  auto comm = MpiWorld();
  std::vector<float> w(16, 1.0f);
  if (comm->rank() == comm->size() - 1) w[3] = 2.0f;
  StateDict sd;
  sd.Add("model.w", Tensor::Full(DType::kFloat32, {16}, w.data()));
  CHECK_THROWS_WITH_AS(Save(g_dir / "desync", sd, *comm), doctest::Contains("replicas differ"), Error);
}

TEST_CASE("the save's fast path (key table, a byte per key reduced) writes what describing everything writes") {
  auto comm = MpiWorld();
  const int rank = comm->rank(), size = comm->size();
  const int64_t rows = 3 * size - 1, begin = 3 * rank, count = std::min<int64_t>(3, rows - begin);
  std::vector<float> part(static_cast<std::size_t>(count * kCols), static_cast<float>(rank));
  std::vector<float> odd(static_cast<std::size_t>(kCols), 1.0f);
  auto save = [&](const fs::path& dir, bool fast_plan, DType dtype) {
    StateDict sd;
    sd.Add("emb", Tensor::Slice(dtype, {rows, kCols}, 0, begin, count, part.data()));  // the fast path
    sd.Add("odd", Tensor::Slice(DType::kFloat32, {size, kCols}, 0, size - 1 - rank, 1, odd.data()));  // not
    sd.Add("step", Scalar::Int(42));
    sd.Add("rng.rank" + std::to_string(rank), Bytes{std::vector<uint8_t>(8, static_cast<uint8_t>(rank))});
    internal::SaveContext context;
    context.fast_plan = fast_plan;
    internal::SaveWithContext(dir, sd, *comm, {}, context);
  };
  save(g_dir / "fast", true, DType::kFloat32);
  save(g_dir / "slow", false, DType::kFloat32);
  if (rank == 0) {
    auto stable = [](const fs::path& dir) {
      std::ifstream in(dir / "metadata.json", std::ios::binary);
      Metadata m = ParseMetadata(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
      m.created.clear();
      m.save_timings.reset();
      return SerializeMetadata(m);
    };
    CHECK(stable(g_dir / "fast") == stable(g_dir / "slow"));
  }
  // A dtype that one process disagrees on: the key is off the fast path, the error names it.
  const std::string expected = "key 'emb': rank " + std::to_string(size - 1) + " has int32";
  for (bool fast_plan : {true, false}) {
    CHECK_THROWS_WITH_AS(save(g_dir / "bad", fast_plan, rank == size - 1 ? DType::kInt32 : DType::kFloat32),
                         doctest::Contains(expected.c_str()), Error);
  }
}

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  if (argc < 2) return 2;
  g_dir = argv[1];
  {
    auto comm = MpiWorld();
    if (comm->rank() == 0) {
      fs::remove_all(g_dir);
      fs::create_directories(g_dir);
    }
    comm->Barrier();
  }
  doctest::Context ctx;
  ctx.setOption("no-path-filenames", true);
  const int rc = ctx.run();
  // Every process must agree on the verdict, or mpiexec reports the first failure only.
  auto comm = MpiWorld();
  int32_t worst = rc;
  comm->AllReduce(&worst, 1, DType::kInt32, ReduceOp::kMax);
  return worst;
}
