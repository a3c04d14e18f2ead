// tests/fuzz/fuzz_util.h: what the fuzz targets share. Each target defines
// LLVMFuzzerTestOneInput; it is linked either with libFuzzer (the fuzz_<target> binaries,
// clang, CKPT_BUILD_FUZZERS) or with replay_main.cc (fuzz_replay_<target>, every build),
// which runs each file of the target's corpus once.
//
// Threading: libFuzzer calls a target from one thread; so does the replay driver.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ckpt_fuzz {

// Inputs that claim more than this many bytes of tensor data are skipped, not read: the
// fuzzers look for crashes, not for the allocator's limits.
inline constexpr uint64_t kMaxReadBytes = uint64_t{4} << 20;

// A property of the code under test does not hold: report it and abort, which libFuzzer
// and the replay driver both treat as a failure.
[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ckpt_fuzz
