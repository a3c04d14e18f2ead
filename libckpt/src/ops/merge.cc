// ops/merge.cc: see ckpt/ops/merge.h.
#include "ckpt/ops/merge.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/files.h"
#include "ckpt/ops/safetensors.h"
#include "ckpt/ops/source.h"
#include "ckpt/ops/verify.h"
#include "ckpt/virtual_file.h"
#include "ops/elements.h"
#include "ops/util.h"

namespace ckpt::ops {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Selected {
  const std::string* key;
  const EntryMeta* entry;
};

std::vector<Selected> Select(const Source& src, const MergeOptions& o) {
  std::vector<Selected> out;
  for (const auto& [key, e] : src.metadata().entries) {
    if (!o.keys.empty() && !detail::MatchesAny(o.keys, key)) continue;
    if (detail::MatchesAny(o.exclude, key)) continue;
    if (e.kind == EntryKind::kTensor && !src.HoldsWhole(key))
      throw Error(ErrorCode::kInvalidArgument,
                  src.path().string() + ": tensor '" + key +
                      "' is only partly in this shard; merge the checkpoint directory instead");
    out.push_back({&key, &e});
  }
  return out;
}

// A part whose pieces would average less than this is not worth a system call per piece.
constexpr uint64_t kCopyMinPieceBytes = uint64_t{64} << 10;

// A piece of an output part copied from a source file: `range`, landing at byte `dst` of
// the part. `chunk` is the source chunk it comes from; `whole` if it is all of that chunk
// (then the chunk's checksum is checked as the bytes go).
struct Piece {
  uint64_t dst;
  FileRange range;
  std::size_t chunk;
  bool whole;
};

// The pieces that make `part` of tensor `key`, in the part's row-major order, when every
// source chunk overlapping it can be copied byte for byte; nullopt when one cannot
// (compressed) or when the pieces would be too small to be worth copying.
std::optional<std::vector<Piece>> PlanCopy(Source& src, const std::string& key, const EntryMeta& e, const Box& part) {
  const uint64_t item = DTypeSize(e.dtype);
  const uint64_t bytes = static_cast<uint64_t>(part.NumElements()) * item;
  std::vector<Piece> pieces;
  for (std::size_t i = 0; i < e.chunks.size(); ++i) {
    const ChunkMeta& c = e.chunks[i];
    const auto common = Intersect(c.box, part);
    if (!common || common->NumElements() == 0) continue;
    const auto runs = static_cast<uint64_t>(CountRuns(c.box, part, *common));
    if (runs > 64 && static_cast<uint64_t>(common->NumElements()) * item / runs < kCopyMinPieceBytes)
      return std::nullopt;
    const auto at = src.Locate(key, i);
    if (!at) return std::nullopt;
    const std::size_t first = pieces.size();
    ForEachRun(c.box, part, *common, [&](const BoxRun& run) {
      pieces.push_back({static_cast<uint64_t>(run.dst) * item,
                        FileRange{at->file, at->offset + static_cast<uint64_t>(run.src) * item,
                                  static_cast<uint64_t>(run.count) * item, at->fd},
                        i, false});
    });
    if (*common == c.box && pieces.size() == first + 1) pieces.back().whole = true;
  }
  std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.dst < b.dst; });
  uint64_t covered = 0;
  for (const Piece& p : pieces) {
    if (p.dst != covered) return std::nullopt;  // metadata that does not tile: let the reader say so
    covered += p.range.length;
  }
  if (covered != bytes) return std::nullopt;
  return pieces;
}

// Calls check(i) for each source chunk overlapping `part` that no single block of
// `blocks` holds whole: reads verify only chunks they read whole.
template <typename Check>
void CheckChunksReadInPart(const EntryMeta& e, const Box& part, const std::vector<Box>& blocks, Check&& check) {
  for (std::size_t i = 0; i < e.chunks.size(); ++i) {
    const Box& cb = e.chunks[i].box;
    if (cb.NumElements() == 0 || !Overlaps(cb, part)) continue;
    if (std::none_of(blocks.begin(), blocks.end(), [&](const Box& b) { return Contains(b, cb); })) check(i);
  }
}

