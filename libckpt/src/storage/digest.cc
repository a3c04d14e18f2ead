// storage/digest.cc
#include "storage/digest.h"

// The XXH3 implementation is compiled into this file (the header's inline mode), so it is
// optimised with the rest of the hot loop instead of called through the shared library.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <vector>
#if defined(__SSE2__)
#include <cpuid.h>
#include <emmintrin.h>
#endif
#include <cstdio>
#include <cstring>
#include <limits>

#include "format/names.h"
#include "storage/pool.h"
#include "storage/stats_kernels.h"
#include "storage/xxh3_dispatch.h"

namespace ckpt::storage {
namespace {

// Running statistics over finite elements. Kept in double; each block's partial sums are
// gathered in a branch-light loop the compiler vectorises.
struct RunningStats {
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0, sumsq = 0;
  int64_t nan = 0, inf = 0, finite = 0;

  void Add(double v) {
    if (std::isnan(v)) {
      ++nan;
    } else if (std::isinf(v)) {
      ++inf;
    } else {
      min = std::min(min, v);
      max = std::max(max, v);
      sum += v;
      sumsq += v * v;
      ++finite;
    }
  }
};

// The partial sums of one statistics block, before they are added to the running
// statistics: the sums in double, min and max.
struct Partial {
  double sum = 0, sumsq = 0, lo = 0, hi = 0;
};

// Adds one block's partial sums, or recounts the block element by element when they show
// a NaN or Inf (rare, so the fast loops need no per-element branch).
void AddPartial(DType dtype, const unsigned char* p, std::size_t n, const Partial& r, RunningStats& s) {
  if (std::isfinite(r.sum) && std::isfinite(r.sumsq) && std::isfinite(r.lo) && std::isfinite(r.hi)) {
    s.sum += r.sum;
    s.sumsq += r.sumsq;
    s.min = std::min(s.min, r.lo);
    s.max = std::max(s.max, r.hi);
    s.finite += static_cast<int64_t>(dtype == DType::kFloat4E2M1FNx2 ? 2 * n : n);
  } else if (dtype == DType::kFloat4E2M1FNx2) {
    for (std::size_t i = 0; i < n; ++i) {
      double pair[2];
      ElementValues(dtype, p + i, pair);
      s.Add(pair[0]);
      s.Add(pair[1]);
    }
  } else {
    const std::size_t size = DTypeSize(dtype);
    for (std::size_t i = 0; i < n; ++i) s.Add(ElementToDouble(dtype, p + i * size));
  }
}

// float32 statistics of one block: sums in double, min/max in float.
Partial FloatBlock(const float* p, std::size_t n) {
  std::size_t i = 0;
  double sum = 0, sumsq = 0, lo = p[0], hi = p[0];
#if defined(__SSE2__)
  __m128 vmin = _mm_set1_ps(p[0]), vmax = vmin;
  __m128d s0 = _mm_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
  for (; i + 8 <= n; i += 8) {
    const __m128 a = _mm_loadu_ps(p + i), b = _mm_loadu_ps(p + i + 4);
    vmin = _mm_min_ps(vmin, _mm_min_ps(a, b));
    vmax = _mm_max_ps(vmax, _mm_max_ps(a, b));
    const __m128d a0 = _mm_cvtps_pd(a), a1 = _mm_cvtps_pd(_mm_movehl_ps(a, a));
    const __m128d b0 = _mm_cvtps_pd(b), b1 = _mm_cvtps_pd(_mm_movehl_ps(b, b));
    s0 = _mm_add_pd(s0, a0);
    s1 = _mm_add_pd(s1, a1);
    s2 = _mm_add_pd(s2, b0);
    s3 = _mm_add_pd(s3, b1);
    q0 = _mm_add_pd(q0, _mm_mul_pd(a0, a0));
    q1 = _mm_add_pd(q1, _mm_mul_pd(a1, a1));
    q2 = _mm_add_pd(q2, _mm_mul_pd(b0, b0));
    q3 = _mm_add_pd(q3, _mm_mul_pd(b1, b1));
  }
  alignas(16) double d[2];
  alignas(16) float f[4];
  _mm_store_pd(d, _mm_add_pd(_mm_add_pd(s0, s1), _mm_add_pd(s2, s3)));
  sum = d[0] + d[1];
  _mm_store_pd(d, _mm_add_pd(_mm_add_pd(q0, q1), _mm_add_pd(q2, q3)));
  sumsq = d[0] + d[1];
  _mm_store_ps(f, vmin);
  lo = std::min({f[0], f[1], f[2], f[3]});
  _mm_store_ps(f, vmax);
  hi = std::max({f[0], f[1], f[2], f[3]});
#endif
  for (; i < n; ++i) {
    const double v = p[i];
    sum += v;
    sumsq += v * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return {sum, sumsq, lo, hi};
}

Partial DoubleBlock(const double* p, std::size_t n) {
  double sum[4] = {}, sumsq[4] = {}, lo = p[0], hi = p[0];
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (std::size_t j = 0; j < 4; ++j) {
      sum[j] += p[i + j];
      sumsq[j] += p[i + j] * p[i + j];
      lo = p[i + j] < lo ? p[i + j] : lo;
      hi = p[i + j] > hi ? p[i + j] : hi;
    }
  }
  for (; i < n; ++i) {
    sum[0] += p[i];
    sumsq[0] += p[i] * p[i];
    lo = std::min(lo, p[i]);
    hi = std::max(hi, p[i]);
  }
  return {sum[0] + sum[1] + sum[2] + sum[3], sumsq[0] + sumsq[1] + sumsq[2] + sumsq[3], lo, hi};
}

// Lookup tables for the 8- and 16-bit float formats: element bits -> float.
const std::vector<float>& Table(DType dtype) {
  static const auto make = [](DType dt, std::size_t n) {
    std::vector<float> t(n);
    for (std::size_t i = 0; i < n; ++i) {
      const uint16_t bits = static_cast<uint16_t>(i);
      uint8_t byte = static_cast<uint8_t>(i);
      t[i] = static_cast<float>(DTypeSize(dt) == 1 ? ElementToDouble(dt, &byte) : ElementToDouble(dt, &bits));
    }
    return t;
  };
  static const std::vector<float> half = make(DType::kFloat16, 65536);
  static const std::vector<float> e4m3 = make(DType::kFloat8E4M3FN, 256);
  static const std::vector<float> e5m2 = make(DType::kFloat8E5M2, 256);
  static const std::vector<float> e8m0 = make(DType::kFloat8E8M0FNU, 256);
  switch (dtype) {
    case DType::kFloat16: return half;
    case DType::kFloat8E4M3FN: return e4m3;
    case DType::kFloat8E8M0FNU: return e8m0;
    default: return e5m2;
  }
}

// float4_e2m1fn_x2: byte -> its two values (low nibble first), as float.
const std::vector<float>& PairTable() {
  static const std::vector<float> t = [] {
    std::vector<float> v(512);
    for (unsigned b = 0; b < 256; ++b) {
      const auto byte = static_cast<uint8_t>(b);
      double pair[2];
      ElementValues(DType::kFloat4E2M1FNx2, &byte, pair);
      v[2 * b] = static_cast<float>(pair[0]);
      v[2 * b + 1] = static_cast<float>(pair[1]);
    }
    return v;
  }();
  return t;
}

#if defined(CKPT_STATS_AVX2)
// CPUID leaf 1, ECX bit 29 (clang 14, the fuzz build's compiler, has no "f16c" for
// __builtin_cpu_supports).
bool HaveF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

bool HaveStatsAvx2() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HaveF16c();
  return yes;
}
#endif

// float32 / bf16 / f16 go to the AVX2 kernels where the CPU has them, straight from the
// caller's bytes; other dtypes (and other CPUs) are widened to float32 (float64 kept) a
// block at a time and share the SSE2 kernels.
bool UsesAvx2(DType dtype) {
#if defined(CKPT_STATS_AVX2)
  return (dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16) && HaveStatsAvx2();
#else
  (void)dtype;
  return false;
#endif
}

// Elements per statistics block: the statistics of `count` elements are the partial sums of
// consecutive blocks of this many (the last one shorter), added in order.
std::size_t StatsBlock(DType dtype) {
  if (dtype == DType::kFloat4E2M1FNx2) return 2048;  // two values an element: 4096 decoded
  return UsesAvx2(dtype) ? 16384 : 4096;
}

// The partial sums of one block of 1 <= n <= StatsBlock(dtype) elements at p.
Partial BlockPartial(DType dtype, const unsigned char* p, std::size_t n) {
#if defined(CKPT_STATS_AVX2)
  if (UsesAvx2(dtype)) {
    const internal::BlockSums r = internal::StatsAvx2(dtype, p, n);
    return {r.sum, r.sumsq, r.lo, r.hi};
  }
#endif
  alignas(64) float buf[4096];
  if (dtype == DType::kFloat4E2M1FNx2) {  // the statistics of the values: two per element
    const auto& t = PairTable();
    for (std::size_t i = 0; i < n; ++i) {
      buf[2 * i] = t[2 * p[i]];
      buf[2 * i + 1] = t[2 * p[i] + 1];
    }
    return FloatBlock(buf, 2 * n);
  }
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(buf, p, n * 4);
      break;
    case DType::kFloat64: {
      alignas(64) double tmp[4096];
      std::memcpy(tmp, p, n * 8);
      return DoubleBlock(tmp, n);
    }
    case DType::kBFloat16:
      for (std::size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + i * 2, 2);
        const uint32_t bits = static_cast<uint32_t>(v) << 16;
        std::memcpy(&buf[i], &bits, 4);
      }
      break;
    case DType::kFloat16: {
      const auto& t = Table(dtype);
      for (std::size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, p + i * 2, 2);
        buf[i] = t[v];
      }
      break;
    }
    default: {
      const auto& t = Table(dtype);
      for (std::size_t i = 0; i < n; ++i) buf[i] = t[p[i]];
      break;
    }
  }
  return FloatBlock(buf, n);
}

