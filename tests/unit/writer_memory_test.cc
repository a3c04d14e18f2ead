// CheckpointWriter's memory per chunk: what it holds while chunks stream in must stay
// close to what each chunk adds to metadata.json, not kilobytes of per-chunk objects.
// Measured over a second run of chunks, once HDF5's metadata cache (bounded, a few MiB)
// has filled. CKPT_WRITER_MEMORY_CHUNKS=N measures N chunks after N (the figure quoted in
// checkpoint.h: 1,000,000 with CKPT_WRITER_MEMORY_WARM=0, i.e. from the first chunk).
#include <doctest/doctest.h>
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "ckpt/ckpt.h"
#include "test_util.h"

using namespace ckpt;

namespace {
// Bytes in use from malloc (small blocks and mmapped ones): C++ and HDF5 alike.
int64_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}
}  // namespace

TEST_CASE("CheckpointWriter holds about the metadata's size per chunk, not kilobytes") {
  const char* env = std::getenv("CKPT_WRITER_MEMORY_CHUNKS");
  const int64_t n = env ? std::atoll(env) : 25000;
  const char* warm_env = std::getenv("CKPT_WRITER_MEMORY_WARM");
  const int64_t warm = warm_env ? std::atoll(warm_env) : n;
  ckpt_test::TempDir tmp("wmem");
  float v[4] = {1, 2, 3, 4};
  auto w = CheckpointWriter::Create(tmp / "c", {});
  auto write = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // Two chunks per tensor, as a sharded save of FSDP layers has.
      const std::string key = "model.layers." + std::to_string(i / 2) + ".mlp.weight";
      w->WriteChunk(key, DType::kFloat32, {4, 2}, Box{{(i % 2) * 2, 0}, {2, 2}}, v);
    }
  };
  write(0, warm);  // fills HDF5's caches; then the cost of n more chunks
  const int64_t before = HeapInUse();
  write(warm, warm + n);
  const int64_t held = HeapInUse() - before;
  w->Commit();
  const auto meta = static_cast<int64_t>(std::filesystem::file_size(tmp / "c" / kMetadataFileName));
  const double per_chunk = static_cast<double>(held) / static_cast<double>(n);
  const double meta_per_chunk = static_cast<double>(meta) / static_cast<double>(warm + n);
  MESSAGE(n << " chunks after " << n << ": writer holds " << per_chunk << " B per chunk; metadata.json has "
            << meta_per_chunk << " B per chunk");
  std::printf("writer memory: %lld chunks (after %lld), %.0f B held per chunk, metadata.json %.0f B per chunk\n",
              static_cast<long long>(n), static_cast<long long>(warm), per_chunk, meta_per_chunk);
  // Before: a JSON tree per chunk for the shard index and whole ChunkMeta strings, about
  // 1,955 B per chunk over 325 B of metadata. Now a compact record and the index's text
  // (558 B); the margin covers vectors that double inside the measured run.
  CHECK(per_chunk < 2.5 * meta_per_chunk);
}
