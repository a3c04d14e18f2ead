// format/metadata_reader.cc: metadata.json -> Metadata (FORMAT.md §3), with the reader's
// limits (§8): size, nesting depth, duplicate keys, unsafe file names, overflowing shapes.
//
// One pass of nlohmann's SAX parser (format/json_value.h): the top-level members, each
// element of 'files' and each entry come as small trees, so no tree of the whole document
// is built. The checks keep their order of precedence: a JSON problem anywhere (syntax,
// depth, duplicate key) wins over any problem of meaning, which is reported as the checks
// meet it in their fixed order (format, format_version, state_dict_type, world_size, files,
// then the entries in document order; within an entry its fields in a fixed order). So the
// first problem of an element or entry is kept while the rest of the text is still read.
#include <algorithm>
#include <exception>
#include <iterator>
#include <limits>

#include "ckpt/error.h"
#include "ckpt/metadata.h"
#include "format/checked.h"
#include "format/checksum.h"
#include "format/compression.h"
#include "format/json_value.h"
#include "format/layout_record.h"
#include "format/metadata_model.h"
#include "format/names.h"
#include "format/save_timings.h"
#include "format/stats.h"

namespace ckpt {
namespace {

using format::Ctx;
using format::FileIndex;
using format::Json;
using format::Member;
namespace n = names;

[[noreturn]] void Corrupt(std::string_view source, const std::string& what) {
  throw Error(ErrorCode::kCorrupt, std::string(source) + ": " + what);
}

// --- fields of an object (a tree) -------------------------------------------------------

const std::string& Str(const Ctx& ctx, const Json* v, const char* key) {
  if (!v) ctx.Fail(std::string("missing field '") + key + "'");
  if (!v->is_string()) ctx.Fail(std::string("field '") + key + "' must be a string");
  return v->get_ref<const std::string&>();
}
const std::string& Str(const Ctx& ctx, const Json& o, const char* key) { return Str(ctx, Member(o, key), key); }
// The same, moved out of a tree the caller owns.
std::string TakeStr(const Ctx& ctx, Json& o, const char* key) {
  Str(ctx, o, key);
  return std::move(o.find(key)->get_ref<std::string&>());
}

int64_t NonNeg(const Ctx& ctx, const Json& v, const std::string& what) {
  if (v.is_number_unsigned()) {
    if (!format::IsNonNegativeInt64(v)) ctx.Fail(what + " is too large");
    return v.get<int64_t>();
  }
  if (v.is_number_integer()) ctx.Fail(what + " is negative (" + v.dump() + ")");
  ctx.Fail(what + " must be a non-negative integer, found " + v.dump());
}

int64_t NonNeg(const Ctx& ctx, const Json* v, const char* key) {
  if (!v) ctx.Fail(std::string("missing field '") + key + "'");
  return NonNeg(ctx, *v, std::string("field '") + key + "'");
}

Shape Dims(const Ctx& ctx, const Json& o, const char* key, int max_rank) {
  const Json* v = Member(o, key);
  if (!v) ctx.Fail(std::string("missing field '") + key + "'");
  if (!v->is_array()) ctx.Fail(std::string("field '") + key + "' must be an array");
  if (v->size() > static_cast<std::size_t>(max_rank)) {
    ctx.Fail(std::string("field '") + key + "' has " + std::to_string(v->size()) + " dimensions, the limit is " +
             std::to_string(max_rank));
  }
  Shape out;
  out.reserve(v->size());
  for (const Json& x : *v) out.push_back(NonNeg(ctx, x, std::string("an element of '") + key + "'"));
  return out;
}

// stats: absent or null for none (FORMAT.md §7.3); a real that is not a number reads as NaN.
std::optional<ChunkStats> CheckStats(const Ctx& ctx, const Json& o) {
  const Json* v = Member(o, n::kStats);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_object()) ctx.Fail("'stats' must be an object");
  return format::ReadStats(*v, /*strict=*/false, [&](const char* name, const Json* x) { NonNeg(ctx, x, name); });
}

// compression: absent or null for none (FORMAT.md §6).
Compression CheckCompression(const Ctx& ctx, const Json& o, format::LevelRule rule) {
  using format::CompressionFault;
  const Json* v = Member(o, n::kCompression);
  if (!v || v->is_null()) return {};
  return format::ReadCompression(*v, rule, [&](CompressionFault f, const Json& x) {
    switch (f) {
      case CompressionFault::kNotObject: ctx.Fail("'compression' must be an object");
      case CompressionFault::kNoCodec:
      case CompressionFault::kCodecType: Str(ctx, *v, n::kCodec); break;  // throws, worded as every string field
      case CompressionFault::kUnknownCodec: ctx.Unsupported("unknown compression codec '" + x.get<std::string>() + "'");
      case CompressionFault::kLevel: ctx.Fail("zstd level " + x.dump() + " is out of range");
    }
    ctx.Fail("'compression' is not valid");
  });
}

// A v1 chunk object: a tensor's chunk, or a bytes entry's own members (FORMAT.md §3.2).
ChunkMeta CheckChunk(const Ctx& ctx, const Json& c, bool tensor_chunk, int max_rank) {
  ChunkMeta m;
  if (tensor_chunk) {
    m.box.offsets = Dims(ctx, c, n::kOffsets, max_rank);
    m.box.sizes = Dims(ctx, c, n::kSizes, max_rank);
  }
  m.file = Str(ctx, c, n::kFile);
  m.dataset = Str(ctx, c, n::kDataset);
  if (m.dataset.empty()) ctx.Fail("empty dataset name");
  m.checksum = Str(ctx, c, n::kChecksum);
  if (!format::IsChecksum(m.checksum)) {
    ctx.Fail("checksum '" + m.checksum + "' is not of the form xxh3-64:<16 hex digits>");
  }
  if (const Json* stored = Member(c, n::kStoredBytes)) m.stored_bytes = NonNeg(ctx, *stored, n::kStoredBytes);
  m.compression = CheckCompression(ctx, c, format::LevelRule::kInRange);
  m.stats = CheckStats(ctx, c);
  return m;
}

// --- entries (FORMAT.md §3.2) ----------------------------------------------------------

// What an entry's checks need of the rest of the document.
struct DocContext {
  int version = 1;
  const FileIndex* files;  // name -> position in 'files'
  std::size_t num_files = 0;
  const ParseLimits* limits;
};

DType CheckDType(const Ctx& ctx, const Json& e) {
  const std::string& name = Str(ctx, e, n::kDType);
  const auto dt = DTypeFromName(name);
  if (!dt) ctx.Unsupported("unknown dtype '" + name + "'");
  return *dt;
}

void CheckFile(const Ctx& ctx, const ChunkMeta& c, const FileIndex& files) {
  if (!IsSafeFileName(c.file)) ctx.Fail("file name '" + c.file + "' is not a plain file name");
  if (!files.count(c.file)) ctx.Fail("file '" + c.file + "' is not listed in 'files'");
}

// A v1 tensor's chunks: each checked alone, then, those before the first that failed,
// against the shape and the files; the failure after them.
void CheckTensorChunks(const Ctx& ctx, const Json& e, const DocContext& doc, EntryMeta& m) {
  const Json* chunks = Member(e, n::kChunks);
  if (!chunks) ctx.Fail("missing field 'chunks'");
  if (!chunks->is_array()) ctx.Fail("'chunks' must be an array");
  std::exception_ptr problem;
  for (const Json& c : *chunks) {
    try {
      if (!c.is_object()) ctx.Fail("a chunk must be an object");
      m.chunks.push_back(CheckChunk(ctx, c, /*tensor_chunk=*/true, doc.limits->max_rank));
    } catch (const Error&) {
      problem = std::current_exception();
      break;
    }
  }
  for (const ChunkMeta& chunk : m.chunks) {
    if (chunk.box.offsets.size() != m.shape.size() || chunk.box.sizes.size() != m.shape.size()) {
      ctx.Fail("chunk " + chunk.box.ToString() + " has a different rank than shape " + format::DimsText(m.shape));
    }
    for (std::size_t d = 0; d < m.shape.size(); ++d) {
      int64_t end;
      if (__builtin_add_overflow(chunk.box.offsets[d], chunk.box.sizes[d], &end)) {
        internal::CheckedAdd(chunk.box.offsets[d], chunk.box.sizes[d],
                             std::string(ctx.source) + ": " + ctx.Where());  // throws
      }
      if (end > m.shape[d]) ctx.Fail("chunk " + chunk.box.ToString() + " lies outside shape " + format::DimsText(m.shape));
    }
    CheckFile(ctx, chunk, *doc.files);
  }
  if (problem) std::rethrow_exception(problem);
  format::DeriveLayout(m, m.chunks, *doc.files);
}

void CheckTensor(const Ctx& ctx, const Json& e, const DocContext& doc, EntryMeta& m) {
  m.kind = EntryKind::kTensor;
  m.dtype = CheckDType(ctx, e);
  m.shape = Dims(ctx, e, n::kShape, doc.limits->max_rank);
  const int64_t elements = [&] {
    try {
      return NumElements(m.shape);
    } catch (const Error&) {
      ctx.Fail("shape " + format::DimsText(m.shape) + " has more elements than fit in 64 bits");
    }
  }();
  int64_t bytes;
  if (__builtin_mul_overflow(elements, static_cast<int64_t>(DTypeSize(m.dtype)), &bytes)) {
    internal::CheckedMul(elements, static_cast<int64_t>(DTypeSize(m.dtype)),
                         std::string(ctx.source) + ": " + ctx.Where());  // throws, worded as ever
  }
  if (doc.version < 2) return CheckTensorChunks(ctx, e, doc, m);
  m.layout = format::ReadLayout(ctx, e, m.shape, doc.num_files, doc.limits->max_rank);
  m.stats = CheckStats(ctx, e);
  if (const Json* stored = Member(e, n::kStoredBytes)) m.stored_bytes = static_cast<uint64_t>(NonNeg(ctx, stored, n::kStoredBytes));
  m.compression = CheckCompression(ctx, e, format::LevelRule::kClamped);
}

void CheckScalar(const Ctx& ctx, const Json& e, EntryMeta& m) {
  m.kind = EntryKind::kScalar;
  m.dtype = CheckDType(ctx, e);
  const Json* v = Member(e, n::kValue);
  if (!v) ctx.Fail("missing field 'value'");
  if (!v->is_number() && !v->is_boolean()) ctx.Fail("a scalar value must be a number or boolean");
  // Readers convert an integer or bool scalar to int64_t (FORMAT.md §9.5): a value
  // outside its range would wrap, or be undefined behaviour when it is a float.
  if (!IsFloating(m.dtype) && ((v->is_number_unsigned() && !format::IsNonNegativeInt64(*v)) ||
                               (v->is_number_float() && !(v->get<double>() >= -0x1p63 && v->get<double>() < 0x1p63)))) {
    ctx.Fail("scalar value " + v->dump() + " does not fit dtype " + std::string(DTypeName(m.dtype)));
  }
  m.value = v->dump();
}

void CheckBytes(const Ctx& ctx, const Json& e, const DocContext& doc, EntryMeta& m) {
  m.kind = EntryKind::kBytes;
  m.dtype = DType::kUInt8;
  m.size = static_cast<uint64_t>(NonNeg(ctx, Member(e, n::kSize), n::kSize));
  if (m.size > (uint64_t{1} << 62)) ctx.Fail("size " + std::to_string(m.size) + " is absurd");
  if (doc.version >= 2) {
    const Json* file = Member(e, n::kFile);
    if (!file) ctx.Fail("missing field 'file'");
    if (!file->is_number_unsigned() || file->get<uint64_t>() >= doc.num_files) {
      ctx.Fail("'file' must be the number of one of the " + std::to_string(doc.num_files) + " in 'files', found " +
               file->dump());
    }
    m.layout.kind = TensorLayout::Kind::kChunks;
    m.layout.pieces.push_back({Box{{0}, {static_cast<int64_t>(m.size)}}, static_cast<int32_t>(file->get<uint64_t>())});
    if (const Json* stored = Member(e, n::kStoredBytes)) m.stored_bytes = static_cast<uint64_t>(NonNeg(ctx, stored, n::kStoredBytes));
    return;
  }
  ChunkMeta chunk = CheckChunk(ctx, e, /*tensor_chunk=*/false, doc.limits->max_rank);
  chunk.box = Box{{0}, {static_cast<int64_t>(m.size)}};
  CheckFile(ctx, chunk, *doc.files);
  m.chunks.push_back(std::move(chunk));
  format::DeriveLayout(m, m.chunks, *doc.files);
}

EntryMeta CheckEntry(const Ctx& ctx, const Json& e, const DocContext& doc) {
  EntryMeta m;
  const std::string& type = Str(ctx, e, n::kType);
  if (doc.version >= 2 && e.contains(n::kChunks)) ctx.Fail("a version 2 entry has a 'layout', not 'chunks'");
  if (type == EntryKindName(EntryKind::kTensor)) {
    CheckTensor(ctx, e, doc, m);
  } else if (type == EntryKindName(EntryKind::kScalar)) {
    CheckScalar(ctx, e, m);
  } else if (type == EntryKindName(EntryKind::kBytes)) {
    CheckBytes(ctx, e, doc, m);
  } else if (type == EntryKindName(EntryKind::kJson)) {
    m.kind = EntryKind::kJson;
    const Json* v = Member(e, n::kValue);
    if (!v) ctx.Fail("missing field 'value'");
    m.value = v->dump();
  } else {
    ctx.Fail("unknown entry type '" + type + "'");
  }
  return m;
}

// --- the document ------------------------------------------------------------------------

// Top-level members are kept, then checked in the fixed order when the text ends; the
// elements of 'files' and the entries are checked one by one as they come (the entries
// read again, in a second pass over the text, when they come before 'files' or
// 'format_version': nothing of them is kept meanwhile), the first problem of each list kept
// for its turn.
class MetadataReader final : public format::JsonVisitor {
 public:
  MetadataReader(std::string_view text, std::string_view source, const ParseLimits& limits)
      : text_(text), ctx_{source, nullptr}, limits_(limits) {}