// Statistics of `count` elements of any floating dtype, block by block.
void AccumulateBlock(DType dtype, const unsigned char* p, std::size_t count, RunningStats& s) {
  const std::size_t block = StatsBlock(dtype), size = DTypeSize(dtype);
  for (std::size_t b = 0; b < count; b += block) {
    const std::size_t n = std::min(block, count - b);
    const unsigned char* q = p + b * size;
    AddPartial(dtype, q, n, BlockPartial(dtype, q, n), s);
  }
}

}  // namespace

struct Digest::State {
  DType dtype;
  bool stats_on;
  XXH3_state_t* xxh = nullptr;
  RunningStats stats;
  unsigned char carry[8];
  std::size_t carried = 0;
  // Block mode (v2): the digests of the blocks completed, and how much of the current one
  // `xxh` has hashed (a block that arrives whole is hashed in one call instead).
  uint64_t block_bytes = 0;
  uint64_t in_block = 0;
  std::vector<uint64_t> blocks;

  void AddElements(const unsigned char* p, std::size_t count) { AccumulateBlock(dtype, p, count, stats); }
  void HashBlocks(const unsigned char* p, std::size_t n);
};

Digest::Digest(DType dtype, bool with_stats, uint64_t block_bytes) : state_(std::make_unique<State>()) {
  state_->dtype = dtype;
  state_->stats_on = with_stats && IsFloating(dtype);
  state_->block_bytes = block_bytes;
  state_->xxh = XXH3_createState();
  XXH3_64bits_reset(state_->xxh);
}