// The statistics of a part made of whole source chunks, from theirs (nullopt if one has
// none, or is read only in part).
std::optional<ChunkStats> CombineStats(const EntryMeta& e, const std::vector<Piece>& pieces) {
  if (!IsFloating(e.dtype)) return std::nullopt;
  std::vector<const ChunkStats*> parts;
  for (const Piece& p : pieces) {
    const auto& s = e.chunks[p.chunk].stats;
    if (!p.whole || !s) return std::nullopt;
    parts.push_back(&*s);
  }
  return ckpt::CombineStats(parts);
}

DType OutType(const EntryMeta& e, const MergeOptions& o) {
  return o.cast && IsCastable(e.dtype) ? *o.cast : e.dtype;
}

// Streams tensor `key` block by block in row-major order; fn(block, data, bytes).
template <typename Fn>
void StreamTensor(Source& src, const std::string& key, const EntryMeta& e, const std::vector<Box>& blocks,
                  DType out_dtype, detail::Buffer& in, detail::Buffer& out, Fn&& fn) {
  const std::size_t in_item = DTypeSize(e.dtype), out_item = DTypeSize(out_dtype);
  for (const Box& block : blocks) {
    const auto n = static_cast<std::size_t>(block.NumElements());
    uint8_t* data = in.Get(std::max<std::size_t>(n * in_item, 8));
    if (n > 0) src.ReadRegion(key, block, data);
    if (out_dtype == e.dtype) {
      fn(block, data, n * in_item);
    } else {
      uint8_t* cast = out.Get(std::max<std::size_t>(n * out_item, 8));
      detail::CastElements(e.dtype, data, out_dtype, cast, n);
      fn(block, cast, n * out_item);
    }
  }
}

Scalar ToScalar(const std::string& key, const EntryMeta& e) {
  const json v = json::parse(e.value, nullptr, false);
  if (v.is_boolean()) return Scalar::Int(v.get<bool>() ? 1 : 0, e.dtype);
  if (v.is_number_integer()) return Scalar::Int(v.get<int64_t>(), e.dtype);
  if (v.is_number()) return Scalar::Float(v.get<double>(), e.dtype);
  throw Error(ErrorCode::kCorrupt, "scalar '" + key + "' has a non-numeric value " + e.value);
}

// Commits the verified `staging` at its target (ckpt/files.h), replacing what is there
// only with `force`; a failure discards the staging and leaves the target as it was.
void Install(files::StagedOutput& staging, bool force) {
  try {
    staging.Commit(force ? files::Replace::kExisting : files::Replace::kNever);
  } catch (const Error& e) {
    staging.Discard();
    if (e.code() == ErrorCode::kAlreadyExists && !force)
      throw Error(ErrorCode::kAlreadyExists,
                  staging.target().string() + ": already exists (use --force to replace it)");
    throw;
  }
}

// The parts tensor `e` is written as, each with its file: its rows split over o.world files
// along o.dim where it has rows enough, else the whole tensor into the next file in turn.
std::vector<std::pair<Box, int>> PartsOf(const EntryMeta& e, const MergeOptions& o, int files, int& next_whole) {
  std::vector<std::pair<Box, int>> parts;
  const auto rank = static_cast<int>(e.shape.size());
  // A tensor of zero volume is one chunk, the whole tensor (FORMAT.md §3.3, §9.1).
  if (o.world > 1 && o.dim < rank && e.shape[o.dim] >= o.world && NumElements(e.shape) > 0) {
    for (int p = 0; p < o.world; ++p) {
      Box b = Box::Full(e.shape);
      const auto [begin, count] = BalancedSplit(e.shape[o.dim], o.world, p);
      b.offsets[o.dim] = begin;
      b.sizes[o.dim] = count;
      parts.emplace_back(b, p);
    }
  } else {
    parts.emplace_back(Box::Full(e.shape), next_whole++ % files);
  }
  return parts;
}

