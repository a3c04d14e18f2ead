// ckpt/ops/inspect.h: what ckpt-inspect shows, as data: a summary of a checkpoint, a
// shard or a safetensors file, one row per key, optional statistics; rendered as a text
// table (flat or as a tree of dotted prefixes) or as one JSON document.
//
// Thread-safety: Inspect is reentrant.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/metadata.h"

namespace ckpt::ops {

struct InspectOptions {
  std::vector<std::string> keys;  // glob filters; empty = all keys
  bool stats = false;             // recorded statistics, recomputed by streaming where missing
  uint64_t max_memory = uint64_t{1} << 30;
  bool progress = false;          // a progress line on stderr when it is a terminal
};

struct TensorStats {
  double min = 0, max = 0, mean = 0, std = 0;
  int64_t nan_count = 0, inf_count = 0, finite_count = 0;
  bool recomputed = false;  // streamed from the data, not read from the metadata
};

struct KeyInfo {
  std::string key;
  EntryKind kind = EntryKind::kTensor;
  std::string dtype;      // tensor, scalar
  Shape shape;            // tensor
  std::size_t num_chunks = 0;
  uint64_t bytes = 0;         // logical bytes (tensor, bytes entry)
  uint64_t stored_bytes = 0;  // on disk
  std::string layout;     // "full", "replicated", "sharded dim 0 / 4", "irregular"; "-" for non-tensors
  std::string value;      // scalar and json: the value as JSON text
  std::optional<TensorStats> stats;
  // Bytes entry: its content is a pickle (protocol 2-5) or torch.save's zip of one (what
  // DCP stores for non-tensor values): unpickling it can run code (ckpt.torch refuses
  // pickles of types outside torch.load(weights_only=True)'s unless allow_pickle=True).
  bool pickle = false;
};

struct FileInfo {
  std::string name;
  int rank = 0;
  uint64_t bytes = 0;           // as recorded
  std::optional<uint64_t> actual_bytes;  // as found on disk; nullopt if missing, or not looked at (s3://)
  std::string problem;          // "missing", "size 10 bytes, metadata says 20", ...
};

struct InspectReport {
  std::string path;
  std::string kind;  // SourceKindName
  int format_version = 0;
  std::string state_dict_type;
  int world_size = 1;
  std::string library_version, created, user;  // user: JSON text
  std::optional<SaveTimings> save_timings;     // how long the save took (FORMAT.md §3.8)
  std::vector<FileInfo> files;
  std::vector<KeyInfo> keys;  // after filtering
  std::size_t total_keys = 0;
  uint64_t tensor_bytes = 0, stored_bytes = 0;  // over the listed keys
  bool compressed = false;
  std::vector<std::string> problems;  // missing or unreadable files, unreadable statistics
};

// Throws kNotFound / kIO / kCorrupt / kUnsupported when the path cannot be read at all;
// missing shard files are reported in `files` and `problems`, not thrown.
CKPT_API InspectReport Inspect(const std::filesystem::path& path, const InspectOptions& options);

// How a tensor's chunks lay it out: "full" (one chunk), "sharded dim D / N" (N chunks
// that split only dimension D), or "irregular".
CKPT_API std::string DescribeLayout(const EntryMeta& entry, int world_size);

CKPT_API std::string RenderInspectText(const InspectReport& report, bool tree, bool stats);
CKPT_API std::string RenderInspectJson(const InspectReport& report);

}  // namespace ckpt::ops