  bool Descend(const format::JsonPath& path, bool object) override {
    if (path.empty()) return object;
    if (path.size() != 1) return false;
    if (again_) return path[0] == n::kEntries || path[0] == n::kFiles;  // the entries; files streamed past
    if (path[0] == n::kFiles && !object) return files_given_ = true;
    if (path[0] == n::kEntries && object) {
      entries_given_ = true;
      entries_now_ = top_.count(n::kFormatVersion) && files_given_;
      return true;
    }
    return false;
  }

  void Value(const format::JsonPath& path, Json&& v) override {
    if (again_) {
      if (path.size() == 2 && path[0] == n::kEntries) ReadEntry(path[1], v);
    } else if (path.empty()) {
      not_object_ = true;
    } else if (path.size() == 1) {
      top_[path[0]] = std::move(v);
    } else if (path[0] == n::kFiles) {
      if (!files_problem_) ReadFile(std::move(v));
    } else if (entries_now_) {
      ReadEntry(path[1], v);
    }
  }

  Metadata Finish();

 private:
  const Json* Top(const char* key) const {
    const auto it = top_.find(key);
    return it == top_.end() ? nullptr : &it->second;
  }
  void CheckHead();
  void ReadFile(Json&& f);
  void ReadEntry(const std::string& key, const Json& e);
  // The document's version as far as it reads (its checks come first, when it ends).
  int Version() const {
    const Json* v = Top(n::kFormatVersion);
    if (v && v->is_number_unsigned() && v->get<uint64_t>() >= 2 &&
        v->get<uint64_t>() <= static_cast<uint64_t>(kFormatVersion)) {
      return static_cast<int>(v->get<uint64_t>());
    }
    return 1;
  }