// What writing one tensor needs besides the tensor.
struct TensorSink {
  CheckpointWriter& writer;
  const MergeOptions& o;
  uint64_t budget;
  detail::Buffer &in, &out;
  detail::Progress& progress;
  MergeReport& r;
};

// Copies `pieces` (whole and partial source chunks that make up `part`) file to file into
// one output chunk, each checked as it goes.
void CopyPart(const std::string& key, const EntryMeta& e, DType out_dtype, const Box& part, int file,
              const std::vector<Piece>& pieces, const std::function<void(std::size_t)>& check, TensorSink& t) {
  auto chunk = t.writer.OpenChunk(key, out_dtype, e.shape, part, file, CombineStats(e, pieces));
  for (const Piece& p : pieces) {
    if (!p.whole) check(p.chunk);
    try {
      // Checked against the source chunk's checksum as the bytes go, where it has one
      // (a safetensors file or a lone shard records none).
      const ChunkMeta& from = e.chunks[p.chunk];
      chunk->Copy(p.range, p.whole && !from.checksum.empty() ? &from : nullptr);
    } catch (const Error& err) {
      if (err.code() != ErrorCode::kCorrupt) throw;
      throw Error(ErrorCode::kCorrupt, "tensor '" + key + "' chunk " + e.chunks[p.chunk].box.ToString() +
                                           ": " + err.what());
    }
    t.progress.Add(p.range.length);
  }
  chunk->Close();
}

// Writes tensor `key` as `parts`: copied where its bytes can be (PlanCopy), else read,
// cast and written block by block.
void WriteTensor(Source& src, const std::string& key, const EntryMeta& e,
                 const std::vector<std::pair<Box, int>>& parts, TensorSink& t) {
  const DType out_dtype = OutType(e, t.o);
  // Source chunks whose checksum is not checked as they are read (read or copied
  // in part) are checked once on their own: a merge never launders corruption
  // into a fresh checksum.
  std::set<std::size_t> checked;
  const std::function<void(std::size_t)> check = [&](std::size_t chunk) {
    if (checked.insert(chunk).second) src.VerifyChunk(key, chunk);
  };
  const bool plain = out_dtype == e.dtype && t.o.compression.codec == Compression::Codec::kNone;
  for (const auto& [part, file] : parts) {
    const uint64_t part_bytes = static_cast<uint64_t>(part.NumElements()) * DTypeSize(e.dtype);
    std::optional<std::vector<Piece>> pieces;
    if (plain && part_bytes >= t.o.copy_min_bytes) pieces = PlanCopy(src, key, e, part);
    if (pieces) {
      CopyPart(key, e, out_dtype, part, file, *pieces, check, t);
      ++t.r.chunks;
      t.r.bytes += part_bytes;
      t.r.bytes_copied += part_bytes;
      continue;
    }
    const auto blocks = SplitBox(part, std::max(DTypeSize(e.dtype), DTypeSize(out_dtype)), t.budget);
    CheckChunksReadInPart(e, part, blocks, check);
    StreamTensor(src, key, e, blocks, out_dtype, t.in, t.out,
                 [&, f = file](const Box& block, const void* data, std::size_t bytes) {
                   t.writer.WriteChunk(key, out_dtype, e.shape, block, data, f);
                   ++t.r.chunks;
                   t.r.bytes += bytes;
                   t.progress.Add(bytes);
                 });
  }
  ++t.r.tensors;
}

