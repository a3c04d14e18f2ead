// ops/inspect.cc: see ckpt/ops/inspect.h.
#include "ckpt/ops/inspect.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/ops/source.h"
#include "ops/elements.h"
#include "ops/table.h"
#include "ops/util.h"

namespace ckpt::ops {
namespace {

using detail::FormatBytes;
using detail::FormatDouble;
using detail::FormatShape;
using nlohmann::ordered_json;

std::optional<TensorStats> RecordedStats(const EntryMeta& e) {
  detail::StatsAccumulator acc;
  if (e.chunks.empty()) {  // v2 metadata.json alone: the aggregate it records
    if (!e.stats) return std::nullopt;
    acc.Merge(*e.stats);
  }
  for (const auto& c : e.chunks) {
    if (!c.stats) return std::nullopt;
    acc.Merge(*c.stats);
  }
  TensorStats s{acc.min, acc.max, acc.mean(), acc.stddev(), acc.nan, acc.inf, acc.finite, false};
  return s;
}

TensorStats StreamStats(Source& src, const std::string& key, const EntryMeta& e, uint64_t budget,
                        detail::Progress& progress) {
  detail::StatsAccumulator acc;
  const std::size_t item = DTypeSize(e.dtype);
  detail::Buffer buf;
  for (const Box& block : SplitBox(Box::Full(e.shape), item, budget)) {
    const auto n = static_cast<std::size_t>(block.NumElements());
    uint8_t* p = buf.Get(std::max<std::size_t>(n * item, 8));
    if (n) src.ReadRegion(key, block, p);
    acc.Add(e.dtype, p, n);
    progress.Add(n * item);
  }
  return TensorStats{acc.min, acc.max, acc.mean(), acc.stddev(), acc.nan, acc.inf, acc.finite, true};
}

// Whether `box` is the whole of `shape` (Box::Full without building one).
bool CoversWhole(const Box& box, const Shape& shape) {
  if (box.offsets.size() != shape.size() || box.sizes != shape) return false;
  for (int64_t o : box.offsets)
    if (o != 0) return false;
  return true;
}

}  // namespace

namespace {

// The same words from a v2 layout rule, without its chunk list.
std::string DescribeRule(const EntryMeta& e, int world_size) {
  const TensorLayout& l = e.layout;
  const int64_t n = e.ChunkCount();
  if (l.kind == TensorLayout::Kind::kChunks) {
    if (n == 1 && CoversWhole(l.pieces[0].box, e.shape)) return world_size > 1 ? "replicated" : "full";
    return "irregular (" + std::to_string(n) + " chunks)";
  }
  std::vector<std::size_t> split;
  for (std::size_t d = 0; d < l.grid.size(); ++d)
    if (l.grid[d].sizes.size() > 1 || (l.grid[d].sizes.empty() && l.grid[d].step > 0 && l.grid[d].step < e.shape[d]))
      split.push_back(d);
  if (split.empty()) return world_size > 1 ? "replicated" : "full";
  if (split.size() == 1) return "sharded dim " + std::to_string(split[0]) + " / " + std::to_string(n);
  std::string g = "grid ";
  for (std::size_t d = 0; d < l.grid.size(); ++d) {
    int64_t parts = 1;
    if (!l.grid[d].sizes.empty()) parts = static_cast<int64_t>(l.grid[d].sizes.size());
    else if (l.grid[d].step > 0) parts = (e.shape[d] + l.grid[d].step - 1) / l.grid[d].step;
    g += (d ? "x" : "") + std::to_string(parts);
  }
  return g;
}

}  // namespace

namespace {

// A pickle (the PROTO opcode 0x80 and a protocol of 2 to 5, as torch.save's legacy format
// starts too), or torch.save's zip, whose first member is its pickle (".../data.pkl").
bool IsPickle(const std::vector<uint8_t>& b) {
  if (b.size() >= 2 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) return true;
  constexpr std::size_t kNameAt = 30;  // a zip local file header's name (its length at 26)
  if (b.size() < kNameAt || b[0] != 'P' || b[1] != 'K' || b[2] != 3 || b[3] != 4) return false;
  const std::size_t n = static_cast<std::size_t>(b[26]) | static_cast<std::size_t>(b[27]) << 8;
  if (b.size() < kNameAt + n) return false;
  return std::string_view(reinterpret_cast<const char*>(b.data()) + kNameAt, n).ends_with("data.pkl");
}

}  // namespace

std::string DescribeLayout(const EntryMeta& e, int world_size) {
  if (e.chunks.empty() && (e.layout.kind == TensorLayout::Kind::kGrid || !e.layout.pieces.empty()))
    return DescribeRule(e, world_size);
  if (e.chunks.size() == 1 && CoversWhole(e.chunks[0].box, e.shape))
    return world_size > 1 ? "replicated" : "full";
  if (e.chunks.empty()) return "empty";
  // Sharded along one dimension d: every chunk spans the whole of every other dimension.
  const std::size_t rank = e.shape.size();
  for (std::size_t d = 0; d < rank; ++d) {
    bool only_d = true;
    for (const auto& c : e.chunks) {
      for (std::size_t o = 0; o < rank && only_d; ++o)
        if (o != d && (c.box.offsets[o] != 0 || c.box.sizes[o] != e.shape[o])) only_d = false;
      if (!only_d) break;
    }
    if (only_d) return "sharded dim " + std::to_string(d) + " / " + std::to_string(e.chunks.size());
  }
  return "irregular (" + std::to_string(e.chunks.size()) + " chunks)";
}

namespace {

// Each file of the source: present, a regular file, of its recorded size (a checkpoint's);
// returns which files can be read, by name.
std::map<std::string, bool> InspectFiles(Source& src, const std::filesystem::path& path, InspectReport& r) {
  const Metadata& md = src.metadata();
  // The directory the files are in: the checkpoint's, or a Hub model directory given as such.
  std::error_code ec;
  const std::filesystem::path dir =
      src.kind() == SourceKind::kCheckpoint || std::filesystem::is_directory(path, ec) ? path : path.parent_path();
  // safetensors files are followed through symlinks (as the Hub's cache links them), as read.
  const bool follow = src.kind() == SourceKind::kSafetensors;
  std::map<std::string, bool> file_ok;
  // On object storage only metadata.json is read: the objects' sizes are checked by
  // ckpt-verify (a HEAD each), not here.
  const bool object = IsObjectUrl(path);
  for (const auto& f : md.files) {
    FileInfo fi{f.name, f.rank, f.bytes, std::nullopt, ""};
    if (object) {
      file_ok[f.name] = true;
      r.files.push_back(std::move(fi));
      continue;
    }
    struct stat st;
    const std::filesystem::path pinned = src.PinnedFile(f.name);  // the checkpoint read, not what is at its path now
    const std::filesystem::path p = pinned.empty() ? dir / f.name : pinned;
    if ((follow ? ::stat(p.c_str(), &st) : ::lstat(p.c_str(), &st)) != 0) {
      fi.problem = "missing";
    } else if (!S_ISREG(st.st_mode)) {
      fi.problem = "not a regular file";
    } else {
      fi.actual_bytes = static_cast<uint64_t>(st.st_size);
      if (*fi.actual_bytes != f.bytes && src.kind() == SourceKind::kCheckpoint)
        fi.problem = "size " + std::to_string(*fi.actual_bytes) + " bytes, metadata says " +
                     std::to_string(f.bytes);
    }
    if (!fi.problem.empty()) r.problems.push_back(f.name + ": " + fi.problem);
    file_ok[f.name] = fi.problem.empty();
    r.files.push_back(std::move(fi));
  }
  return file_ok;
}

// What the report says of entry `key` from the metadata (no data read); r.compressed is set
// when one of its chunks is compressed.
KeyInfo DescribeKey(const Source& src, const std::string& key, const EntryMeta& e, const InspectOptions& options,
                    InspectReport& r) {
  KeyInfo k;
  k.key = key;
  k.kind = e.kind;
  switch (e.kind) {
    case EntryKind::kTensor:
      k.dtype = std::string(DTypeName(e.dtype));
      k.shape = e.shape;
      k.num_chunks = e.chunks.empty() ? static_cast<std::size_t>(e.ChunkCount()) : e.chunks.size();
      k.bytes = e.TensorBytes();
      for (const auto& c : e.chunks) {
        k.stored_bytes += c.stored_bytes;
        if (c.compression.codec != Compression::Codec::kNone) r.compressed = true;
      }
      if (e.chunks.empty()) {  // v2, metadata.json alone
        k.stored_bytes = e.stored_bytes;
        r.compressed = r.compressed || e.compression.codec != Compression::Codec::kNone;
      }
      if (src.HoldsWhole(key)) {
        k.layout = DescribeLayout(e, src.metadata().world_size);
      } else {
        k.layout = "part:";
        for (const auto& c : e.chunks) k.layout += " " + c.box.ToString();
      }
      if (options.stats && IsFloating(e.dtype)) k.stats = RecordedStats(e);
      break;
    case EntryKind::kScalar:
      k.dtype = std::string(DTypeName(e.dtype));
      k.value = e.value;
      k.layout = "-";
      break;
    case EntryKind::kBytes:
      k.bytes = e.size;
      k.num_chunks = e.chunks.size();
      for (const auto& c : e.chunks) k.stored_bytes += c.stored_bytes;
      if (e.chunks.empty()) k.stored_bytes = e.stored_bytes;
      k.layout = "-";
      break;
    case EntryKind::kJson:
      k.value = e.value;
      k.layout = "-";
      break;
  }
  return k;
}

// Whether every file that holds a chunk of `e` can be read (every file, when its chunks are
// not listed in the metadata).
bool Readable(const EntryMeta& e, std::map<std::string, bool>& file_ok) {
  bool readable = true;
  for (const auto& c : e.chunks) readable = readable && file_ok[c.file];
  if (e.chunks.empty())
    for (const auto& [name, ok] : file_ok) readable = readable && ok;
  return readable;
}

// Which bytes entries hold pickles: their content is read (bytes entries are values, small).
void MarkPickles(Source& src, std::map<std::string, bool>& file_ok, InspectReport& r) {
  for (auto& k : r.keys) {
    if (k.kind != EntryKind::kBytes) continue;
    if (!Readable(*src.metadata().Find(k.key), file_ok)) continue;  // the missing file is a problem already
    try {
      k.pickle = IsPickle(src.ReadBytes(k.key));
    } catch (const Error& err) {
      r.problems.push_back(k.key + ": content not read: " + err.what());
    }
  }
}

// --stats: the statistics of the floating tensors that have none recorded, read in blocks.
void ComputeStats(Source& src, std::map<std::string, bool>& file_ok, const InspectOptions& options,
                  uint64_t stats_bytes, InspectReport& r) {
  const uint64_t budget =
      std::max<uint64_t>(std::min(detail::kCacheBlockBytes, options.max_memory / 4), uint64_t{1} << 16);
  detail::Progress progress("stats", stats_bytes, options.progress);
  for (auto& k : r.keys) {
    if (k.kind != EntryKind::kTensor || k.stats || !IsFloating(*DTypeFromName(k.dtype))) continue;
    const EntryMeta& e = *src.metadata().Find(k.key);
    if (!Readable(e, file_ok)) {
      r.problems.push_back(k.key + ": statistics not computed, a file is missing");
      continue;
    }
    try {
      k.stats = StreamStats(src, k.key, e, budget, progress);
    } catch (const Error& err) {
      if (err.code() == ErrorCode::kChanged) throw;
      r.problems.push_back(k.key + ": statistics not computed: " + err.what());
    }
  }
}

}  // namespace

InspectReport Inspect(const std::filesystem::path& path, const InspectOptions& options) {
  // metadata.json alone for a v2 checkpoint: no shard is opened (stored sizes and chunk
  // details live in the shard indexes; --stats reads data only where none is recorded).
  auto src = Source::Open(path, /*skip_unsupported=*/false, /*resolve=*/false);
  const Metadata& md = src->metadata();
  InspectReport r;
  r.path = path.string();
  r.kind = std::string(SourceKindName(src->kind()));
  r.format_version = md.format_version;
  r.state_dict_type = std::string(StateDictTypeName(md.state_dict_type));
  r.world_size = md.world_size;
  r.library_version = md.library_version;
  r.created = md.created;
  r.user = md.user;
  r.save_timings = md.save_timings;
  std::map<std::string, bool> file_ok = InspectFiles(*src, path, r);
  r.total_keys = md.entries.size();
  if (options.keys.empty()) r.keys.reserve(md.entries.size());
  uint64_t stats_bytes = 0;
  for (const auto& [key, e] : md.entries) {
    if (!options.keys.empty() && !detail::MatchesAny(options.keys, key)) continue;
    KeyInfo k = DescribeKey(*src, key, e, options, r);
    if (e.kind == EntryKind::kTensor && options.stats && IsFloating(e.dtype) && !k.stats) stats_bytes += k.bytes;
    r.tensor_bytes += e.kind == EntryKind::kTensor ? k.bytes : 0;
    r.stored_bytes += e.kind == EntryKind::kTensor ? k.stored_bytes : 0;
    r.keys.push_back(std::move(k));
  }
  MarkPickles(*src, file_ok, r);
  if (options.stats && stats_bytes > 0) ComputeStats(*src, file_ok, options, stats_bytes, r);
  // Files missing from a checkpoint replaced meanwhile are no problem of it (FORMAT.md §2.7).
  if (!r.problems.empty()) src->ThrowIfReplaced();
  return r;
}

namespace {

std::vector<std::string> RowCells(const KeyInfo& k, bool stats, const std::string& name) {
  std::vector<std::string> row = {name,
                                  k.kind == EntryKind::kTensor ? k.dtype : std::string(EntryKindName(k.kind)),
                                  k.kind == EntryKind::kTensor ? FormatShape(k.shape) : k.value.size() <= 24 ? k.value : k.value.substr(0, 21) + "...",
                                  k.kind == EntryKind::kTensor || k.kind == EntryKind::kBytes ? std::to_string(k.num_chunks) : "-",
                                  k.kind == EntryKind::kTensor || k.kind == EntryKind::kBytes ? FormatBytes(static_cast<double>(k.bytes)) : "-",
                                  k.layout};
  if (k.kind == EntryKind::kScalar) row[1] = "scalar " + k.dtype;
  if (k.pickle) row[1] = "bytes (pickle)";
  if (stats) {
    if (k.stats) {
      for (double v : {k.stats->min, k.stats->max, k.stats->mean, k.stats->std})
        row.push_back(k.stats->finite_count ? FormatDouble(v) : "-");
      row.push_back(std::to_string(k.stats->nan_count));
      row.push_back(std::to_string(k.stats->inf_count));
    } else {
      for (int i = 0; i < 6; ++i) row.push_back("-");
    }
  }
  return row;
}

struct TreeNode {
  std::map<std::string, TreeNode> children;  // ordered by name
  const KeyInfo* leaf = nullptr;
  std::size_t keys = 0;
  uint64_t bytes = 0;
  std::size_t first = 0;  // first appearance, to keep save order
};

void EmitTree(const TreeNode& node, const std::string& indent, bool stats, detail::Table& t) {
  std::vector<std::pair<std::string, const TreeNode*>> kids;
  for (const auto& [name, child] : node.children) kids.emplace_back(name, &child);
  std::stable_sort(kids.begin(), kids.end(),
                   [](const auto& a, const auto& b) { return a.second->first < b.second->first; });
  for (auto [name, child] : kids) {
    // Collapse chains of single-child groups: "attn.c_attn" rather than two levels.
    while (!child->leaf && child->children.size() == 1) {
      const auto& only = *child->children.begin();
      name += "." + only.first;
      child = &only.second;
    }
    if (child->leaf && child->children.empty()) {
      t.AddRow(RowCells(*child->leaf, stats, indent + name));
    } else {
      std::vector<std::string> row = {indent + name + ".*", "", "", std::to_string(child->keys) + " keys",
                                      FormatBytes(static_cast<double>(child->bytes)), ""};
      if (stats) row.resize(row.size() + 6);
      t.AddRow(std::move(row));
      if (child->leaf) t.AddRow(RowCells(*child->leaf, stats, indent + "  " + name));
      EmitTree(*child, indent + "  ", stats, t);
    }
  }
}

}  // namespace

std::string RenderInspectText(const InspectReport& r, bool tree, bool stats) {
  std::ostringstream out;
  out << r.kind << "  " << r.path << "\n";
  if (r.kind == "checkpoint")
    out << "format      v" << r.format_version << ", " << r.state_dict_type << ", world size "
        << r.world_size << "\n"
        << "written by  ckpt " << r.library_version << " at " << r.created << "\n";
  else if (r.kind == "shard")
    out << "format      lone shard (its ckpt_shard_index); the checkpoint's metadata.json is authoritative\n";
  uint64_t file_bytes = 0;
  // Objects on a store are not looked at (metadata.json alone): their recorded sizes.
  for (const auto& f : r.files) file_bytes += f.actual_bytes.value_or(f.problem.empty() ? f.bytes : 0);
  out << "files       " << r.files.size() << (r.files.size() == 1 ? " file, " : " files, ")
      << FormatBytes(static_cast<double>(file_bytes)) << "\n";
  for (const auto& f : r.files) {
    out << "  " << f.name << "  rank " << f.rank << "  "
        << (f.actual_bytes  ? FormatBytes(static_cast<double>(*f.actual_bytes))
            : f.problem.empty() ? FormatBytes(static_cast<double>(f.bytes)) + " (recorded)"
                                : std::string("-"));
    if (!f.problem.empty()) out << "  PROBLEM: " << f.problem;
    out << "\n";
  }
  if (r.save_timings) {
    const SaveTimings& st = *r.save_timings;
    out << "saved       " << (st.async ? "async" : "sync") << " by " << r.world_size
        << (r.world_size == 1 ? " rank" : " ranks") << ", seconds min / median / max (slowest rank)\n";
    for (std::size_t i = 0; i < std::size(kSavePhaseNames); ++i) {
      const PhaseTiming& p = SavePhase(st, i);
      char line[160];
      std::snprintf(line, sizeof line, "  %-9s %10.6f / %10.6f / %10.6f  (rank %d)\n", kSavePhaseNames[i], p.min,
                    p.median, p.max, p.slowest_rank);
      out << line;
    }
  }
  std::size_t counts[4] = {0, 0, 0, 0};
  for (const auto& k : r.keys) ++counts[static_cast<int>(k.kind)];
  out << "keys        " << r.keys.size();
  if (r.keys.size() != r.total_keys) out << " of " << r.total_keys;
  out << " (" << counts[0] << " tensors, " << counts[1] << " scalars, " << counts[2] << " bytes, "
      << counts[3] << " json)\n";
  out << "tensors     " << FormatBytes(static_cast<double>(r.tensor_bytes));
  if (r.compressed && r.stored_bytes > 0) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2f", static_cast<double>(r.tensor_bytes) /
                                                   static_cast<double>(r.stored_bytes));
    out << ", stored " << FormatBytes(static_cast<double>(r.stored_bytes)) << " (compression ratio "
        << ratio << ")";
  }
  out << "\n\n";
  detail::Table t({"KEY", "DTYPE", "SHAPE", "CHUNKS", "BYTES", "LAYOUT"});
  if (stats) {
    for (const char* h : {"MIN", "MAX", "MEAN", "STD", "NAN", "INF"}) t.AddHeader(h);
  }
  if (tree) {
    TreeNode root;
    std::size_t order = 0;
    for (const auto& k : r.keys) {
      TreeNode* node = &root;
      std::size_t start = 0;
      for (;;) {
        const std::size_t dot = k.key.find('.', start);
        const std::string part = k.key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        auto [it, inserted] = node->children.try_emplace(part);
        node = &it->second;
        if (inserted) node->first = order;
        node->keys += 1;
        node->bytes += k.bytes;
        if (dot == std::string::npos) break;
        start = dot + 1;
      }
      node->leaf = &k;
      ++order;
    }
    EmitTree(root, "", stats, t);
  } else {
    for (const auto& k : r.keys) t.AddRow(RowCells(k, stats, k.key));
  }
  out << t.Render();
  if (!r.problems.empty()) {
    out << "\nproblems:\n";
    for (const auto& p : r.problems) out << "  " << p << "\n";
  }
  return out.str();
}

