// format/metadata.cc: metadata.json <-> Metadata (FORMAT.md §3), with the reader's limits
// (§8): size, nesting depth, duplicate keys, unsafe file names, overflowing shapes.
//
// Reading is one pass over the text with a pull reader (format/json_reader.h) straight
// into the model: no tree of the whole document, which for 100,000 keys took seconds and
// several times the text's size in memory. The checks and their messages are those of the
// two-pass parser that came before, in the same order of precedence: a JSON problem
// anywhere (syntax, depth, duplicate key) wins over any problem of meaning, which is
// reported as the checks meet it in their fixed order (format, format_version,
// state_dict_type, world_size, files, then the entries in document order; within an
// entry its fields in a fixed order). So the fields of an object are read first and
// checked when the object ends, and the first problem of meaning is kept while the rest
// of the document is still read for JSON problems.
#include "ckpt/metadata.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>
#include <xxhash.h>

#include "ckpt/error.h"
#include "format/checked.h"
#include "format/flat_index.h"
#include "format/grid.h"
#include "format/json_text.h"
#include "format/json_reader.h"
#include "format/names.h"

namespace ckpt {
namespace {

using json = nlohmann::json;           // values kept as JSON text are normalised by dump()
using ojson = nlohmann::ordered_json;  // writing small objects in a readable order
using internal::JsonError;
using internal::JsonReader;
using internal::KeySet;
using Next = JsonReader::Next;
using NumberKind = JsonReader::NumberKind;
namespace n = names;

// Ranks and world sizes beyond this are corruption, not a job (FORMAT.md §8).
constexpr int64_t kMaxRanks = int64_t{1} << 30;

[[noreturn]] void Corrupt(std::string_view source, const std::string& what) {
  throw Error(ErrorCode::kCorrupt, std::string(source) + ": " + what);
}

// Where a problem is: the file, and the entry's key when in an entry.
struct Ctx {
  std::string_view source;
  const std::string* key = nullptr;

  std::string Where() const { return key ? "entry '" + *key + "'" : std::string(); }
  Error Problem(const std::string& what) const {
    const std::string where = Where();
    return Error(ErrorCode::kCorrupt, std::string(source) + ": " + (where.empty() ? what : where + ": " + what));
  }
  [[noreturn]] void Fail(const std::string& what) const { throw Problem(what); }
  [[noreturn]] void Unsupported(const std::string& what) const {
    throw Error(ErrorCode::kUnsupported, std::string(source) + ": " + Where() + ": " + what);
  }
};

// A value's text as nlohmann::json::dump() writes it (what the model keeps for JSON
// values, and what messages quote).
std::string Dump(std::string_view text) {
  try {
    return json::parse(text).dump();
  } catch (const json::exception&) {
    throw JsonError{};  // the reader accepted what nlohmann::json refuses: explained by the caller
  }
}

// One value as read, checked later: whether it was there, its type, a scalar's value,
// and its text for messages.
struct Val {
  bool present = false;
  Next type = Next::kNull;
  bool boolean = false;
  JsonReader::Number num;
  std::string str;
  std::string_view text;

  bool IsInteger() const { return type == Next::kNumber && num.kind != NumberKind::kFloat; }
  bool IsUnsigned() const { return type == Next::kNumber && num.kind == NumberKind::kUint; }
  std::string Dump() const {
    switch (type) {
      case Next::kNumber:
        return num.kind == NumberKind::kUint ? json(num.u).dump()
               : num.kind == NumberKind::kInt ? json(num.i).dump() : json(num.d).dump();
      case Next::kBool: return boolean ? "true" : "false";
      case Next::kNull: return "null";
      default: return ckpt::Dump(text);
    }
  }
};

void Read(JsonReader& r, Val& v) {
  v.present = true;
  v.type = r.Peek();
  const char* start = r.pos();
  switch (v.type) {
    case Next::kString: v.str.assign(r.ReadString()); break;
    case Next::kNumber: v.num = r.ReadNumber(); break;
    case Next::kBool: v.boolean = r.ReadBool(); break;
    case Next::kNull: r.ReadNull(); break;
    case Next::kArray:
    case Next::kObject: r.Skip(); break;
  }
  v.text = std::string_view(start, static_cast<std::size_t>(r.pos() - start));
}

// Calls field(key) for each member of the object that comes next; field reads the value.
template <class F>
void Members(JsonReader& r, F&& field) {
  r.BeginObject();
  KeySet keys;
  bool first = true;
  std::string_view key;
  while (r.NextMember(&first, keys, &key)) field(key);
}

// A value that should be an object: its members go to field(key); anything else to `whole`.
template <class F>
void ReadObject(JsonReader& r, Val& whole, F&& field) {
  if (r.Peek() != Next::kObject) return Read(r, whole);
  whole.present = true;
  whole.type = Next::kObject;
  Members(r, field);
}

// An array of dimensions (shape, offsets, sizes): its elements while they are valid, and
// the first element that is not a non-negative 64-bit integer.
struct Dims {
  Val field;
  std::size_t count = 0;
  Shape values;
  Val bad;  // bad.present: there is one
};

void Read(JsonReader& r, Dims& d, int max_rank) {
  d.count = 0;
  d.values.clear();
  d.bad.present = false;
  if (r.Peek() != Next::kArray) return Read(r, d.field);
  d.field.present = true;
  d.field.type = Next::kArray;
  r.BeginArray();
  bool first = true;
  while (r.NextElement(&first)) {
    if (++d.count > static_cast<std::size_t>(max_rank) || d.bad.present) {
      r.Skip();
      continue;
    }
    Read(r, d.bad);
    if (d.bad.IsUnsigned() && d.bad.num.u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      d.values.push_back(static_cast<int64_t>(d.bad.num.u));
      d.bad.present = false;
    }
  }
}

// The fields of a chunk: a tensor's chunk object, or a bytes entry's own fields.
struct RawChunk {
  Dims offsets, sizes;
  Val file, dataset, checksum, stored_bytes;
  Val compression, codec, level;
  Val stats, min, max, mean, l2, nan_count, inf_count, finite_count;