// Writes the output checkpoint at `staging` and verifies it.
void StageCheckpoint(Source& src, const std::vector<Selected>& sel, const fs::path& staging,
                     const MergeOptions& o, uint64_t budget, MergeReport& r) {
  const int files = std::max(1, o.world);
  CheckpointWriter::Options wo;
  wo.state_dict_type = o.world == 0 ? StateDictType::kFull : StateDictType::kSharded;
  wo.world_size = files;
  wo.num_files = files;
  wo.compression = o.compression;
  wo.pack_bytes = o.pack_bytes;
  wo.user_metadata = src.metadata().user.empty() ? "{}" : src.metadata().user;
  uint64_t total = 0;
  for (const auto& s : sel)
    if (s.entry->kind == EntryKind::kTensor) total += s.entry->TensorBytes();
  detail::Progress progress(o.world ? "reshard" : "merge", total, o.progress);
  {
    auto writer = CheckpointWriter::Create(staging, wo);
    detail::Buffer in, out;
    TensorSink sink{*writer, o, budget, in, out, progress, r};
    int next_whole = 0;  // tensors too small to split go to the files in turn
    for (const auto& s : sel) {
      const std::string& key = *s.key;
      const EntryMeta& e = *s.entry;
      switch (e.kind) {
        case EntryKind::kTensor:
          WriteTensor(src, key, e, PartsOf(e, o, files, next_whole), sink);
          break;
        case EntryKind::kScalar:
          writer->WriteScalar(key, ToScalar(key, e));
          ++r.other_entries;
          break;
        case EntryKind::kBytes: {
          const auto blob = src.ReadBytes(key);
          writer->WriteBytes(key, blob, 0);
          ++r.other_entries;
          break;
        }
        case EntryKind::kJson:
          writer->WriteJson(key, e.value);
          ++r.other_entries;
          break;
      }
    }
    const Metadata written = writer->Commit();
    r.files = written.files.size();
  }
  progress.Done();
  // Verified before it is put in place: structure always, data on request.
  VerifyOptions vo;
  vo.quick = !o.verify_data;
  const VerifyReport v = Verify(staging, vo);
  if (!v.ok()) {
    throw Error(ErrorCode::kCorrupt, "the merged checkpoint failed verification; nothing written:\n" +
                                         RenderVerifyText(v));
  }
}

void WriteCheckpoint(Source& src, const std::vector<Selected>& sel, const fs::path& dst,
                     const MergeOptions& o, uint64_t budget, MergeReport& r) {
  files::StagedOutput staging(dst, /*directory=*/false);  // discarded if anything throws
  StageCheckpoint(src, sel, staging.path(), o, budget, r);
  Install(staging, o.force);
}