Digest::~Digest() { XXH3_freeState(state_->xxh); }

namespace {

void Xxh3Update(XXH3_state_t* state, const void* data, std::size_t n) {
#if defined(CKPT_XXH3_AVX2)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return internal::Xxh3UpdateAvx2(state, data, n);
#endif
  XXH3_64bits_update(state, data, n);
}

}  // namespace

uint64_t HashBlock(const void* data, std::size_t n) {
#if defined(CKPT_XXH3_AVX2)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return internal::Xxh3Avx2(data, n);
#endif
  return XXH3_64bits(data, n);
}

// Pieces may split blocks: a block begun in one call is finished by the next.
void Digest::State::HashBlocks(const unsigned char* p, std::size_t n) {
  while (n > 0) {
    if (in_block == 0 && n >= block_bytes) {
      blocks.push_back(HashBlock(p, static_cast<std::size_t>(block_bytes)));
      p += block_bytes;
      n -= static_cast<std::size_t>(block_bytes);
      continue;
    }
    if (in_block == 0) XXH3_64bits_reset(xxh);
    const auto take = static_cast<std::size_t>(std::min<uint64_t>(n, block_bytes - in_block));
    Xxh3Update(xxh, p, take);
    p += take;
    n -= take;
    in_block += take;
    if (in_block == block_bytes) {
      blocks.push_back(XXH3_64bits_digest(xxh));
      in_block = 0;
    }
  }
}

