// ckpt/ops/verify.h: the CI gate behind ckpt-verify. Checks a checkpoint directory (or a
// lone shard, a safetensors file) and reports every problem found, each naming its file and
// key. A checkpoint is checked by libckpt (ckpt/verify.h: VerifyCheckpoint), plus the schema
// and --expect checks:
//   metadata   metadata.json parses, its digest matches (v2), and it validates against
//              schemas/metadata.schema.json
//   files      every listed file exists, is a regular file of the recorded size, is HDF5
//   index      (v2) every shard index hashes to the digest metadata.json records and holds
//              exactly the chunks the layouts place in its file
//   tiling     every tensor's chunks tile its shape: no gap, overlap or out-of-bounds chunk
//   datasets   every chunk's dataset exists with the dtype and extent the metadata says, and
//              (v2) its HDF5 header agrees with the index on where its data lies
//   checksums  every chunk's checksum and (v2) block digests recomputed from the data
//              (skipped with `quick`)
//   finite     no NaN/Inf in floating tensors (with `check_finite`)
//   expect     key set, dtypes and shapes equal those of a reference (with `expect`)
//
// Thread-safety: Verify is reentrant; it reads data on threads of its own (`threads` at
// most) and validates the schema on another.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/export.h"
#include "ckpt/verify.h"

namespace ckpt::ops {

struct VerifyOptions {
  bool quick = false;         // metadata, files, tiling and datasets only; no data read
  bool check_finite = false;  // fail on NaN / Inf in floating tensors
  // Another checkpoint, shard or safetensors file, or the JSON that `ckpt-inspect --json` wrote.
  std::optional<std::filesystem::path> expect;
  // Overrides the schema compiled into the library.
  std::optional<std::filesystem::path> schema;
  int threads = 4;            // data-reading threads, at most (never more than the cores)
  bool progress = false;
  // Format v2: the shard indexes are read and checked a group of files at a time, each
  // group holding about this many chunks (a file with more is a group of its own), so
  // memory is bounded by a group, not by the checkpoint.
  int64_t group_chunks = int64_t{1} << 15;
};

// The report: libckpt's (ckpt/verify.h), with the problems of the checks above that only the
// tools make ("metadata" for the schema, "expect").
using ckpt::VerifyProblem;
using ckpt::VerifyReport;

// Problems in the checkpoint are reported, not thrown. Throws (kNotFound, kIO) only when
// `path` itself or the `expect` reference cannot be read.
CKPT_API VerifyReport Verify(const std::filesystem::path& path, const VerifyOptions& options);

CKPT_API std::string RenderVerifyText(const VerifyReport& report);
CKPT_API std::string RenderVerifyJson(const VerifyReport& report);
CKPT_API std::string RenderVerifyJUnit(const VerifyReport& report);

}  // namespace ckpt::ops