// The tensors of `sel` (others noted: safetensors holds tensors only) and the
// __metadata__ the output carries: ckpt's user metadata, string values kept, others as JSON text.
std::vector<Selected> SafetensorsTensors(const Source& src, const std::vector<Selected>& sel, MergeReport& r,
                                         std::vector<std::pair<std::string, std::string>>& meta) {
  std::vector<Selected> tensors;
  std::vector<std::string> skipped;
  for (const auto& s : sel) {
    if (s.entry->kind == EntryKind::kTensor) tensors.push_back(s);
    else skipped.push_back(*s.key);
  }
  if (!skipped.empty())
    r.notes.push_back(std::to_string(skipped.size()) + " non-tensor entries not written (safetensors holds "
                      "tensors only), e.g. '" + skipped.front() + "'");
  const json user = json::parse(src.metadata().user.empty() ? "{}" : src.metadata().user, nullptr, false);
  if (user.is_object())
    for (auto it = user.begin(); it != user.end(); ++it)
      meta.emplace_back(it.key(), it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  // transformers' from_pretrained refuses a file whose __metadata__ lacks "format" (it
  // accepts "pt", what safetensors.torch and save_pretrained write).
  if (std::none_of(meta.begin(), meta.end(), [](const auto& m) { return m.first == "format"; }))
    meta.emplace_back("format", "pt");
  return tensors;
}

uint64_t OutBytes(const EntryMeta& e, const MergeOptions& o) {
  return static_cast<uint64_t>(NumElements(e.shape)) * DTypeSize(OutType(e, o));
}

// Writes `tensors` into one safetensors file at `path`, left uncommitted (the caller commits).
std::unique_ptr<SafetensorsWriter> StageSafetensorsFile(
    Source& src, const std::vector<Selected>& tensors, const fs::path& path,
    const std::vector<std::pair<std::string, std::string>>& meta, const MergeOptions& o, uint64_t budget,
    MergeReport& r, detail::Progress& progress) {
  std::vector<SafetensorsWriter::TensorSpec> specs;
  for (const auto& s : tensors) specs.push_back({*s.key, OutType(*s.entry, o), s.entry->shape});
  // With ckpt's block digests in its __metadata__: ckpt-verify and imports check every byte.
  auto w = std::make_unique<SafetensorsWriter>(path, specs, meta, o.force, /*digests=*/true);
  detail::Buffer in, out;
  for (const auto& s : tensors) {
    const DType out_dtype = OutType(*s.entry, o);
    if (out_dtype == s.entry->dtype && s.entry->TensorBytes() >= o.copy_min_bytes) {
      if (auto pieces = PlanCopy(src, *s.key, *s.entry, Box::Full(s.entry->shape))) {
        // Copied file to file; each source chunk checked first (safetensors keeps no checksums).
        std::set<std::size_t> checked;
        for (const Piece& p : *pieces)
          if (checked.insert(p.chunk).second) src.VerifyChunk(*s.key, p.chunk);
        for (const Piece& p : *pieces) {
          w->AppendCopy(p.range);
          progress.Add(p.range.length);
        }
        r.bytes += s.entry->TensorBytes();
        r.bytes_copied += s.entry->TensorBytes();
        ++r.tensors;
        ++r.chunks;
        continue;
      }
    }
    const auto blocks = SplitBox(Box::Full(s.entry->shape),
                                         std::max(DTypeSize(s.entry->dtype), DTypeSize(out_dtype)), budget);
    CheckChunksReadInPart(*s.entry, Box::Full(s.entry->shape), blocks,
                          [&](std::size_t chunk) { src.VerifyChunk(*s.key, chunk); });
    StreamTensor(src, *s.key, *s.entry, blocks, out_dtype, in, out,
                 [&](const Box&, const void* data, std::size_t bytes) {
                   w->Append(data, bytes);
                   r.bytes += bytes;
                   progress.Add(bytes);
                 });
    ++r.tensors;
    ++r.chunks;
  }
  return w;
}

void WriteSafetensors(Source& src, const std::vector<Selected>& sel, const fs::path& dst,
                      const MergeOptions& o, uint64_t budget, MergeReport& r) {
  std::vector<std::pair<std::string, std::string>> meta;
  const auto tensors = SafetensorsTensors(src, sel, r, meta);
  uint64_t total = 0;
  for (const auto& s : tensors) total += s.entry->TensorBytes();
  detail::Progress progress("convert", total, o.progress);
  auto w = StageSafetensorsFile(src, tensors, dst, meta, o, budget, r, progress);
  progress.Done();
  w->Commit();
  r.other_entries = 0;
  r.files = 1;
}

// "model-00001-of-00003.safetensors" for stem "model": the names a sharded save of `stem` uses.
bool IsShardOf(std::string_view name, std::string_view stem) {
  constexpr std::string_view kTail = "-00000-of-00000.safetensors";
  if (name.size() != stem.size() + kTail.size() || !name.starts_with(stem)) return false;
  const std::string_view tail = name.substr(stem.size());
  for (std::size_t i = 0; i < kTail.size(); ++i) {
    const bool digit = kTail[i] == '0';
    if (digit ? !std::isdigit(static_cast<unsigned char>(tail[i])) : tail[i] != kTail[i]) return false;
  }
  return true;
}

// The Hub's layout, as save_pretrained writes it: shards of at most o.max_shard_size
// tensor bytes named <stem>-0000i-of-0000n.safetensors beside <stem>.safetensors.index.json,
// or, when `dst` is <stem>.safetensors and everything fits in one shard, that file alone.
// Every shard is written and checked before any is committed; the index is committed last.
// With --force, shards of an earlier save of the same stem that this one does not write are
// removed, as save_pretrained does, and so is an earlier index (one file now) or an earlier
// <stem>.safetensors (shards now): a reader would otherwise find the stale one.
void WriteShardedSafetensors(Source& src, const std::vector<Selected>& sel, const fs::path& dst,
                             const MergeOptions& o, uint64_t budget, MergeReport& r) {
  const std::string name = dst.filename().string();
  const bool index_dst = name.ends_with(kSafetensorsIndexSuffix);
  const std::string stem = index_dst ? name.substr(0, name.size() - kSafetensorsIndexSuffix.size())
                                     : dst.stem().string();
  if (stem.empty()) throw Error(ErrorCode::kInvalidArgument, dst.string() + ": no file name before the suffix");
  const fs::path dir = dst.parent_path().empty() ? fs::path(".") : dst.parent_path();
  const fs::path index_path = index_dst ? dst : dir / (stem + std::string(kSafetensorsIndexSuffix));
  std::vector<std::pair<std::string, std::string>> meta;
  const auto tensors = SafetensorsTensors(src, sel, r, meta);
  std::vector<uint64_t> sizes;
  uint64_t total = 0, parameters = 0;
  for (const auto& s : tensors) {
    sizes.push_back(OutBytes(*s.entry, o));
    total += sizes.back();
    parameters += static_cast<uint64_t>(NumElements(s.entry->shape));
  }
  const uint64_t cap = o.max_shard_size ? o.max_shard_size : kDefaultMaxShardSize;
  auto groups = PlanSafetensorsShards(sizes, cap);
  if (groups.empty()) groups.emplace_back();  // no tensors: one empty file
  std::error_code ec;
  const bool one_file = groups.size() == 1 && !index_dst;
  if (one_file && fs::exists(index_path, ec) && !o.force)
    throw Error(ErrorCode::kAlreadyExists, index_path.string() + ": a sharded save is there (use --force to replace it)");
  std::vector<std::string> names;
  for (std::size_t i = 0; i < groups.size(); ++i)
    names.push_back(one_file ? name : SafetensorsShardName(stem, i, groups.size()));
  if (!o.force) {
    for (const auto& n : names)
      if (fs::exists(dir / n, ec))
        throw Error(ErrorCode::kAlreadyExists, (dir / n).string() + ": already exists (use --force to replace it)");
  }
  // Leftovers of earlier calls for these names (e.g. old content whose removal failed) go
  // first: once the first shard is staged, this writer's own lock on the directory keeps
  // the later BeginStaging calls from cleaning.
  const std::string index_name = index_path.filename().string();
  if (fs::is_directory(dir, ec))
    files::CleanLeftovers(dir, [&](std::string_view t) {
      return t == index_name || std::find(names.begin(), names.end(), t) != names.end();
    });
  detail::Progress progress("convert", total, o.progress);
  std::vector<std::unique_ptr<SafetensorsWriter>> writers;
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::vector<Selected> part;
    for (std::size_t i : groups[g]) {
      part.push_back(tensors[i]);
      weight_map.emplace_back(*tensors[i].key, names[g]);
    }
    writers.push_back(StageSafetensorsFile(src, part, dir / names[g], meta, o, budget, r, progress));
  }
  progress.Done();
  if (one_file) {
    writers.front()->Commit();
  } else {  // all or nothing: the shards, then the index naming them, in one group commit
    std::vector<SafetensorsWriter*> shards;
    for (auto& w : writers) shards.push_back(w.get());
    CommitSafetensorsShards(shards, index_path, total, weight_map, parameters);
  }
  if (o.force) {  // what an earlier save of this stem left that this one did not write
    const std::set<std::string> ours(names.begin(), names.end());
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string f = it->path().filename().string();
      if (!ours.count(f) && IsShardOf(f, stem)) fs::remove(it->path(), ec);
    }
    if (one_file) fs::remove(index_path, ec);
    else if (!index_dst) fs::remove(dst, ec);  // an earlier one-file save at DST
  }
  r.other_entries = 0;
  r.files = names.size() + (one_file ? 0 : 1);
}