void Digest::Update(const void* data, std::size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  if (state_->block_bytes) {
    state_->HashBlocks(p, n);
  } else {
    Xxh3Update(state_->xxh, p, n);
  }
  if (!state_->stats_on) return;
  const std::size_t size = DTypeSize(state_->dtype);
  // Complete an element split across calls.
  while (state_->carried > 0 && n > 0) {
    state_->carry[state_->carried++] = *p++;
    --n;
    if (state_->carried == size) {
      state_->AddElements(state_->carry, 1);
      state_->carried = 0;
    }
  }
  const std::size_t whole = n / size;
  state_->AddElements(p, whole);
  p += whole * size;
  n -= whole * size;
  std::memcpy(state_->carry, p, n);
  state_->carried = n;
}

namespace {

// UpdateParallel's units: a piece is digested at a time (on the caller alone, handed to
// `also` first, while it is in cache); a segment of pieces is one hashing task of the pool.
// Both are powers of two, so whole multiples of every block size up to them and of every
// statistics block (at most 64 KiB): the blocks fall where one Update would put them.
constexpr std::size_t kPieceBytes = std::size_t{256} << 10;
constexpr std::size_t kSegmentBytes = std::size_t{2} << 20;
// What task 0 hands to `also` at a time while the others digest (nothing of it needs to stay
// in cache): writes as large as the best raw write's. Against 256 KiB pieces, gpt2s's save on
// ext4 took a median 1.26 s against 1.88 s (min 0.62 against 0.69 s, CPU 1.24 against 1.75 s)
// in 36 interleaved rounds of each library, on a VM whose host reclaims memory (raw's own
// save: 1.17 and 1.04 s in the same rounds).
constexpr std::size_t kHandOverBytes = std::size_t{8} << 20;

}  // namespace

void Digest::UpdateParallel(const void* data, std::size_t n, const PieceFn& also) {
  State& st = *state_;
  const auto* p = static_cast<const unsigned char*>(data);
  const std::size_t piece = std::max<std::size_t>(kPieceBytes, static_cast<std::size_t>(st.block_bytes));
  const std::size_t segment = std::max(kSegmentBytes, piece);
  if (st.block_bytes == 0 || st.in_block != 0 || st.carried != 0 || n < 2 * segment) {
    // One stream (v1), or mid-block, or too small to share: piece by piece on this thread.
    for (std::size_t pos = 0; pos < n; pos += piece) {
      const std::size_t len = std::min(piece, n - pos);
      if (also) also(p + pos, len, pos);
      Update(p + pos, len);
    }
    return;
  }
  // Each segment's whole blocks hashed and its statistics blocks summed on its own; then
  // both taken in order, as Update would have produced them one after the other.
  struct Sums {
    const unsigned char* at;
    std::size_t elements;
    Partial partial;
  };
  struct Part {
    std::vector<uint64_t> blocks;
    std::vector<Sums> sums;
  };
  const std::size_t size = DTypeSize(st.dtype), stats_block = StatsBlock(st.dtype);
  const auto block = static_cast<std::size_t>(st.block_bytes);
  std::vector<Part> parts((n + segment - 1) / segment);
  // With `also`, task 0 hands every piece over in order on one thread while the others
  // digest: two threads writing one file contend for its inode lock, and the kernel spins
  // on it (a third of a save's CPU when every segment wrote its own pieces).
  const std::size_t first = also ? 1 : 0;
  ParallelFor(parts.size() + first, [&](std::size_t task) {
    if (task < first) {
      const std::size_t span = std::max(kHandOverBytes, piece);
      for (std::size_t pos = 0; pos < n; pos += span) also(p + pos, std::min(span, n - pos), pos);
      return;
    }
    const std::size_t k = task - first;
    const std::size_t begin = k * segment, end = std::min(n, begin + segment);
    Part& part = parts[k];
    part.blocks.reserve((end - begin) / block);
    for (std::size_t pos = begin; pos < end; pos += piece) {
      const std::size_t len = std::min(piece, end - pos);
      const unsigned char* q = p + pos;
      for (std::size_t b = 0; b + block <= len; b += block) part.blocks.push_back(HashBlock(q + b, block));
      if (!st.stats_on) continue;
      const std::size_t elements = len / size;
      for (std::size_t e = 0; e < elements; e += stats_block) {
        const std::size_t m = std::min(stats_block, elements - e);
        part.sums.push_back({q + e * size, m, BlockPartial(st.dtype, q + e * size, m)});
      }
    }
  });
  for (const Part& part : parts) {
    st.blocks.insert(st.blocks.end(), part.blocks.begin(), part.blocks.end());
    for (const Sums& s : part.sums) AddPartial(st.dtype, s.at, s.elements, s.partial, st.stats);
  }
  // The last, partial block stays open in the stream state, and a partial element in the
  // carry, as Update leaves them.
  const std::size_t hashed = n / block * block;
  if (hashed < n) {
    XXH3_64bits_reset(st.xxh);
    Xxh3Update(st.xxh, p + hashed, n - hashed);
    st.in_block = n - hashed;
  }
  if (st.stats_on) {
    st.carried = n % size;
    std::memcpy(st.carry, p + n - st.carried, st.carried);
  }
}

