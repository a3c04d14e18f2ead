// tools/cli.h: what every ckpt command-line tool shares: the common flags (--json, -q,
// --max-memory, --version), size and dtype parsing, and the one boundary where
// exceptions become messages and exit codes (0 ok / same, 1 problem / differ,
// 2 usage or I/O error, 3 the input checkpoint changed while it was read).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ckpt/dtype.h"
#include "ckpt/metadata.h"

namespace ckpt::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitProblem = 1;
inline constexpr int kExitError = 2;
inline constexpr int kExitChanged = 3;  // replaced or removed by another process meanwhile: no damage, run again

struct Common {
  bool json = false;
  bool quiet = false;
  std::string max_memory = "1GiB";
};

// Adds --json, -q/--quiet, --version (and --max-memory when `memory`) to `app`.
void AddCommon(CLI::App& app, Common& common, const std::string& tool, bool memory);

// "1GiB", "512MiB", "256M", "1000000" -> bytes; throws CLI::ValidationError.
uint64_t ParseSize(const std::string& text);
// --max-shard-size as transformers' save_pretrained reads it (convert_file_size_to_int):
// "5GB" = 5e9, "500MB", "100KB" decimal; "5GiB", "500MiB", "100KiB" binary; a plain integer
// is bytes; a unit ending in a lower-case "b" ("5Gb") is bits. Throws CLI::ValidationError.
uint64_t ParseShardSize(const std::string& text);
// "bfloat16"/"bf16", "float16"/"fp16"/"half", "float32"/"fp32", "float64"/"fp64".
DType ParseDType(const std::string& text);
// "none", "zstd", "zstd:LEVEL".
Compression ParseCompression(const std::string& text);

// Parses argv into `app` and runs `body`, mapping every failure to an exit code and a
// message on stderr; with --json the error is also one JSON document on stdout.
// `corrupt_exit` is the exit code for input found corrupt (kCorrupt, kMismatch).
int Run(CLI::App& app, const Common& common, int argc, char** argv, const std::function<int()>& body,
        int corrupt_exit = kExitProblem);

// The tools, callable from their own binaries and from the `ckpt` multiplexer.
int InspectMain(int argc, char** argv);
int VerifyMain(int argc, char** argv);
int MergeMain(int argc, char** argv);
int DiffMain(int argc, char** argv);
int ConvertMain(int argc, char** argv);

}  // namespace ckpt::tools