// A scalar entry as a 0-D dataset of the virtual file, so that h5ls and h5py see it by its
// key too: its value (metadata.json's JSON number) as int64 (uint64 past int64's range) or
// float64. False where the value is not a number.
bool AddVirtualScalar(VirtualFileWriter& file, const std::string& key, const std::string& value) {
  const json v = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()}) {
    const uint64_t x = v.get<uint64_t>();
    file.AddScalar(key, DType::kUInt64, &x);
  } else if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    file.AddScalar(key, DType::kInt64, &x);
  } else if (v.is_number_float()) {
    const double x = v.get<double>();
    file.AddScalar(key, DType::kFloat64, &x);
  } else {
    return false;
  }
  return true;
}

void WriteVirtual(Source& src, const std::vector<Selected>& sel, const fs::path& dst,
                  const MergeOptions& o, MergeReport& r) {
  if (src.kind() != SourceKind::kCheckpoint)
    throw Error(ErrorCode::kInvalidArgument, "--virtual needs a checkpoint directory as source");
  if (o.cast || o.world > 0 || o.compression.codec != Compression::Codec::kNone)
    throw Error(ErrorCode::kInvalidArgument, "--virtual copies nothing: it cannot cast, reshard or compress");
  std::error_code ec;
  if (fs::exists(dst, ec) && !o.force)
    throw Error(ErrorCode::kAlreadyExists, dst.string() + ": already exists (use --force to replace it)");
  files::StagedOutput tmp(dst, /*directory=*/false);  // discarded if anything throws
  // Source files are named relative to the virtual file's directory (HDF5 resolves them
  // from there), so the two can be moved or copied together.
  const fs::path src_dir = fs::relative(fs::absolute(src.path()), fs::absolute(dst).parent_path());
  uint64_t packed = 0, packed_bytes = 0;  // packed chunks copied into the virtual file
  {
    VirtualFileWriter file(tmp.path(), dst.string());
    for (const auto& s : sel) {
      const EntryMeta& e = *s.entry;
      if (e.kind == EntryKind::kScalar && AddVirtualScalar(file, *s.key, e.value)) {
        ++r.other_entries;
        continue;
      }
      if (e.kind != EntryKind::kTensor) {
        r.notes.push_back("'" + *s.key + "' is a " + std::string(EntryKindName(e.kind)) +
                          " entry: not in the virtual file");
        continue;
      }
      if (e.shape.empty()) {  // HDF5 has no virtual scalar datasets: copy the one element
        unsigned char element[8] = {};
        src.ReadRegion(*s.key, Box::Full(e.shape), element);
        file.AddScalar(*s.key, e.dtype, element);
      } else {
        // Packed chunks (FORMAT.md §5.7) are copied, read and checked as any read is.
        file.AddTensor(*s.key, e.dtype, e.shape, e.chunks, src_dir, [&](const ChunkMeta& c, void* out) {
          src.ReadRegion(*s.key, c.box, out);
          ++packed;
          packed_bytes += c.stored_bytes;
        });
      }
      ++r.tensors;
      r.chunks += e.chunks.size();
      r.bytes += e.TensorBytes();
    }
    file.Close();
    files::Fsync(tmp.path());
  }
  if (packed)
    r.notes.push_back(std::to_string(packed) + " packed chunk(s) (FORMAT.md §5.7), " +
                      detail::FormatBytes(static_cast<double>(packed_bytes)) +
                      ", copied into the virtual file: a mapping cannot retype a pack's bytes");
  r.files = 1;
  Install(tmp, o.force);
}

}  // namespace

