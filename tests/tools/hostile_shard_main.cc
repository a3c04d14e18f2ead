// tests/tools/hostile_shard_main.cc: hostile_shard SHARD DATASET KIND OUTSIDE (see
// hostile_shard.h), for the command-line tests.
#include <cstdio>
#include <exception>

#include "hostile_shard.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: hostile_shard SHARD DATASET lz4|extlink|softlink|vds|external OUTSIDE\n");
    return 2;
  }
  try {
    ckpt::testing::MakeHostileDataset(argv[1], argv[2], argv[3], argv[4]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
