// storage/xxh3_dispatch.h: the AVX2 build of XXH3's update loop (xxh3_avx2.cc), present
// when CKPT_XXH3_AVX2 is defined; digest.cc chooses it at run time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ckpt::storage::internal {

// `state` is an XXH3_state_t*.
void Xxh3UpdateAvx2(void* state, const void* data, std::size_t n);
// One-shot XXH3_64bits.
uint64_t Xxh3Avx2(const void* data, std::size_t n);

}  // namespace ckpt::storage::internal