  std::string_view text_;
  bool again_ = false;  // the second pass, for the entries alone
  Ctx ctx_;
  const ParseLimits& limits_;
  Metadata m_;
  std::unordered_map<std::string, Json> top_;  // the top-level members but files and entries
  bool not_object_ = false, files_given_ = false, entries_given_ = false, entries_now_ = false;
  FileIndex file_index_;
  std::exception_ptr files_problem_, entries_problem_;
};

void MetadataReader::ReadFile(Json&& f) {
  try {
    if (!f.is_object()) ctx_.Fail("an element of 'files' must be an object");
    FileMeta fm;
    fm.name = TakeStr(ctx_, f, n::kName);
    if (!IsSafeFileName(fm.name)) ctx_.Fail("file name '" + fm.name + "' is not a plain file name");
    if (!file_index_.emplace(fm.name, static_cast<int32_t>(m_.files.size())).second) {
      ctx_.Fail("file '" + fm.name + "' is listed twice");
    }
    const int64_t rank = NonNeg(ctx_, Member(f, n::kRank), n::kRank);
    if (rank > format::kMaxRanks) {
      ctx_.Fail("file '" + fm.name + "' has rank " + std::to_string(rank) + " (limit " +
                std::to_string(format::kMaxRanks) + ")");
    }
    fm.rank = static_cast<int>(rank);
    fm.bytes = static_cast<uint64_t>(NonNeg(ctx_, Member(f, n::kBytes), n::kBytes));
    if (Member(f, n::kIndex)) {
      fm.index = TakeStr(ctx_, f, n::kIndex);
      if (!format::IsChecksum(fm.index)) {
        ctx_.Fail("file '" + fm.name + "': index digest '" + fm.index + "' is not of the form xxh3-64:<16 hex digits>");
      }
    }
    // §3.1: where the index text lies, both or neither; a hint, checked by the reader that
    // uses it (inside the file, then the digest), ignored by those that read the attribute.
    const Json* at = Member(f, n::kIndexOffset);
    const Json* len = Member(f, n::kIndexBytes);
    if (at || len) {
      if (!at || !len) ctx_.Fail("file '" + fm.name + "': index_offset and index_bytes come together");
      fm.index_offset = static_cast<uint64_t>(NonNeg(ctx_, at, n::kIndexOffset));
      fm.index_bytes = static_cast<uint64_t>(NonNeg(ctx_, len, n::kIndexBytes));
      if (fm.index_bytes == 0) ctx_.Fail("file '" + fm.name + "': index_bytes is 0 (an index is never empty)");
    }
    m_.files.push_back(std::move(fm));
  } catch (const Error&) {
    files_problem_ = std::current_exception();
  }
}

void MetadataReader::ReadEntry(const std::string& key, const Json& e) {
  if (entries_problem_) return;
  try {
    if (std::string why = KeyProblem(key); !why.empty()) ctx_.Fail("entries: " + why);
    const Ctx ectx{ctx_.source, &key};
    if (!e.is_object()) ectx.Fail("an entry must be an object");
    EntryMeta entry = CheckEntry(ectx, e, DocContext{Version(), &file_index_, m_.files.size(), &limits_});
    m_.entries.emplace_back(key, std::move(entry));
  } catch (const Error&) {
    entries_problem_ = std::current_exception();
  }
}

// format, format_version, state_dict_type, world_size and the optional members.
void MetadataReader::CheckHead() {
  Metadata& m = m_;
  if (Str(ctx_, Top(n::kFormat), n::kFormat) != n::kFormatName) ctx_.Fail("'format' is not \"ckpt\"");
  const Json* version = Top(n::kFormatVersion);
  if (!version) ctx_.Fail("missing field 'format_version'");
  if (!version->is_number_integer()) ctx_.Fail("'format_version' must be an integer");
  // Compared in 64 bits before narrowing: 4294967297 must not wrap to 1.
  if (version->is_number_unsigned() ? version->get<uint64_t>() > static_cast<uint64_t>(kFormatVersion)
                                    : version->get<int64_t>() > kFormatVersion) {
    throw Error(ErrorCode::kUnsupported, std::string(ctx_.source) + ": format_version " + version->dump() +
                                             " is newer than this library supports (" +
                                             std::to_string(kFormatVersion) + ")");
  }
  const int64_t v = version->get<int64_t>();
  if (v < 1) ctx_.Fail("format_version " + version->dump() + " is invalid");
  m.format_version = static_cast<int>(v);
  const std::string& type = Str(ctx_, Top(n::kStateDictType), n::kStateDictType);
  const auto sdt = StateDictTypeFromName(type);
  if (!sdt) ctx_.Fail("unknown state_dict_type '" + type + "' (FULL, SHARDED or LOCAL)");
  m.state_dict_type = *sdt;
  const int64_t world_size = NonNeg(ctx_, Top(n::kWorldSize), n::kWorldSize);
  if (world_size > format::kMaxRanks) {
    ctx_.Fail("world_size " + std::to_string(world_size) + " is absurd (limit " + std::to_string(format::kMaxRanks) +
              ")");
  }
  m.world_size = static_cast<int>(world_size);
  if (m.world_size < 1) ctx_.Fail("world_size must be at least 1");
  if (const Json* s = Top(n::kLibraryVersion); s && s->is_string()) m.library_version = s->get<std::string>();
  if (const Json* s = Top(n::kCreated); s && s->is_string()) m.created = s->get<std::string>();
  const Json* mesh = Top(n::kMesh);
  const Json* user = Top(n::kUser);
  m.mesh = mesh ? mesh->dump() : "null";
  m.user = user ? user->dump() : "{}";
  if (const Json* t = Top(n::kSaveTimings)) m.save_timings = format::ReadTimings(ctx_, *t, m.world_size);
}

Metadata MetadataReader::Finish() {
  if (not_object_) ctx_.Fail("the document must be a JSON object");
  CheckHead();
  if (!files_given_) {
    if (!Top(n::kFiles)) ctx_.Fail("missing field 'files'");
    ctx_.Fail("'files' must be an array");
  }
  if (files_problem_) std::rethrow_exception(files_problem_);
  if (!entries_given_) {
    if (!Top(n::kEntries)) ctx_.Fail("missing field 'entries'");
    ctx_.Fail("'entries' must be an object");
  }
  if (!entries_now_) {  // the entries came before 'files' or the version: read them again
    again_ = entries_now_ = true;
    format::ReadJson(text_, limits_.max_depth, *this);  // the first pass found no JSON problem
  }
  if (entries_problem_) std::rethrow_exception(entries_problem_);
  Metadata& m = m_;
  if (m.format_version >= 2) {
    for (const FileMeta& f : m.files) {
      if (f.index.empty()) ctx_.Fail("file '" + f.name + "' has no 'index' digest (version 2)");
    }
    m.resolved = m.entries.empty() || std::none_of(m.entries.begin(), m.entries.end(), [](const auto& kv) {
      return kv.second.kind == EntryKind::kTensor || kv.second.kind == EntryKind::kBytes;
    });
  }
  m.BuildIndex();
  return std::move(m_);
}

bool IsJsonSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// FORMAT.md §3.6: where the document's own digest member begins (the last `"digest"` of
// the text, which must be followed by `: "xxh3-64:<16 hex>"` and the closing brace only),
// and the digest it states. nullopt when the text does not end that way.
std::optional<std::pair<std::size_t, std::string>> FindDigest(std::string_view text) {
  const std::string quoted = std::string("\"") + n::kDigest + "\"";
  const std::size_t at = text.rfind(quoted);
  if (at == std::string_view::npos) return std::nullopt;
  std::size_t i = at + quoted.size();
  const auto skip = [&] {
    while (i < text.size() && IsJsonSpace(text[i])) ++i;
  };
  skip();
  if (i >= text.size() || text[i++] != ':') return std::nullopt;
  skip();
  if (i >= text.size() || text[i++] != '"') return std::nullopt;
  const std::size_t begin = i;
  while (i < text.size() && text[i] != '"') ++i;
  if (i >= text.size()) return std::nullopt;
  std::string value(text.substr(begin, i - begin));
  ++i;
  skip();
  if (i >= text.size() || text[i++] != '}') return std::nullopt;
  skip();
  if (i != text.size()) return std::nullopt;
  return std::make_pair(at, std::move(value));
}

}  // namespace