MergeReport Merge(const fs::path& src_path, const fs::path& dst, const MergeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.world < 0 || o.dim < 0 || o.dim >= 32)
    throw Error(ErrorCode::kInvalidArgument, "--world must be >= 1 and --dim in [0, 32)");
  if (o.cast && !IsCastable(*o.cast))
    throw Error(ErrorCode::kInvalidArgument, "--dtype must be float64, float32, float16, bfloat16 or float8, not " +
                                                 std::string(DTypeName(*o.cast)));
  // An s3:// source is read by ranged GETs (every block checked, Source::Open); an s3://
  // destination is not written yet: it would need the output verified before its commit.
  if (IsObjectUrl(dst))
    throw Error(ErrorCode::kInvalidArgument,
                dst.string() + ": s3:// is not supported as the destination of ckpt-merge / ckpt-convert yet; "
                               "write to a local directory, check it (ckpt-verify), then upload its files, "
                               "metadata.json last (e.g. aws s3 cp DIR " + dst.string() +
                               " --recursive --exclude metadata.json, then aws s3 cp DIR/metadata.json " +
                               dst.string() + "/metadata.json)");
  if (IsObjectUrl(src_path) && o.virtual_file)
    throw Error(ErrorCode::kInvalidArgument,
                src_path.string() + ": --virtual needs the shards on a local file system (its virtual datasets "
                                    "name them); download the checkpoint first");
  std::error_code ec;
  if (fs::exists(dst, ec) && !o.force)
    throw Error(ErrorCode::kAlreadyExists, dst.string() + ": already exists (use --force to replace it)");
  if (fs::exists(dst, ec) && fs::equivalent(src_path, dst, ec))
    throw Error(ErrorCode::kInvalidArgument, dst.string() + ": source and destination are the same");
  const bool index_dst = dst.filename().string().ends_with(kSafetensorsIndexSuffix);
  const bool safetensors = index_dst || dst.extension() == ".safetensors";
  if (o.max_shard_size && (!safetensors || o.virtual_file))
    throw Error(ErrorCode::kInvalidArgument,
                "--max-shard-size needs a safetensors destination (.safetensors or .safetensors.index.json)");
  auto src = Source::Open(src_path, o.skip_unsupported);
  const auto sel = Select(*src, o);
  MergeReport r;
  r.src = src_path.string();
  r.dst = dst.string();
  for (const auto& [key, dtype] : src->skipped()) {
    if (!o.keys.empty() && !detail::MatchesAny(o.keys, key)) continue;
    if (detail::MatchesAny(o.exclude, key)) continue;
    r.skipped.push_back("'" + key + "' (dtype '" + dtype + "')");
  }
  if (!r.skipped.empty())
    r.notes.push_back(std::to_string(r.skipped.size()) +
                      " tensor(s) of dtypes ckpt does not support skipped (--skip-unsupported)");
  // Two block buffers (read, cast) of at most `budget` each, well inside max_memory.
  const uint64_t budget =
      std::max<uint64_t>(std::min<uint64_t>(o.chunk_bytes, o.max_memory / 8), uint64_t{1} << 16);
  if (o.virtual_file) {
    r.output = "virtual";
    WriteVirtual(*src, sel, dst, o, r);
  } else if (safetensors) {
    if (o.world > 0)
      throw Error(ErrorCode::kInvalidArgument, "a safetensors destination holds full tensors; drop --world");
    r.output = "safetensors";
    if (index_dst || o.max_shard_size) WriteShardedSafetensors(*src, sel, dst, o, budget, r);
    else WriteSafetensors(*src, sel, dst, o, budget, r);
  } else {
    r.output = o.world > 0 ? "sharded checkpoint" : "full checkpoint";
    WriteCheckpoint(*src, sel, dst, o, budget, r);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string RenderMergeText(const MergeReport& r) {
  char buf[512];
  const double rate = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds : 0;
  std::snprintf(buf, sizeof buf, "wrote %s (%s, %zu %s): %zu tensors in %zu chunks, %zu other entries, %s in %.2f s (%s/s)\n",
                r.dst.c_str(), r.output.c_str(), r.files, r.files == 1 ? "file" : "files", r.tensors, r.chunks,
                r.other_entries, detail::FormatBytes(static_cast<double>(r.bytes)).c_str(), r.seconds,
                detail::FormatBytes(rate).c_str());
  std::string out = buf;
  for (const auto& n : r.notes) out += "note: " + n + "\n";
  return out;
}

std::string RenderMergeJson(const MergeReport& r) {
  nlohmann::ordered_json j;
  j["src"] = r.src;
  j["dst"] = r.dst;
  j["output"] = r.output;
  j["files"] = r.files;
  j["tensors"] = r.tensors;
  j["chunks"] = r.chunks;
  j["other_entries"] = r.other_entries;
  j["bytes"] = r.bytes;
  j["bytes_copied"] = r.bytes_copied;
  j["seconds"] = r.seconds;
  j["notes"] = r.notes;
  j["skipped"] = r.skipped;
  return j.dump(2) + "\n";
}

}  // namespace ckpt::ops
