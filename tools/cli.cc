// tools/cli.cc: see cli.h.
#include "cli.h"

#include <cctype>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ckpt/config.h"
#include "ckpt/error.h"

namespace ckpt::tools {

void AddCommon(CLI::App& app, Common& common, const std::string& tool, bool memory) {
  app.set_version_flag("--version", tool + " (ckpt) " + CKPT_VERSION_STRING);
  app.add_flag("--json", common.json, "Print one JSON document on stdout instead of text");
  app.add_flag("-q,--quiet", common.quiet, "Print nothing on success; the exit code tells");
  if (memory)
    app.add_option("--max-memory", common.max_memory, "Memory bound for tensor data (e.g. 512MiB)")
        ->capture_default_str();
}

uint64_t ParseSize(const std::string& text) {
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw CLI::ValidationError("--max-memory", "not a size: '" + text + "'");
  }
  std::string unit = text.substr(pos);
  for (auto& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double mult = 1;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "k" || unit == "kib" || unit == "kb") mult = 1024.0;
  else if (unit == "m" || unit == "mib" || unit == "mb") mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib" || unit == "gb") mult = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib" || unit == "tb") mult = 1024.0 * 1024 * 1024 * 1024;
  else throw CLI::ValidationError("--max-memory", "unknown unit in '" + text + "'");
  if (v <= 0) throw CLI::ValidationError("--max-memory", "must be positive: '" + text + "'");
  return static_cast<uint64_t>(v * mult);
}

uint64_t ParseShardSize(const std::string& text) {
  auto bad = [&] { return CLI::ValidationError("--max-shard-size", "not a size: '" + text + "' (e.g. 5GB, 500MB, 1000000)"); };
  std::size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 18) throw bad();
  const uint64_t n = std::stoull(text.substr(0, digits));
  std::string unit = text.substr(digits);
  const bool bits = !unit.empty() && unit.back() == 'b' && unit.size() >= 2;
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  struct Unit {
    const char* name;
    uint64_t mult;
  };
  constexpr Unit kUnits[] = {{"", 1},
                             {"KIB", uint64_t{1} << 10}, {"MIB", uint64_t{1} << 20},
                             {"GIB", uint64_t{1} << 30}, {"TIB", uint64_t{1} << 40},
                             {"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
                             {"TB", uint64_t{1000} * 1000 * 1000 * 1000}};
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    if (n == 0) throw CLI::ValidationError("--max-shard-size", "must be positive: '" + text + "'");
    if (n > UINT64_MAX / u.mult) throw bad();
    const uint64_t bytes = n * u.mult;
    return bits && unit.find('I') == std::string::npos ? bytes / 8 : bytes;
  }
  throw bad();
}

DType ParseDType(const std::string& text) {
  if (auto d = DTypeFromName(text)) return *d;
  if (text == "bf16") return DType::kBFloat16;
  if (text == "fp16" || text == "half" || text == "f16") return DType::kFloat16;
  if (text == "fp32" || text == "float" || text == "f32") return DType::kFloat32;
  if (text == "fp64" || text == "double" || text == "f64") return DType::kFloat64;
  throw CLI::ValidationError("--dtype", "unknown dtype '" + text + "'");
}

Compression ParseCompression(const std::string& text) {
  Compression c;
  if (text == "none") return c;
  if (text.rfind("zstd", 0) != 0) throw CLI::ValidationError("--compress", "expected zstd[:LEVEL], got '" + text + "'");
  c.codec = Compression::Codec::kZstd;
  if (text.size() > 4) {
    if (text[4] != ':') throw CLI::ValidationError("--compress", "expected zstd[:LEVEL], got '" + text + "'");
    try {
      c.level = std::stoi(text.substr(5));
    } catch (const std::exception&) {
      throw CLI::ValidationError("--compress", "bad zstd level in '" + text + "'");
    }
    if (c.level < 1 || c.level > 22) throw CLI::ValidationError("--compress", "zstd level must be 1..22");
  }
  return c;
}

namespace {

int Fail(const Common& common, const std::string& tool, const std::string& code, const std::string& message,
         int exit_code) {
  std::cerr << tool << ": error: " << message << "\n";
  if (common.json) {
    nlohmann::ordered_json j;
    j["ok"] = false;
    j["error"] = {{"code", code}, {"message", message}, {"exit_code", exit_code}};
    std::cout << j.dump(2) << "\n";
  }
  return exit_code;
}

}  // namespace

int Run(CLI::App& app, const Common& common, int argc, char** argv, const std::function<int()>& body,
        int corrupt_exit) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    app.exit(e);
    return kExitError;
  }
  const std::string tool = app.get_name();
  try {
    return body();
  } catch (const CLI::ParseError& e) {  // validation inside the body (sizes, dtypes)
    return Fail(common, tool, "usage", e.what(), kExitError);
  } catch (const Error& e) {
    // Input found bad (corrupt, contradictory, of an unknown dtype or newer version) is a
    // problem found; anything else (missing files, I/O, usage) an error.
    // A checkpoint replaced while it was read is neither: the caller may read it again.
    const bool corrupt = e.code() == ErrorCode::kCorrupt || e.code() == ErrorCode::kMismatch ||
                         e.code() == ErrorCode::kUnsupported;
    const int exit_code = e.code() == ErrorCode::kChanged ? kExitChanged : corrupt ? corrupt_exit : kExitError;
    return Fail(common, tool, std::string(ErrorCodeName(e.code())), e.what(), exit_code);
  } catch (const std::exception& e) {
    return Fail(common, tool, "internal", e.what(), kExitError);
  }
}

}  // namespace ckpt::tools
