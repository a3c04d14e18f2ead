// tools/ckpt.cc: the `ckpt` multiplexer: `ckpt inspect ...` runs ckpt-inspect.
#include <cstring>
#include <iostream>
#include <string>

#include "ckpt/config.h"
#include "cli.h"

namespace {

struct Tool {
  const char* name;
  int (*main)(int, char**);
  const char* what;
};

constexpr Tool kTools[] = {
    {"inspect", ckpt::tools::InspectMain, "keys, dtypes, shapes, sharding and statistics"},
    {"verify", ckpt::tools::VerifyMain, "check metadata, files, tiling and checksums (the CI gate)"},
    {"merge", ckpt::tools::MergeMain, "merge into one FULL file, or reshard for another world size"},
    {"diff", ckpt::tools::DiffMain, "compare two checkpoints' logical tensors"},
    {"convert", ckpt::tools::ConvertMain, "safetensors in and out"},
};

void Usage(std::ostream& out) {
  out << "usage: ckpt <tool> [args...]   (or ckpt-<tool> [args...])\n\ntools:\n";
  for (const auto& t : kTools) out << "  " << t.name << std::string(10 - std::strlen(t.name), ' ') << t.what << "\n";
  out << "\n`ckpt <tool> --help` describes each tool's flags.\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    Usage(argc < 2 ? std::cerr : std::cout);
    return argc < 2 ? ckpt::tools::kExitError : ckpt::tools::kExitOk;
  }
  if (!std::strcmp(argv[1], "--version")) {
    std::cout << "ckpt " << CKPT_VERSION_STRING << "\n";
    return 0;
  }
  for (const auto& t : kTools) {
    if (std::strcmp(argv[1], t.name) != 0) continue;
    std::string name = std::string("ckpt-") + t.name;
    argv[1] = name.data();  // the tool sees itself as ckpt-<tool>
    return t.main(argc - 1, argv + 1);
  }
  std::cerr << "ckpt: unknown tool '" << argv[1] << "'\n";
  Usage(std::cerr);
  return ckpt::tools::kExitError;
}