  void Clear() {
    for (Val* v : {&offsets.field, &sizes.field, &file, &dataset, &checksum, &stored_bytes, &compression, &codec,
                   &level, &stats, &min, &max, &mean, &l2, &nan_count, &inf_count, &finite_count}) {
      v->present = false;
    }
  }
};

// Reads the value of member `key` if it is a chunk field; false if it is not one.
bool ReadChunkField(JsonReader& r, std::string_view key, RawChunk& c, bool tensor_chunk, int max_rank) {
  if (tensor_chunk && key == n::kOffsets) {
    Read(r, c.offsets, max_rank);
  } else if (tensor_chunk && key == n::kSizes) {
    Read(r, c.sizes, max_rank);
  } else if (key == n::kFile) {
    Read(r, c.file);
  } else if (key == n::kDataset) {
    Read(r, c.dataset);
  } else if (key == n::kChecksum) {
    Read(r, c.checksum);
  } else if (key == n::kStoredBytes) {
    Read(r, c.stored_bytes);
  } else if (key == n::kCompression) {
    ReadObject(r, c.compression, [&](std::string_view k) {
      if (k == n::kCodec) Read(r, c.codec);
      else if (k == n::kLevel) Read(r, c.level);
      else r.Skip();
    });
  } else if (key == n::kStats) {
    ReadObject(r, c.stats, [&](std::string_view k) {
      if (k == "min") Read(r, c.min);
      else if (k == "max") Read(r, c.max);
      else if (k == "mean") Read(r, c.mean);
      else if (k == "l2") Read(r, c.l2);
      else if (k == "nan_count") Read(r, c.nan_count);
      else if (k == "inf_count") Read(r, c.inf_count);
      else if (k == "finite_count") Read(r, c.finite_count);
      else r.Skip();
    });
  } else {
    return false;
  }
  return true;
}

// --- the checks, on values already read -------------------------------------------------

std::string FormatDims(const Shape& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

bool IsValidChecksum(const std::string& s) {
  const std::string_view prefix = n::kChecksumPrefix;
  if (s.size() != prefix.size() + 16 || s.compare(0, prefix.size(), prefix) != 0) return false;
  for (std::size_t i = prefix.size(); i < s.size(); ++i) {
    const char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string& Str(const Ctx& ctx, Val& v, const char* key) {
  if (!v.present) ctx.Fail(std::string("missing field '") + key + "'");
  if (v.type != Next::kString) ctx.Fail(std::string("field '") + key + "' must be a string");
  return v.str;
}

int64_t NonNeg(const Ctx& ctx, const Val& v, const std::string& what) {
  if (v.IsUnsigned()) {
    if (v.num.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) ctx.Fail(what + " is too large");
    return static_cast<int64_t>(v.num.u);
  }
  if (v.IsInteger()) ctx.Fail(what + " is negative (" + v.Dump() + ")");
  ctx.Fail(what + " must be a non-negative integer, found " + v.Dump());
}

int64_t NonNeg(const Ctx& ctx, const Val& v, const char* key) {
  if (!v.present) ctx.Fail(std::string("missing field '") + key + "'");
  return NonNeg(ctx, v, std::string("field '") + key + "'");
}

Shape CheckDims(const Ctx& ctx, Dims& d, const char* key, int max_rank) {
  if (!d.field.present) ctx.Fail(std::string("missing field '") + key + "'");
  if (d.field.type != Next::kArray) ctx.Fail(std::string("field '") + key + "' must be an array");
  if (d.count > static_cast<std::size_t>(max_rank)) {
    ctx.Fail(std::string("field '") + key + "' has " + std::to_string(d.count) + " dimensions, the limit is " +
             std::to_string(max_rank));
  }
  if (d.bad.present) NonNeg(ctx, d.bad, std::string("an element of '") + key + "'");
  return std::move(d.values);
}

double StatNumber(const Val& v) {
  return v.present && v.type == Next::kNumber ? v.num.AsDouble() : std::numeric_limits<double>::quiet_NaN();
}
json StatJson(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

std::optional<ChunkStats> CheckStats(const Ctx& ctx, RawChunk& c) {
  if (!c.stats.present || c.stats.type == Next::kNull) return std::nullopt;
  if (c.stats.type != Next::kObject) ctx.Fail("'stats' must be an object");
  ChunkStats s;
  s.min = StatNumber(c.min);
  s.max = StatNumber(c.max);
  s.mean = StatNumber(c.mean);
  s.l2 = StatNumber(c.l2);
  s.nan_count = NonNeg(ctx, c.nan_count, "nan_count");
  s.inf_count = NonNeg(ctx, c.inf_count, "inf_count");
  s.finite_count = NonNeg(ctx, c.finite_count, "finite_count");
  return s;
}

ChunkMeta CheckChunk(const Ctx& ctx, RawChunk& c, bool tensor_chunk, int max_rank) {
  ChunkMeta m;
  if (tensor_chunk) {
    m.box.offsets = CheckDims(ctx, c.offsets, n::kOffsets, max_rank);
    m.box.sizes = CheckDims(ctx, c.sizes, n::kSizes, max_rank);
  }
  m.file = std::move(Str(ctx, c.file, n::kFile));
  m.dataset = std::move(Str(ctx, c.dataset, n::kDataset));
  if (m.dataset.empty()) ctx.Fail("empty dataset name");
  m.checksum = std::move(Str(ctx, c.checksum, n::kChecksum));
  if (!IsValidChecksum(m.checksum)) {
    ctx.Fail("checksum '" + m.checksum + "' is not of the form xxh3-64:<16 hex digits>");
  }
  if (c.stored_bytes.present) m.stored_bytes = NonNeg(ctx, c.stored_bytes, std::string("stored_bytes"));
  if (c.compression.present && c.compression.type != Next::kNull) {
    if (c.compression.type != Next::kObject) ctx.Fail("'compression' must be an object");
    const std::string& codec = Str(ctx, c.codec, n::kCodec);
    if (codec != n::kZstd) ctx.Unsupported("unknown compression codec '" + codec + "'");
    m.compression.codec = Compression::Codec::kZstd;
    if (c.level.present && c.level.IsInteger()) {
      const double level = c.level.num.AsDouble();  // compared as a double: no wrap-around
      if (level < -131072 || level > 22) ctx.Fail("zstd level " + c.level.Dump() + " is out of range");
      m.compression.level = static_cast<int>(level);
    }
  }
  m.stats = CheckStats(ctx, c);
  return m;
}

// --- v2 layouts (FORMAT.md §3.3) -------------------------------------------------------

// A layout's JSON (small: rules and file numbers) is read as a tree.
int64_t LayoutInt(const Ctx& ctx, const json& v, const char* what) {
  if (!v.is_number_integer()) ctx.Fail(std::string("layout: '") + what + "' must be an integer");
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      ctx.Fail(std::string("layout: '") + what + "' is too large");
    }
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  return v.get<int64_t>();
}

int32_t FileNumber(const Ctx& ctx, const json& v, std::size_t num_files) {
  const int64_t f = LayoutInt(ctx, v, n::kFile);
  if (f < 0 || static_cast<uint64_t>(f) >= num_files) {
    ctx.Fail("file " + std::to_string(f) + " is not one of the " + std::to_string(num_files) + " in 'files'");
  }
  return static_cast<int32_t>(f);
}

std::vector<int64_t> LayoutDims(const Ctx& ctx, const json& v, const char* what, int max_rank) {
  if (!v.is_array()) ctx.Fail(std::string("layout: '") + what + "' must be an array");
  if (v.size() > static_cast<std::size_t>(max_rank)) ctx.Fail(std::string("layout: '") + what + "' has too many dimensions");
  std::vector<int64_t> out;
  for (const json& x : v) {
    const int64_t i = LayoutInt(ctx, x, what);
    if (i < 0) ctx.Fail(std::string("layout: an element of '") + what + "' is negative");
    out.push_back(i);
  }
  return out;
}

TensorLayout ParseLayout(const Ctx& ctx, const Val& v, const Shape& shape, std::size_t num_files, int max_rank) {
  if (!v.present) ctx.Fail("missing field 'layout'");
  if (v.type != Next::kObject) ctx.Fail("'layout' must be an object");
  TensorLayout l;
  try {
    const json j = json::parse(v.text);
    if (j.contains(n::kGrid) == j.contains(n::kChunks)) ctx.Fail("'layout' must hold either 'grid' or 'chunks'");
    if (j.contains(n::kChunks)) {
      l.kind = TensorLayout::Kind::kChunks;
      const json& chunks = j.at(n::kChunks);
      if (!chunks.is_array()) ctx.Fail("layout: 'chunks' must be an array");
      for (const json& c : chunks) {
        if (!c.is_object() || !c.contains(n::kOffsets) || !c.contains(n::kSizes) || !c.contains(n::kFile)) {
          ctx.Fail("layout: a chunk must be an object with 'offsets', 'sizes' and 'file'");
        }
        TensorLayout::Piece p;
        p.box.offsets = LayoutDims(ctx, c.at(n::kOffsets), n::kOffsets, max_rank);
        p.box.sizes = LayoutDims(ctx, c.at(n::kSizes), n::kSizes, max_rank);
        p.file = FileNumber(ctx, c.at(n::kFile), num_files);
        if (p.box.offsets.size() != shape.size() || p.box.sizes.size() != shape.size()) {
          ctx.Fail("chunk " + p.box.ToString() + " has a different rank than shape " + FormatDims(shape));
        }
        for (std::size_t d = 0; d < shape.size(); ++d) {
          int64_t end;
          if (__builtin_add_overflow(p.box.offsets[d], p.box.sizes[d], &end) || end > shape[d]) {
            ctx.Fail("chunk " + p.box.ToString() + " lies outside shape " + FormatDims(shape));
          }
        }
        l.pieces.push_back(std::move(p));
      }
    } else {
      l.kind = TensorLayout::Kind::kGrid;
      const json& grid = j.at(n::kGrid);
      if (!grid.is_array() || grid.size() != shape.size()) {
        ctx.Fail("layout: 'grid' must have one split per dimension of shape " + FormatDims(shape));
      }
      for (const json& d : grid) {
        DimSplit split;
        if (!d.is_object() || d.contains(n::kStep) == d.contains(n::kSizes)) {
          ctx.Fail("layout: a split must be an object with either 'step' or 'sizes'");
        }
        if (d.contains(n::kStep)) split.step = LayoutInt(ctx, d.at(n::kStep), n::kStep);
        else split.sizes = LayoutDims(ctx, d.at(n::kSizes), n::kSizes, std::numeric_limits<int>::max());
        l.grid.push_back(std::move(split));
      }
      const json& files = j.contains(n::kFiles) ? j.at(n::kFiles) : json();
      if (files.is_array()) {
        l.cell_files.reserve(files.size());
        for (const json& f : files) l.cell_files.push_back(FileNumber(ctx, f, num_files));
      } else if (files.is_object() && files.contains(n::kBase) && files.contains(n::kStrides)) {
        l.file_base = LayoutInt(ctx, files.at(n::kBase), n::kBase);
        const json& strides = files.at(n::kStrides);
        if (!strides.is_array()) ctx.Fail("layout: 'strides' must be an array");
        for (const json& t : strides) l.file_strides.push_back(LayoutInt(ctx, t, n::kStrides));
      } else {
        ctx.Fail("layout: 'files' must be an array of file numbers or {\"base\", \"strides\"}");
      }
    }
  } catch (const json::exception& e) {
    ctx.Fail(std::string("layout: ") + e.what());
  }
  if (const auto problems = grid::CheckLayout(ctx.key ? *ctx.key : std::string(), l, shape, num_files);
      !problems.empty()) {
    Corrupt(ctx.source, problems.front());
  }
  return l;
}

// The fields of an entry. A tensor's chunks are checked one by one as they are read
// (their own checks need nothing else); those that pass are kept, and reading stops
// keeping them at the first that fails, whose problem waits for the entry's own checks.
struct RawEntry {
  Val type, dtype, value, size, layout;
  Dims shape;
  Val chunks;
  std::vector<ChunkMeta> chunk_list;
  std::exception_ptr chunk_problem;
  RawChunk chunk;  // the chunk being read
  RawChunk own;    // a bytes entry's chunk fields

  void Clear() {
    for (Val* v : {&type, &dtype, &value, &size, &layout, &shape.field, &chunks}) v->present = false;
    chunk_list.clear();
    chunk_problem = nullptr;
    own.Clear();
  }
};

void ReadChunks(JsonReader& r, const Ctx& ctx, RawEntry& e, int max_rank) {
  if (r.Peek() != Next::kArray) return Read(r, e.chunks);
  e.chunks.present = true;
  e.chunks.type = Next::kArray;
  r.BeginArray();
  bool first = true;
  while (r.NextElement(&first)) {
    if (e.chunk_problem) {
      r.Skip();
      continue;
    }
    if (r.Peek() != Next::kObject) {
      r.Skip();
      e.chunk_problem = std::make_exception_ptr(ctx.Problem("a chunk must be an object"));
      continue;
    }
    e.chunk.Clear();
    Members(r, [&](std::string_view key) {
      if (!ReadChunkField(r, key, e.chunk, /*tensor_chunk=*/true, max_rank)) r.Skip();
    });
    try {
      e.chunk_list.push_back(CheckChunk(ctx, e.chunk, /*tensor_chunk=*/true, max_rank));
    } catch (const Error&) {
      e.chunk_problem = std::current_exception();
    }
  }
}

void ReadEntry(JsonReader& r, const Ctx& ctx, RawEntry& e, int max_rank) {
  e.Clear();
  Members(r, [&](std::string_view key) {
    if (key == n::kType) Read(r, e.type);
    else if (key == n::kDType) Read(r, e.dtype);
    else if (key == n::kShape) Read(r, e.shape, max_rank);
    else if (key == n::kChunks) ReadChunks(r, ctx, e, max_rank);
    else if (key == n::kValue) Read(r, e.value);
    else if (key == n::kSize) Read(r, e.size);
    else if (key == n::kLayout) Read(r, e.layout);
    else if (!ReadChunkField(r, key, e.own, /*tensor_chunk=*/false, max_rank)) r.Skip();
  });
}

// What an entry's checks need of the rest of the document.
struct DocContext {
  int version = 1;
  const std::unordered_map<std::string, int32_t>* files;  // name -> position in 'files'
  std::size_t num_files = 0;
};

// The layout of `chunks` (a v1 entry's, or a save's resolved ones) into m, and the
// aggregate of their stats and stored bytes.
void DeriveLayout(EntryMeta& m, const std::vector<ChunkMeta>& chunks,
                  const std::unordered_map<std::string, int32_t>& files) {
  std::vector<grid::PlacedBox> placed;
  placed.reserve(chunks.size());
  std::vector<const ChunkStats*> stats;
  stats.reserve(chunks.size());
  for (const ChunkMeta& c : chunks) {
    const auto it = files.find(c.file);
    placed.push_back({c.box, it == files.end() ? -1 : it->second});
    stats.push_back(c.stats ? &*c.stats : nullptr);
  }
  m.layout = m.kind == EntryKind::kBytes ? TensorLayout{} : grid::DescribeLayout(m.shape, placed);
  if (m.kind == EntryKind::kBytes) {
    m.layout.kind = TensorLayout::Kind::kChunks;
    m.layout.pieces.push_back({placed.at(0).box, placed.at(0).file});
  }
  if (m.kind == EntryKind::kTensor && IsFloating(m.dtype)) m.stats = CombineStats(stats);
  m.stored_bytes = 0;
  for (const ChunkMeta& c : chunks) {
    // saturating: the values come from the file
    m.stored_bytes = c.stored_bytes > UINT64_MAX - m.stored_bytes ? UINT64_MAX : m.stored_bytes + c.stored_bytes;
    if (c.compression.codec != Compression::Codec::kNone && m.compression.codec == Compression::Codec::kNone) {
      m.compression = c.compression;
    }
  }
}

void DeriveLayout(EntryMeta& m, const std::unordered_map<std::string, int32_t>& files) {
  DeriveLayout(m, m.chunks, files);
}

EntryMeta CheckEntry(const Ctx& ctx, RawEntry& e, const DocContext& doc, const ParseLimits& limits) {
  EntryMeta m;
  const auto& files = *doc.files;
  const bool v2 = doc.version >= 2;
  const std::string& type = Str(ctx, e.type, n::kType);
  auto parse_dtype = [&] {
    const std::string& name = Str(ctx, e.dtype, n::kDType);
    auto dt = DTypeFromName(name);
    if (!dt) ctx.Unsupported("unknown dtype '" + name + "'");
    return *dt;
  };
  auto check_file = [&](const ChunkMeta& c) {
    if (!IsSafeFileName(c.file)) ctx.Fail("file name '" + c.file + "' is not a plain file name");
    if (!files.count(c.file)) ctx.Fail("file '" + c.file + "' is not listed in 'files'");
  };
  if (v2 && e.chunks.present) ctx.Fail("a version 2 entry has a 'layout', not 'chunks'");
  if (type == "tensor") {
    m.kind = EntryKind::kTensor;
    m.dtype = parse_dtype();
    m.shape = CheckDims(ctx, e.shape, n::kShape, limits.max_rank);
    const int64_t elements = [&] {
      try {
        return NumElements(m.shape);
      } catch (const Error&) {
        ctx.Fail("shape " + FormatDims(m.shape) + " has more elements than fit in 64 bits");
      }
    }();
    int64_t bytes;
    if (__builtin_mul_overflow(elements, static_cast<int64_t>(DTypeSize(m.dtype)), &bytes)) {
      internal::CheckedMul(elements, static_cast<int64_t>(DTypeSize(m.dtype)),
                           std::string(ctx.source) + ": " + ctx.Where());  // throws, worded as ever
    }
    if (v2) {
      m.layout = ParseLayout(ctx, e.layout, m.shape, doc.num_files, limits.max_rank);
      m.stats = CheckStats(ctx, e.own);
      if (e.own.stored_bytes.present) m.stored_bytes = static_cast<uint64_t>(NonNeg(ctx, e.own.stored_bytes, n::kStoredBytes));
      if (e.own.compression.present && e.own.compression.type != Next::kNull) {
        if (e.own.compression.type != Next::kObject) ctx.Fail("'compression' must be an object");
        const std::string& codec = Str(ctx, e.own.codec, n::kCodec);
        if (codec != n::kZstd) ctx.Unsupported("unknown compression codec '" + codec + "'");
        m.compression.codec = Compression::Codec::kZstd;
        if (e.own.level.IsInteger()) m.compression.level = static_cast<int>(std::clamp<double>(e.own.level.num.AsDouble(), -131072, 22));
      }
      return m;
    }
    if (!e.chunks.present) ctx.Fail("missing field 'chunks'");
    if (e.chunks.type != Next::kArray) ctx.Fail("'chunks' must be an array");
    for (const ChunkMeta& chunk : e.chunk_list) {
      if (chunk.box.offsets.size() != m.shape.size() || chunk.box.sizes.size() != m.shape.size()) {
        ctx.Fail("chunk " + chunk.box.ToString() + " has a different rank than shape " + FormatDims(m.shape));
      }
      for (std::size_t d = 0; d < m.shape.size(); ++d) {
        int64_t end;
        if (__builtin_add_overflow(chunk.box.offsets[d], chunk.box.sizes[d], &end)) {
          internal::CheckedAdd(chunk.box.offsets[d], chunk.box.sizes[d],
                               std::string(ctx.source) + ": " + ctx.Where());  // throws
        }
        if (end > m.shape[d]) {
          ctx.Fail("chunk " + chunk.box.ToString() + " lies outside shape " + FormatDims(m.shape));
        }
      }
      check_file(chunk);
    }
    if (e.chunk_problem) std::rethrow_exception(e.chunk_problem);
    m.chunks = std::move(e.chunk_list);
    DeriveLayout(m, files);
  } else if (type == "scalar") {
    m.kind = EntryKind::kScalar;
    m.dtype = parse_dtype();
    const Val& v = e.value;
    if (!v.present) ctx.Fail("missing field 'value'");
    if (v.type != Next::kNumber && v.type != Next::kBool) ctx.Fail("a scalar value must be a number or boolean");
    // Readers convert an integer or bool scalar to int64_t (FORMAT.md §9.5): a value
    // outside its range would wrap, or be undefined behaviour when it is a float.
    if (!IsFloating(m.dtype) &&
        ((v.IsUnsigned() && v.num.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) ||
         (v.type == Next::kNumber && v.num.kind == NumberKind::kFloat && !(v.num.d >= -0x1p63 && v.num.d < 0x1p63)))) {
      ctx.Fail("scalar value " + v.Dump() + " does not fit dtype " + std::string(DTypeName(m.dtype)));
    }
    m.value = v.Dump();
  } else if (type == "bytes") {
    m.kind = EntryKind::kBytes;
    m.dtype = DType::kUInt8;
    m.size = static_cast<uint64_t>(NonNeg(ctx, e.size, n::kSize));
    if (m.size > (uint64_t{1} << 62)) ctx.Fail("size " + std::to_string(m.size) + " is absurd");
    if (v2) {
      if (!e.own.file.present) ctx.Fail("missing field 'file'");
      if (!e.own.file.IsUnsigned() || e.own.file.num.u >= doc.num_files) {
        ctx.Fail("'file' must be the number of one of the " + std::to_string(doc.num_files) + " in 'files', found " +
                 e.own.file.Dump());
      }
      m.layout.kind = TensorLayout::Kind::kChunks;
      m.layout.pieces.push_back({Box{{0}, {static_cast<int64_t>(m.size)}}, static_cast<int32_t>(e.own.file.num.u)});
      if (e.own.stored_bytes.present) m.stored_bytes = static_cast<uint64_t>(NonNeg(ctx, e.own.stored_bytes, n::kStoredBytes));
      return m;
    }
    ChunkMeta chunk = CheckChunk(ctx, e.own, /*tensor_chunk=*/false, limits.max_rank);
    chunk.box = Box{{0}, {static_cast<int64_t>(m.size)}};
    check_file(chunk);
    m.chunks.push_back(std::move(chunk));
    DeriveLayout(m, files);
  } else if (type == "json") {
    m.kind = EntryKind::kJson;
    if (!e.value.present) ctx.Fail("missing field 'value'");
    m.value = e.value.Dump();
  } else {
    ctx.Fail("unknown entry type '" + type + "'");
  }
  return m;
}

// §3.8: small, read as a tree. Members it does not know are ignored (§1.5).
[[noreturn]] void TimingsProblem(const Ctx& ctx, const std::string& what) {
  ctx.Fail(std::string(n::kSaveTimings) + ": " + what);
}

SaveTimings ParseTimings(const Ctx& ctx, const Val& v, int world_size) {
  if (v.type != Next::kObject) TimingsProblem(ctx, "must be an object");
  SaveTimings t;
  json j;
  try {
    j = json::parse(v.text);
  } catch (const json::exception& e) {
    TimingsProblem(ctx, e.what());
  }
  const auto mode = j.find(n::kMode);
  if (mode == j.end() || !mode->is_string() || (*mode != "sync" && *mode != "async")) {
    TimingsProblem(ctx, "'mode' must be \"sync\" or \"async\"");
  }
  t.async = *mode == "async";
  for (std::size_t i = 0; i < std::size(kSavePhaseNames); ++i) {
    const std::string name = kSavePhaseNames[i];
    const auto p = j.find(name);
    if (p == j.end() || !p->is_object()) TimingsProblem(ctx, "'" + name + "' must be an object");
    PhaseTiming& out = SavePhase(t, i);
    double* values[] = {&out.min, &out.median, &out.max};
    const char* keys[] = {"min", "median", "max"};
    for (int k = 0; k < 3; ++k) {
      const auto x = p->find(keys[k]);
      if (x == p->end() || !x->is_number() || !(x->get<double>() >= 0) || !std::isfinite(x->get<double>())) {
        TimingsProblem(ctx, "'" + name + "." + keys[k] + "' must be a non-negative number of seconds");
      }
      *values[k] = x->get<double>();
    }
    if (!(out.min <= out.median && out.median <= out.max)) TimingsProblem(ctx, "'" + name + "': min <= median <= max does not hold");
    const auto r = p->find(n::kSlowestRank);
    if (r == p->end() || !r->is_number_integer() || r->get<int64_t>() < 0 || r->get<int64_t>() >= world_size) {
      TimingsProblem(ctx, "'" + name + ".slowest_rank' must be a rank below world_size " + std::to_string(world_size));
    }
    out.slowest_rank = static_cast<int>(r->get<int64_t>());
  }
  return t;
}

// The whole document. Top-level fields are read, then checked in the fixed order when the
// document ends; `files` and `entries` are read and checked element by element, their
// first problem kept for its turn.
class MetadataParser {
 public:
  MetadataParser(std::string_view text, std::string_view source, const ParseLimits& limits)
      : text_(text), ctx_{source, nullptr}, limits_(limits) {}

  Metadata Run() {
    JsonReader r(text_, limits_.max_depth);
    if (r.Peek() != Next::kObject) {
      r.Skip();
      r.Finish();
      ctx_.Fail("the document must be a JSON object");
    }
    bool entries_later = false;  // `entries` came before `files`: read again at the end
    Members(r, [&](std::string_view key) {
      if (key == n::kFormat) Read(r, format_);
      else if (key == n::kFormatVersion) Read(r, version_);
      else if (key == n::kStateDictType) Read(r, state_dict_type_);
      else if (key == n::kWorldSize) Read(r, world_size_);
      else if (key == n::kLibraryVersion) Read(r, library_version_);
      else if (key == n::kCreated) Read(r, created_);
      else if (key == n::kMesh) Read(r, mesh_);
      else if (key == n::kUser) Read(r, user_);
      else if (key == n::kSaveTimings) Read(r, timings_);
      else if (key == n::kFiles) ReadFiles(r);
      else if (key == n::kEntries && files_.present && version_.present) ReadEntries(r);
      else if (key == n::kEntries) Read(r, entries_), entries_later = true;
      else r.Skip();
    });
    r.Finish();

    Metadata& m = m_;
    if (Str(ctx_, format_, n::kFormat) != n::kFormatName) ctx_.Fail("'format' is not \"ckpt\"");
    const Val& version = version_;
    if (!version.present) ctx_.Fail("missing field 'format_version'");
    if (!version.IsInteger()) ctx_.Fail("'format_version' must be an integer");
    // Compared in 64 bits before narrowing: 4294967297 must not wrap to 1.
    if (version.IsUnsigned() ? version.num.u > static_cast<uint64_t>(kFormatVersion) : version.num.i > kFormatVersion) {
      throw Error(ErrorCode::kUnsupported,
                  std::string(ctx_.source) + ": format_version " + version.Dump() +
                      " is newer than this library supports (" + std::to_string(kFormatVersion) + ")");
    }
    const int64_t v = version.IsUnsigned() ? static_cast<int64_t>(version.num.u) : version.num.i;
    if (v < 1) ctx_.Fail("format_version " + version.Dump() + " is invalid");
    m.format_version = static_cast<int>(v);
    const std::string& type = Str(ctx_, state_dict_type_, n::kStateDictType);
    auto sdt = StateDictTypeFromName(type);
    if (!sdt) ctx_.Fail("unknown state_dict_type '" + type + "' (FULL, SHARDED or LOCAL)");
    m.state_dict_type = *sdt;
    const int64_t world_size = NonNeg(ctx_, world_size_, n::kWorldSize);
    if (world_size > kMaxRanks) {
      ctx_.Fail("world_size " + std::to_string(world_size) + " is absurd (limit " + std::to_string(kMaxRanks) + ")");
    }
    m.world_size = static_cast<int>(world_size);
    if (m.world_size < 1) ctx_.Fail("world_size must be at least 1");
    if (library_version_.present && library_version_.type == Next::kString) m.library_version = library_version_.str;
    if (created_.present && created_.type == Next::kString) m.created = created_.str;
    m.mesh = mesh_.present ? mesh_.Dump() : "null";
    m.user = user_.present ? user_.Dump() : "{}";
    if (timings_.present) m.save_timings = ParseTimings(ctx_, timings_, m.world_size);

    if (!files_.present) ctx_.Fail("missing field 'files'");
    if (files_.type != Next::kArray) ctx_.Fail("'files' must be an array");
    if (files_problem_) std::rethrow_exception(files_problem_);
    if (!entries_.present) ctx_.Fail("missing field 'entries'");
    if (entries_.type != Next::kObject) ctx_.Fail("'entries' must be an object");
    if (entries_later) {
      JsonReader again(entries_.text, limits_.max_depth, /*depth=*/1);
      ReadEntries(again);
    }
    if (entries_problem_) std::rethrow_exception(entries_problem_);
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

 private:
  void ReadFiles(JsonReader& r) {
    if (r.Peek() != Next::kArray) return Read(r, files_);
    files_.present = true;
    files_.type = Next::kArray;
    r.BeginArray();
    bool first = true;
    Val name, rank, bytes, index;
    while (r.NextElement(&first)) {
      if (files_problem_) {
        r.Skip();
        continue;
      }
      if (r.Peek() != Next::kObject) {
        r.Skip();
        files_problem_ = std::make_exception_ptr(ctx_.Problem("an element of 'files' must be an object"));
        continue;
      }
      name.present = rank.present = bytes.present = index.present = false;
      Members(r, [&](std::string_view key) {
        if (key == n::kName) Read(r, name);
        else if (key == n::kRank) Read(r, rank);
        else if (key == n::kBytes) Read(r, bytes);
        else if (key == n::kIndex) Read(r, index);
        else r.Skip();
      });
      try {
        FileMeta fm;
        fm.name = Str(ctx_, name, n::kName);
        if (!IsSafeFileName(fm.name)) ctx_.Fail("file name '" + fm.name + "' is not a plain file name");
        if (!file_index_.emplace(fm.name, static_cast<int32_t>(m_.files.size())).second) {
          ctx_.Fail("file '" + fm.name + "' is listed twice");
        }
        const int64_t r64 = NonNeg(ctx_, rank, n::kRank);
        if (r64 > kMaxRanks) {
          ctx_.Fail("file '" + fm.name + "' has rank " + std::to_string(r64) + " (limit " +
                    std::to_string(kMaxRanks) + ")");
        }
        fm.rank = static_cast<int>(r64);
        fm.bytes = static_cast<uint64_t>(NonNeg(ctx_, bytes, n::kBytes));
        if (index.present) {
          fm.index = Str(ctx_, index, n::kIndex);
          if (!IsValidChecksum(fm.index)) ctx_.Fail("file '" + fm.name + "': index digest '" + fm.index + "' is not of the form xxh3-64:<16 hex digits>");
        }
        m_.files.push_back(std::move(fm));
      } catch (const Error&) {
        files_problem_ = std::current_exception();
      }
    }
  }

  void ReadEntries(JsonReader& r) {
    if (r.Peek() != Next::kObject) return Read(r, entries_);
    const char* start = r.pos();
    r.BeginObject();
    KeySet keys;
    bool first = true;
    std::string_view view;
    RawEntry raw;
    while (r.NextMember(&first, keys, &view)) {
      if (entries_problem_) {
        r.Skip();
        continue;
      }
      std::string key(view);
      if (std::string why = KeyProblem(key); !why.empty()) {
        r.Skip();
        entries_problem_ = std::make_exception_ptr(ctx_.Problem("entries: " + why));
        continue;
      }
      const Ctx ectx{ctx_.source, &key};
      if (r.Peek() != Next::kObject) {
        r.Skip();
        entries_problem_ = std::make_exception_ptr(ectx.Problem("an entry must be an object"));
        continue;
      }
      ReadEntry(r, ectx, raw, limits_.max_rank);
      try {
        EntryMeta e = CheckEntry(ectx, raw, DocContext{Version(), &file_index_, m_.files.size()}, limits_);
        m_.entries.emplace_back(std::move(key), std::move(e));
      } catch (const Error&) {
        entries_problem_ = std::current_exception();
      }
    }
    entries_.present = true;
    entries_.type = Next::kObject;
    entries_.text = std::string_view(start, static_cast<std::size_t>(r.pos() - start));
  }

  std::string_view text_;
  Ctx ctx_;
  const ParseLimits& limits_;
  Metadata m_;
  Val format_, version_, state_dict_type_, world_size_, library_version_, created_, mesh_, user_, timings_, files_,
      entries_;
  std::unordered_map<std::string, int32_t> file_index_;  // name -> position in 'files'

  // The document's version as far as it reads (its checks come first, when it ends).
  int Version() const {
    if (version_.IsUnsigned() && version_.num.u >= 2 && version_.num.u <= static_cast<uint64_t>(kFormatVersion)) {
      return static_cast<int>(version_.num.u);
    }
    return 1;
  }
  std::exception_ptr files_problem_, entries_problem_;
};

// Words for a document the reader found not to be JSON: those of nlohmann::json's parser,
// run again with the same limits (depth, duplicate keys), as before the one-pass reader.
class ProblemFinder : public nlohmann::json_sax<json> {
 public:
  explicit ProblemFinder(int max_depth) : max_depth_(max_depth) {}
  const std::string& problem() const { return problem_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return Enter();
  }
  bool key(string_t& k) override {
    if (!keys_.back().insert(k).second) return Fail("duplicate key '" + k + "'");
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    keys_.emplace_back();  // arrays have no keys; keeps keys_ aligned with depth
    return Enter();
  }
  bool end_array() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return Fail(std::string("invalid JSON: ") + e.what());
  }

 private:
  bool Enter() {
    if (++depth_ > max_depth_) return Fail("JSON nesting deeper than " + std::to_string(max_depth_));
    return true;
  }
  bool Fail(std::string why) {
    if (problem_.empty()) problem_ = std::move(why);
    return false;
  }
  int max_depth_;
  int depth_ = 0;
  std::vector<std::unordered_set<std::string>> keys_;
  std::string problem_;
};

std::string ExplainInvalidJson(std::string_view text, int max_depth, std::size_t offset) {
  ProblemFinder finder(max_depth);
  json::sax_parse(text.begin(), text.end(), &finder);
  if (!finder.problem().empty()) return finder.problem();
  return "invalid JSON at byte " + std::to_string(offset);
}

ojson StatsJson(const ChunkStats& s) {
  return {{"min", StatJson(s.min)},   {"max", StatJson(s.max)},         {"mean", StatJson(s.mean)},
          {"l2", StatJson(s.l2)},     {"nan_count", s.nan_count},       {"inf_count", s.inf_count},
          {"finite_count", s.finite_count}};
}

ojson ChunkJson(const ChunkMeta& c, bool tensor_chunk) {
  ojson j;
  if (tensor_chunk) {
    j[n::kOffsets] = c.box.offsets;
    j[n::kSizes] = c.box.sizes;
  }
  j[n::kFile] = c.file;
  j[n::kDataset] = c.dataset;
  j[n::kChecksum] = c.checksum;
  j[n::kStoredBytes] = c.stored_bytes;
  if (c.compression.codec == Compression::Codec::kZstd) {
    j[n::kCompression] = {{n::kCodec, n::kZstd}, {n::kLevel, c.compression.level}, {n::kShuffle, true}};
  }
  if (c.stats) j[n::kStats] = StatsJson(*c.stats);
  return j;
}

}  // namespace

std::string_view StateDictTypeName(StateDictType type) {
  switch (type) {
    case StateDictType::kFull: return "FULL";
    case StateDictType::kSharded: return "SHARDED";
    case StateDictType::kLocal: return "LOCAL";
  }
  return "?";
}

std::optional<StateDictType> StateDictTypeFromName(std::string_view name) {
  for (auto t : {StateDictType::kFull, StateDictType::kSharded, StateDictType::kLocal}) {
    if (StateDictTypeName(t) == name) return t;
  }
  return std::nullopt;
}

bool IsSafeFileName(std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.size() > 255) return false;
  for (char c : name) {
    if (c == '/' || c == '\\' || c == '\0') return false;
  }
  return true;
}

uint64_t EntryMeta::TensorBytes() const {
  return static_cast<uint64_t>(internal::CheckedMul(NumElements(shape), static_cast<int64_t>(DTypeSize(dtype)), "tensor"));
}

const EntryMeta* Metadata::Find(std::string_view key) const {
  // Entries appended since the index was built are searched in order; if entries were
  // removed, the index is not used at all. Nothing here writes to *this.
  std::size_t scan_from = 0;
  if (indexed_ <= entries.size()) {
    const std::size_t p = internal::IndexLookup(index_, std::hash<std::string_view>{}(key),
                                                [&](std::size_t i) { return entries[i].first == key; });
    if (p) return &entries[p - 1].second;
    scan_from = indexed_;
  }
  for (std::size_t i = scan_from; i < entries.size(); ++i) {
    if (entries[i].first == key) return &entries[i].second;
  }
  return nullptr;
}

void Metadata::BuildIndex() {
  std::size_t size = 16;
  while (size < 2 * entries.size()) size *= 2;  // at most half full: IndexInsert never grows it
  index_.assign(entries.empty() ? 0 : size, {0, 0});
  std::size_t count = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::string& key = entries[i].first;
    const std::size_t hash = std::hash<std::string_view>{}(key);
    // A repeated key (only a caller's own model can have one) finds its first entry.
    if (!internal::IndexLookup(index_, hash, [&](std::size_t j) { return entries[j].first == key; })) {
      internal::IndexInsert(index_, count, hash, i);
    }
  }
  indexed_ = entries.size();
}

namespace {

std::string DigestText(std::string_view bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  return std::string(n::kChecksumPrefix) + hex;
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
    if (!IsValidChecksum(digest->second)) {
      Corrupt(source, "digest '" + digest->second + "' is not of the form xxh3-64:<16 hex digits>");
    }
    const std::string got = DigestText(text.substr(0, digest->first));
    if (got != digest->second) {
      Corrupt(source, "digest mismatch: the file says " + digest->second + ", its content hashes to " + got +
                          " (it was changed or damaged after it was written)");
    }
  }
  Metadata m;
  try {
    m = MetadataParser(text, source, limits).Run();
  } catch (const JsonError& e) {
    if (!e.syntax) Corrupt(source, e.what);
    Corrupt(source, ExplainInvalidJson(text, limits.max_depth, e.offset));
  }
  if (m.format_version >= 2 && !digest) {
    Corrupt(source, "no digest: a version " + std::to_string(m.format_version) +
                        " metadata.json ends with its \"digest\" member (FORMAT.md §3.6); it is truncated or damaged");
  }
  return m;
}

void StatsAccumulator::Add(const ChunkStats* s) {
  if (parts_++ == 0) {
    out_.min = std::numeric_limits<double>::infinity();
    out_.max = -std::numeric_limits<double>::infinity();
  }
  if (!s) {
    ++missing_;
    return;
  }
  out_.nan_count += s->nan_count;
  out_.inf_count += s->inf_count;
  out_.finite_count += s->finite_count;
  if (s->finite_count == 0) return;
  out_.min = std::min(out_.min, s->min);
  out_.max = std::max(out_.max, s->max);
  sum_ += s->mean * static_cast<double>(s->finite_count);
  sumsq_ += s->l2 * s->l2;
}

std::optional<ChunkStats> StatsAccumulator::Result() const {
  if (parts_ == 0 || missing_ > 0) return std::nullopt;
  ChunkStats out = out_;
  if (out.finite_count > 0) {
    out.mean = sum_ / static_cast<double>(out.finite_count);
    out.l2 = std::sqrt(sumsq_);
  } else {
    out.min = out.max = out.mean = std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

StatsAccumulator::Sums StatsAccumulator::sums() const {
  Sums s;
  s.sum = sum_;
  s.sumsq = sumsq_;
  if (parts_ > 0) {
    s.min = out_.min;
    s.max = out_.max;
  }
  s.nan_count = out_.nan_count;
  s.inf_count = out_.inf_count;
  s.finite_count = out_.finite_count;
  s.parts = parts_;
  s.missing = missing_;
  return s;
}

StatsAccumulator StatsAccumulator::FromSums(const Sums& s) {
  StatsAccumulator a;
  a.sum_ = s.sum;
  a.sumsq_ = s.sumsq;
  a.out_.min = s.min;
  a.out_.max = s.max;
  a.out_.nan_count = s.nan_count;
  a.out_.inf_count = s.inf_count;
  a.out_.finite_count = s.finite_count;
  a.parts_ = s.parts;
  a.missing_ = s.missing;
  return a;
}

std::optional<ChunkStats> CombineStats(const std::vector<const ChunkStats*>& parts) {
  StatsAccumulator acc;
  for (const ChunkStats* s : parts) acc.Add(s);
  return acc.Result();
}

namespace {

// Seconds to the microsecond: what a clock read twice tells, without digits of noise.
double Microseconds(double s) { return std::round(s * 1e6) / 1e6; }

ojson TimingsJson(const SaveTimings& t) {
  ojson j;
  j[n::kMode] = t.async ? "async" : "sync";
  for (std::size_t i = 0; i < std::size(kSavePhaseNames); ++i) {
    const PhaseTiming& p = SavePhase(t, i);
    j[kSavePhaseNames[i]] = {{"min", Microseconds(p.min)},
                             {"median", Microseconds(p.median)},
                             {"max", Microseconds(p.max)},
                             {n::kSlowestRank, p.slowest_rank}};
  }
  return j;
}

void Field(std::string& out, const char* key, const ojson& value) {
  out += "  " + ojson(key).dump() + ": " + value.dump() + ",\n";
}

// The members every version writes first, in this order.
std::string Head(const Metadata& m) {
  std::string out = "{\n";
  Field(out, n::kFormat, n::kFormatName);
  Field(out, n::kFormatVersion, m.format_version);
  Field(out, n::kStateDictType, StateDictTypeName(m.state_dict_type));
  Field(out, n::kWorldSize, m.world_size);
  Field(out, n::kLibraryVersion, m.library_version);
  Field(out, n::kCreated, m.created);
  Field(out, n::kMesh, ojson::parse(m.mesh.empty() ? "null" : m.mesh));
  Field(out, n::kUser, ojson::parse(m.user.empty() ? "{}" : m.user));
  if (m.save_timings && m.format_version >= 2) Field(out, n::kSaveTimings, TimingsJson(*m.save_timings));
  return out;
}

// The members of a tensor or bytes entry that differ between versions (the others are
// written by Serialize).
void TensorMembersV1(const EntryMeta& e, ojson& j) {
  ojson chunks = ojson::array();
  for (const ChunkMeta& c : e.chunks) chunks.push_back(ChunkJson(c, true));
  j[n::kChunks] = std::move(chunks);
}

void BytesMembersV1(const EntryMeta& e, ojson& j) {
  const ojson chunk = ChunkJson(e.chunks.at(0), false);
  for (auto& [k, v] : chunk.items()) j[k] = v;
}

// A layout's JSON (FORMAT.md §3.3), its members in sorted order (as nlohmann::json, a
// std::map, wrote them before), without a tree: a checkpoint of many small tensors has one
// per tensor.
void LayoutText(const TensorLayout& l, std::string& out) {
  using internal::JsonObjectText;
  JsonObjectText j(out);
  if (l.kind == TensorLayout::Kind::kChunks) {
    j.Name(n::kChunks);
    out += '[';
    for (std::size_t i = 0; i < l.pieces.size(); ++i) {
      if (i) out += ',';
      JsonObjectText c(out);
      c.Name(n::kFile);
      c.Integer(l.pieces[i].file);
      c.Name(n::kOffsets);
      c.Integers(l.pieces[i].box.offsets);
      c.Name(n::kSizes);
      c.Integers(l.pieces[i].box.sizes);
      c.Close();
    }
    out += ']';
    j.Close();
    return;
  }
  j.Name(n::kFiles);
  if (!l.cell_files.empty()) {
    out += '[';
    for (std::size_t i = 0; i < l.cell_files.size(); ++i) {
      if (i) out += ',';
      JsonObjectText::Integer(out, l.cell_files[i]);
    }
    out += ']';
  } else {
    JsonObjectText f(out);
    f.Name(n::kBase);
    f.Integer(l.file_base);
    f.Name(n::kStrides);
    f.Integers(l.file_strides);
    f.Close();
  }
  j.Name(n::kGrid);
  out += '[';
  for (std::size_t i = 0; i < l.grid.size(); ++i) {
    if (i) out += ',';
    JsonObjectText d(out);
    if (l.grid[i].sizes.empty()) {
      d.Name(n::kStep);
      d.Integer(l.grid[i].step);
    } else {
      d.Name(n::kSizes);
      d.Integers(l.grid[i].sizes);
    }
    d.Close();
  }
  out += ']';
  j.Close();
}

// Version 2 (FORMAT.md §3): a tensor entry, with a layout instead of a chunk list; resolved
// chunks (a save, a writer) have their layout, sizes and stats derived here. Written by
// hand, as dump() of the same members in this order writes them (format/json_text.h).
void TensorEntryV2Text(const EntryMeta& e, const std::unordered_map<std::string, int32_t>& file_index,
                       std::string& out) {
  EntryMeta derived;
  const EntryMeta* from = &e;
  if (!e.chunks.empty()) {
    derived.kind = e.kind;
    derived.dtype = e.dtype;
    derived.shape = e.shape;
    DeriveLayout(derived, e.chunks, file_index);  // e's chunks read in place, not copied
    from = &derived;
  }
  internal::JsonObjectText j(out);
  j.Name(n::kType);
  j.String(EntryKindName(e.kind));
  j.Name(n::kDType);
  j.String(DTypeName(e.dtype));
  j.Name(n::kShape);
  j.Integers(e.shape);
  j.Name(n::kLayout);
  LayoutText(from->layout, out);
  j.Name(n::kStoredBytes);
  j.Integer(from->stored_bytes);
  if (from->compression.codec == Compression::Codec::kZstd) {
    j.Name(n::kCompression);
    internal::JsonObjectText z(out);
    z.Name(n::kCodec);
    z.String(n::kZstd);
    z.Name(n::kLevel);
    z.Integer(from->compression.level);
    z.Name(n::kShuffle);
    z.Raw("true");
    z.Close();
  }
  if (from->stats) {
    const ChunkStats& st = *from->stats;
    j.Name(n::kStats);
    internal::JsonObjectText o(out);
    const std::pair<const char*, double> real[] = {{"min", st.min}, {"max", st.max}, {"mean", st.mean}, {"l2", st.l2}};
    for (const auto& [name, v] : real) {
      o.Name(name);
      o.RealOrNull(v);
    }
    const std::pair<const char*, int64_t> count[] = {
        {"nan_count", st.nan_count}, {"inf_count", st.inf_count}, {"finite_count", st.finite_count}};
    for (const auto& [name, v] : count) {
      o.Name(name);
      o.Integer(v);
    }
    o.Close();
  }
  j.Close();
}

void BytesMembersV2(const std::string& key, const EntryMeta& e,
                    const std::unordered_map<std::string, int32_t>& file_index, ojson& j) {
  int32_t file = e.layout.pieces.empty() ? -1 : e.layout.pieces[0].file;
  if (!e.chunks.empty()) {
    const auto it = file_index.find(e.chunks[0].file);
    file = it == file_index.end() ? -1 : it->second;
  }
  if (file < 0) throw Error(ErrorCode::kInvalidArgument, "metadata: bytes entry '" + key + "' names no listed file");
  j[n::kFile] = file;
  j[n::kStoredBytes] = e.chunks.empty() ? e.stored_bytes : e.chunks[0].stored_bytes;
}

// Written by hand at the top level so that entries keep their order and each takes one line
// (a 100,000-key checkpoint stays greppable and linear to write). Version 2 lists each file's
// index digest, describes tensors by layout, and ends with the document's digest (§3.6).
std::string Serialize(const Metadata& m) {
  const bool v2 = m.format_version >= 2;
  std::string out = Head(m);
  std::unordered_map<std::string, int32_t> file_index;
  out += "  \"" + std::string(n::kFiles) + "\": [";
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const FileMeta& f = m.files[i];
    file_index.emplace(f.name, static_cast<int32_t>(i));
    ojson fj{{n::kName, f.name}, {n::kRank, f.rank}, {n::kBytes, f.bytes}};
    if (v2) fj[n::kIndex] = f.index;
    out += (i ? ",\n    " : "\n    ") + fj.dump();
  }
  out += m.files.empty() ? "],\n" : "\n  ],\n";
  out += "  \"" + std::string(n::kEntries) + "\": {";
  bool first = true;
  for (const auto& [key, e] : m.entries) {
    if (v2 && e.kind == EntryKind::kTensor) {  // the many: written without a JSON tree
      out += first ? "\n    " : ",\n    ";
      internal::JsonObjectText::String(out, key);
      out += ": ";
      TensorEntryV2Text(e, file_index, out);
      first = false;
      continue;
    }
    ojson j;
    j[n::kType] = EntryKindName(e.kind);
    switch (e.kind) {
      case EntryKind::kTensor:
        j[n::kDType] = DTypeName(e.dtype);
        j[n::kShape] = e.shape;
        TensorMembersV1(e, j);  // (v2: above)
        break;
      case EntryKind::kScalar:
        j[n::kDType] = DTypeName(e.dtype);
        j[n::kValue] = ojson::parse(e.value);
        break;
      case EntryKind::kBytes:
        j[n::kSize] = e.size;
        v2 ? BytesMembersV2(key, e, file_index, j) : BytesMembersV1(e, j);
        break;
      case EntryKind::kJson: j[n::kValue] = ojson::parse(e.value); break;
    }
    out += (first ? "\n    " : ",\n    ") + ojson(key).dump() + ": " + j.dump();
    first = false;
  }
  if (!v2) return out + (first ? "}\n}\n" : "\n  }\n}\n");
  out += first ? "},\n  " : "\n  },\n  ";
  const std::string digest = DigestText(out);
  out += "\"" + std::string(n::kDigest) + "\": \"" + digest + "\"}\n";  // FORMAT.md §3.6: exactly this ending
  return out;
}

}  // namespace

std::string SerializeMetadata(const Metadata& m) { return Serialize(m); }

}  // namespace ckpt