Metadata ParseMetadata(std::string_view text, std::string_view source, const ParseLimits& limits) {
  if (text.size() > limits.max_bytes) {
    Corrupt(source, std::to_string(text.size()) + " bytes exceeds the limit of " + std::to_string(limits.max_bytes));
  }
  // The digest is checked before anything in the text is believed (FORMAT.md §3.6).
  const auto digest = FindDigest(text);
  if (digest) {
    if (!format::IsChecksum(digest->second)) {
      Corrupt(source, "digest '" + digest->second + "' is not of the form xxh3-64:<16 hex digits>");
    }
    const std::string got = format::DigestOf(text.substr(0, digest->first));
    if (got != digest->second) {
      Corrupt(source, "digest mismatch: the file says " + digest->second + ", its content hashes to " + got +
                          " (it was changed or damaged after it was written)");
    }
  }
  MetadataReader reader(text, source, limits);
  if (const auto problem = format::ReadJson(text, limits.max_depth, reader)) {
    Corrupt(source, (problem->syntax ? "invalid JSON: " : "") + problem->what);
  }
  Metadata m = reader.Finish();
  if (m.format_version >= 2 && !digest) {
    Corrupt(source, "no digest: a version " + std::to_string(m.format_version) +
                        " metadata.json ends with its \"digest\" member (FORMAT.md §3.6); it is truncated or damaged");
  }
  return m;
}

}  // namespace ckpt
