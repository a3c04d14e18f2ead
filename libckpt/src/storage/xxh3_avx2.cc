// storage/xxh3_avx2.cc: XXH3's update loop compiled for AVX2 (this file alone is built
// with -mavx2), which digest.cc calls instead of its SSE2 build when the CPU has AVX2:
// about twice the speed, the same hash. Both builds share XXH3's state layout, so a
// state may be updated here and finished there.
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

#include "storage/xxh3_dispatch.h"

namespace ckpt::storage::internal {

void Xxh3UpdateAvx2(void* state, const void* data, std::size_t n) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, n);
}

uint64_t Xxh3Avx2(const void* data, std::size_t n) { return XXH3_64bits(data, n); }

}  // namespace ckpt::storage::internal