namespace {

// `text` (a dump(2)) with every line after the first indented by `n` more spaces: how it
// reads nested in a larger dump(2). Strings never hold a raw newline, so each is a line.
void AppendIndented(std::string& out, const std::string& text, std::size_t n) {
  std::size_t start = 0;
  for (std::size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    out.append(text, start, nl + 1 - start);
    out.append(n, ' ');
  }
  out.append(text, start, std::string::npos);
}

ordered_json KeyJson(const KeyInfo& k) {
  auto num = [](double v) { return std::isfinite(v) ? ordered_json(v) : ordered_json(nullptr); };
  ordered_json kj = {{"key", k.key}, {"type", std::string(EntryKindName(k.kind))}};
  if (k.kind == EntryKind::kTensor || k.kind == EntryKind::kScalar) kj["dtype"] = k.dtype;
  if (k.kind == EntryKind::kTensor) {
    kj["shape"] = k.shape;
    kj["layout"] = k.layout;
  }
  if (k.kind == EntryKind::kTensor || k.kind == EntryKind::kBytes) {
    kj["chunks"] = k.num_chunks;
    kj["bytes"] = k.bytes;
    kj["stored_bytes"] = k.stored_bytes;
  }
  if (k.kind == EntryKind::kBytes) kj["pickle"] = k.pickle;
  if (k.kind == EntryKind::kScalar || k.kind == EntryKind::kJson)
    kj["value"] = ordered_json::parse(k.value, nullptr, false);
  if (k.stats) {
    const bool f = k.stats->finite_count > 0;
    kj["stats"] = {{"min", f ? num(k.stats->min) : nullptr},
                   {"max", f ? num(k.stats->max) : nullptr},
                   {"mean", f ? num(k.stats->mean) : nullptr},
                   {"std", f ? num(k.stats->std) : nullptr},
                   {"nan_count", k.stats->nan_count},
                   {"inf_count", k.stats->inf_count},
                   {"finite_count", k.stats->finite_count},
                   {"source", k.stats->recomputed ? "computed" : "recorded"}};
  }
  return kj;
}

}  // namespace

