// tests/hostile/load_driver.cc: the library's readers over one checkpoint directory, for
// hostile.py. CheckpointReader::Open, then ReadRegion and ReadChunk of every tensor and
// ReadBytes of every bytes entry (errors there are expected and ignored), then a
// non-strict ckpt::Load of everything the metadata lists (fuzz/fuzz_checkpoint.h).
//
//   hostile_load DIR   exit 0: loaded; 1: a ckpt::Error (printed); anything else is a bug
#include <cstdio>
#include <memory>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "fuzz/fuzz_checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CHECKPOINT_DIR\n", argv[0]);
    return 2;
  }
  try {
    const auto reader = ckpt::CheckpointReader::Open(argv[1]);
    ckpt_fuzz::ReadEverything(*reader);
    ckpt_fuzz::LoadEverything(argv[1], reader->metadata());
  } catch (const ckpt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