bool Digest::CanAdoptBlocks() const {
  return state_->block_bytes != 0 && state_->in_block == 0 && !state_->stats_on;
}

void Digest::AdoptBlocks(const uint64_t* digests, std::size_t count) {
  if (!CanAdoptBlocks()) throw Error(ErrorCode::kInternal, "Digest::AdoptBlocks: not at a block boundary");
  state_->blocks.insert(state_->blocks.end(), digests, digests + count);
}

std::string FormatChecksum(uint64_t hash) { return format::ChecksumText(hash); }

std::string Digest::Checksum() const {
  if (state_->block_bytes) return ChecksumOfBlocks(BlockDigests());
  return FormatChecksum(XXH3_64bits_digest(state_->xxh));
}

uint64_t Digest::block_bytes() const { return state_->block_bytes; }

std::vector<uint64_t> Digest::BlockDigests() const {
  std::vector<uint64_t> out = state_->blocks;
  if (state_->in_block > 0) out.push_back(XXH3_64bits_digest(state_->xxh));
  return out;
}

std::string Digest::Blocks() const { return BlocksHex(BlockDigests()); }

std::string ChecksumOfBlocks(const std::vector<uint64_t>& digests) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  unsigned char le[8];
  for (uint64_t d : digests) {
    for (int b = 0; b < 8; ++b) le[b] = static_cast<unsigned char>(d >> (8 * b));
    XXH3_64bits_update(st, le, 8);
  }
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return FormatChecksum(h);
}

uint64_t BlockDigestAt(std::string_view hex, std::size_t i) {
  uint64_t v = 0;
  for (std::size_t k = 0; k < 16; ++k) {
    const char c = hex[i * 16 + k];
    v = (v << 4) | static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
  }
  return v;
}

std::string ChecksumOfBlocks(std::string_view hex) {
  std::vector<uint64_t> digests(hex.size() / 16);
  for (std::size_t i = 0; i < digests.size(); ++i) digests[i] = BlockDigestAt(hex, i);
  return ChecksumOfBlocks(digests);
}

Error BlockMismatch(std::string_view what, uint64_t i, uint64_t block_bytes, uint64_t n, uint64_t want, uint64_t got) {
  return Error(ErrorCode::kCorrupt, std::string(what) + " block " + std::to_string(i) + " (bytes " +
                                        std::to_string(i * block_bytes) + ".." +
                                        std::to_string(std::min(n, (i + 1) * block_bytes)) +
                                        "): checksum mismatch: index says " + FormatChecksum(want) +
                                        ", the data hashes to " + FormatChecksum(got));
}