// The text of one dump(2) of the whole report, written key by key: a tree of 100,000 keys
// would take several times the text's size.
std::string RenderInspectJson(const InspectReport& r) {
  ordered_json j;
  j["path"] = r.path;
  j["kind"] = r.kind;
  j["format_version"] = r.format_version;
  j["state_dict_type"] = r.state_dict_type;
  j["world_size"] = r.world_size;
  j["library_version"] = r.library_version;
  j["created"] = r.created;
  j["user"] = ordered_json::parse(r.user.empty() ? "{}" : r.user, nullptr, false);
  if (r.save_timings) {
    ordered_json t = {{"mode", r.save_timings->async ? "async" : "sync"}};
    for (std::size_t i = 0; i < std::size(kSavePhaseNames); ++i) {
      const PhaseTiming& p = SavePhase(*r.save_timings, i);
      t[kSavePhaseNames[i]] = {{"min", p.min}, {"median", p.median}, {"max", p.max}, {"slowest_rank", p.slowest_rank}};
    }
    j["save_timings"] = std::move(t);
  } else {
    j["save_timings"] = nullptr;
  }
  j["files"] = ordered_json::array();
  for (const auto& f : r.files) {
    ordered_json fj = {{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}};
    fj["actual_bytes"] = f.actual_bytes ? ordered_json(*f.actual_bytes) : ordered_json(nullptr);
    fj["problem"] = f.problem.empty() ? ordered_json(nullptr) : ordered_json(f.problem);
    j["files"].push_back(fj);
  }
  j["num_keys"] = r.keys.size();
  j["total_keys"] = r.total_keys;
  j["tensor_bytes"] = r.tensor_bytes;
  j["stored_bytes"] = r.stored_bytes;
  j["compressed"] = r.compressed;
  j["compression_ratio"] = r.compressed && r.stored_bytes
                               ? ordered_json(static_cast<double>(r.tensor_bytes) / static_cast<double>(r.stored_bytes))
                               : ordered_json(nullptr);
  std::string out = j.dump(2);
  out.resize(out.size() - 2);  // the closing "\n}": "keys" and "problems" follow
  out += ",\n  \"keys\": [";
  for (std::size_t i = 0; i < r.keys.size(); ++i) {
    const std::string key = KeyJson(r.keys[i]).dump(2);
    if (i == 0) out.reserve(out.size() + r.keys.size() * (key.size() + key.size() / 4 + 8) + 4096);
    out += i ? ",\n    " : "\n    ";
    AppendIndented(out, key, 4);
  }
  out += r.keys.empty() ? "],\n  \"problems\": " : "\n  ],\n  \"problems\": ";
  AppendIndented(out, ordered_json(r.problems).dump(2), 2);
  out += "\n}\n";
  return out;
}

}  // namespace ckpt::ops
