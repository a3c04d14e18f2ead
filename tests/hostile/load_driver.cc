// tests/hostile/load_driver.cc: the library's readers over one checkpoint directory, for
// hostile.py. CheckpointReader::Open, then ReadRegion and ReadChunk of every tensor and
// ReadBytes of every bytes entry (errors there are expected and ignored), then a
// non-strict ckpt::Load of everything the metadata lists (fuzz/fuzz_checkpoint.h).
//
//   hostile_load DIR   exit 0: loaded; 1: a ckpt::Error (printed); anything else is a bug
//   hostile_load --write-packed DIR   saves the base of the pack cases (FORMAT.md §5.7): small
//                      float32 tensors p0 [6], p1 [10], p2 [3, 4] packed together in one
//                      shard, and big [20000] (a dataset of its own)
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "ckpt/ckpt.h"
#include "fuzz/fuzz_checkpoint.h"

namespace {

int WritePacked(const char* dir) {
  std::vector<float> p0(6, 1.0f), p1(10, 2.0f), p2(12, 3.0f), big(20000, 4.0f);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  ckpt::StateDict sd;
  sd.Add("p0", ckpt::Tensor::Full(ckpt::DType::kFloat32, {6}, p0.data()));
  sd.Add("p1", ckpt::Tensor::Full(ckpt::DType::kFloat32, {10}, p1.data()));
  sd.Add("p2", ckpt::Tensor::Full(ckpt::DType::kFloat32, {3, 4}, p2.data()));
  sd.Add("big", ckpt::Tensor::Full(ckpt::DType::kFloat32, {20000}, big.data()));
  ckpt::SingleComm comm;
  ckpt::Save(dir, sd, comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--write-packed") == 0) return WritePacked(argv[2]);
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