void CheckDigest(const Digest& got, const ChunkMeta& expected, uint64_t n, std::string_view what) {
  if (expected.block_bytes) {
    const std::vector<uint64_t> blocks = got.BlockDigests();
    if (expected.blocks.size() != blocks.size() * 16) {
      throw Error(ErrorCode::kCorrupt, std::string(what) + ": " + std::to_string(n) + " bytes make " +
                                           std::to_string(blocks.size()) + " blocks, the index lists " +
                                           std::to_string(expected.blocks.size() / 16));
    }
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const uint64_t want = BlockDigestAt(expected.blocks, i);
      if (blocks[i] != want) throw BlockMismatch(what, i, expected.block_bytes, n, want, blocks[i]);
    }
  }
  const std::string sum = got.Checksum();
  if (sum != expected.checksum) {
    throw Error(ErrorCode::kCorrupt, std::string(what) + ": checksum mismatch: " +
                                         (expected.block_bytes ? "index says " : "metadata says ") +
                                         expected.checksum + ", the data hashes to " + sum);
  }
}

std::string BlocksHex(const std::vector<uint64_t>& digests) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(digests.size() * 16, '0');
  for (std::size_t i = 0; i < digests.size(); ++i)
    for (std::size_t k = 0; k < 16; ++k) out[i * 16 + k] = kHex[(digests[i] >> (60 - 4 * k)) & 0xf];
  return out;
}

std::optional<ChunkStats> Digest::Stats() const {
  if (!state_->stats_on) return std::nullopt;
  const auto& s = state_->stats;
  ChunkStats out;
  out.nan_count = s.nan;
  out.inf_count = s.inf;
  out.finite_count = s.finite;
  if (s.finite > 0) {
    out.min = s.min;
    out.max = s.max;
    out.mean = s.sum / static_cast<double>(s.finite);
    out.l2 = std::sqrt(s.sumsq);
  } else {
    out.min = out.max = out.mean = std::numeric_limits<double>::quiet_NaN();
    out.l2 = 0;
  }
  return out;
}

std::string ChecksumOf(const void* data, std::size_t n) {
  Digest d(DType::kUInt8, false);
  d.Update(data, n);
  return d.Checksum();
}

}  // namespace ckpt::storage

// ---- The public digest API (ckpt/digest.h) ---------------------------------------------
namespace ckpt {

struct ChunkDigest::Impl {
  Impl(DType dtype, bool with_stats, uint64_t block_bytes) : digest(dtype, with_stats, block_bytes) {}
  storage::Digest digest;
};

ChunkDigest::ChunkDigest(DType dtype, bool with_stats, uint64_t block_bytes) {
  if (block_bytes != 0 &&
      (block_bytes < kMinBlockBytes || block_bytes > kMaxBlockBytes || (block_bytes & (block_bytes - 1)) != 0)) {
    throw Error(ErrorCode::kInvalidArgument, "ChunkDigest: block size " + std::to_string(block_bytes) +
                                                 " is not a power of two in [4 KiB, 64 MiB]");
  }
  impl_ = std::make_unique<Impl>(dtype, with_stats, block_bytes);
}
ChunkDigest::~ChunkDigest() = default;
ChunkDigest::ChunkDigest(ChunkDigest&&) noexcept = default;
ChunkDigest& ChunkDigest::operator=(ChunkDigest&&) noexcept = default;

void ChunkDigest::Update(const void* data, std::size_t n) { impl_->digest.Update(data, n); }
std::string ChunkDigest::Checksum() const { return impl_->digest.Checksum(); }
std::optional<ChunkStats> ChunkDigest::Stats() const { return impl_->digest.Stats(); }
std::vector<uint64_t> ChunkDigest::BlockDigests() const { return impl_->digest.BlockDigests(); }
std::string ChunkDigest::Blocks() const { return impl_->digest.Blocks(); }
uint64_t ChunkDigest::block_bytes() const { return impl_->digest.block_bytes(); }
void ChunkDigest::Check(const ChunkMeta& expected, uint64_t n, std::string_view what) const {
  storage::CheckDigest(impl_->digest, expected, n, what);
}

uint64_t HashBlock(const void* data, std::size_t n) { return storage::HashBlock(data, n); }
std::string FormatChecksum(uint64_t hash) { return format::ChecksumText(hash); }
std::string ChecksumOfBlocks(std::string_view blocks_hex) {
  if (blocks_hex.size() % 16 != 0 || !format::IsLowerHex(blocks_hex)) {
    throw Error(ErrorCode::kCorrupt, "ChecksumOfBlocks: \"blocks\" is not 16 lowercase hex digits per block (" +
                                         std::to_string(blocks_hex.size()) + " characters)");
  }
  return storage::ChecksumOfBlocks(blocks_hex);
}

}  // namespace ckpt
