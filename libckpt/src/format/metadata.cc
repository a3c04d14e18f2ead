// format/metadata.cc: metadata.json <-> Metadata (FORMAT.md §3), with the reader's limits
// (§8): size, nesting depth, duplicate keys, unsafe file names, overflowing shapes.
#include "ckpt/metadata.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "ckpt/error.h"
#include "format/checked.h"
#include "format/names.h"

namespace ckpt {
namespace {

using json = nlohmann::json;           // parsing: std::map objects, O(log n) per key
using ojson = nlohmann::ordered_json;  // writing small objects in a readable order
namespace n = names;

// Ranks and world sizes beyond this are corruption, not a job (FORMAT.md §8).
constexpr int64_t kMaxRanks = int64_t{1} << 30;

[[noreturn]] void Corrupt(std::string_view source, const std::string& what) {
  throw Error(ErrorCode::kCorrupt, std::string(source) + ": " + what);
}

struct Ctx {
  std::string_view source;
  std::string where;  // "entry 'key'" etc.

  [[noreturn]] void Fail(const std::string& what) const {
    Corrupt(source, where.empty() ? what : where + ": " + what);
  }
  const json& Req(const json& obj, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) Fail(std::string("missing field '") + key + "'");
    return *it;
  }
  std::string Str(const json& obj, const char* key) const {
    const json& v = Req(obj, key);
    if (!v.is_string()) Fail(std::string("field '") + key + "' must be a string");
    return v.get<std::string>();
  }
  int64_t NonNeg(const json& v, const std::string& what) const {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) Fail(what + " is too large");
      return static_cast<int64_t>(u);
    }
    if (v.is_number_integer()) Fail(what + " is negative (" + v.dump() + ")");
    Fail(what + " must be a non-negative integer, found " + v.dump());
  }
  int64_t NonNeg(const json& obj, const char* key) const { return NonNeg(Req(obj, key), std::string("field '") + key + "'"); }
  Shape Dims(const json& obj, const char* key, int max_rank) const {
    const json& v = Req(obj, key);
    if (!v.is_array()) Fail(std::string("field '") + key + "' must be an array");
    if (v.size() > static_cast<std::size_t>(max_rank)) {
      Fail(std::string("field '") + key + "' has " + std::to_string(v.size()) +
           " dimensions, the limit is " + std::to_string(max_rank));
    }
    Shape s;
    for (const json& d : v) s.push_back(NonNeg(d, std::string("an element of '") + key + "'"));
    return s;
  }
};

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

double StatNumber(const json& v) {
  return v.is_number() ? v.get<double>() : std::numeric_limits<double>::quiet_NaN();
}
json StatJson(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

// First pass over the text: nesting depth, duplicate keys (nlohmann::json would silently
// keep the last one) and the order of the entries. A SAX pass, linear in the text; the
// callback parser would rescan every parent object at each member's end.
class LimitsChecker : public nlohmann::json_sax<json> {
 public:
  LimitsChecker(int max_depth, std::vector<std::string>* entry_order)
      : max_depth_(max_depth), entry_order_(entry_order) {}
  const std::string& problem() const { return problem_; }

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    objects_.emplace_back();
    return Enter();
  }
  bool key(string_t& k) override {
    Open& o = objects_.back();
    if (!o.keys.insert(k).second) return Fail("duplicate key '" + k + "'");
    o.last_key = k;
    // Keys of the top-level "entries" object, in document order.
    if (objects_.size() == 2 && depth_ == 2 && objects_[0].last_key == n::kEntries) entry_order_->push_back(k);
    return true;
  }
  bool end_object() override {
    objects_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    objects_.emplace_back();  // arrays have no keys; keeps objects_[i] aligned with depth
    return Enter();
  }
  bool end_array() override {
    objects_.pop_back();
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    return Fail(std::string("invalid JSON: ") + e.what());
  }

 private:
  struct Open {
    std::unordered_set<std::string> keys;
    std::string last_key;
  };
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
  std::vector<Open> objects_;
  std::vector<std::string>* entry_order_;
  std::string problem_;
};

json ParseWithLimits(std::string_view text, std::string_view source, const ParseLimits& limits,
                     std::vector<std::string>* entry_order) {
  if (text.size() > limits.max_bytes) {
    Corrupt(source, std::to_string(text.size()) + " bytes exceeds the limit of " +
                        std::to_string(limits.max_bytes));
  }
  LimitsChecker checker(limits.max_depth, entry_order);
  if (!json::sax_parse(text.begin(), text.end(), &checker) || !checker.problem().empty()) {
    Corrupt(source, checker.problem().empty() ? std::string("invalid JSON") : checker.problem());
  }
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    Corrupt(source, std::string("invalid JSON: ") + e.what());
  }
}

ChunkMeta ParseChunk(const Ctx& ctx, const json& c, bool tensor_chunk, int max_rank) {
  if (!c.is_object()) ctx.Fail("a chunk must be an object");
  ChunkMeta m;
  if (tensor_chunk) {
    m.box.offsets = ctx.Dims(c, n::kOffsets, max_rank);
    m.box.sizes = ctx.Dims(c, n::kSizes, max_rank);
  }
  m.file = ctx.Str(c, n::kFile);
  m.dataset = ctx.Str(c, n::kDataset);
  if (m.dataset.empty()) ctx.Fail("empty dataset name");
  m.checksum = ctx.Str(c, n::kChecksum);
  if (!IsValidChecksum(m.checksum)) {
    ctx.Fail("checksum '" + m.checksum + "' is not of the form xxh3-64:<16 hex digits>");
  }
  if (auto it = c.find(n::kStoredBytes); it != c.end()) m.stored_bytes = ctx.NonNeg(*it, std::string("stored_bytes"));
  if (auto it = c.find(n::kCompression); it != c.end() && !it->is_null()) {
    if (!it->is_object()) ctx.Fail("'compression' must be an object");
    const std::string codec = ctx.Str(*it, n::kCodec);
    if (codec != n::kZstd) {
      throw Error(ErrorCode::kUnsupported, std::string(ctx.source) + ": " + ctx.where +
                                               ": unknown compression codec '" + codec + "'");
    }
    m.compression.codec = Compression::Codec::kZstd;
    if (auto lv = it->find(n::kLevel); lv != it->end() && lv->is_number_integer()) {
      const double level = lv->get<double>();  // compared as a double: no wrap-around
      if (level < -131072 || level > 22) ctx.Fail("zstd level " + lv->dump() + " is out of range");
      m.compression.level = static_cast<int>(level);
    }
  }
  if (auto it = c.find(n::kStats); it != c.end() && !it->is_null()) {
    if (!it->is_object()) ctx.Fail("'stats' must be an object");
    ChunkStats s;
    s.min = StatNumber(it->value("min", json()));
    s.max = StatNumber(it->value("max", json()));
    s.mean = StatNumber(it->value("mean", json()));
    s.l2 = StatNumber(it->value("l2", json()));
    s.nan_count = ctx.NonNeg(*it, "nan_count");
    s.inf_count = ctx.NonNeg(*it, "inf_count");
    s.finite_count = ctx.NonNeg(*it, "finite_count");
    m.stats = s;
  }
  return m;
}

EntryMeta ParseEntry(const Ctx& ctx, const json& e, const std::unordered_set<std::string>& files,
                     const ParseLimits& limits) {
  if (!e.is_object()) ctx.Fail("an entry must be an object");
  EntryMeta m;
  const std::string type = ctx.Str(e, n::kType);
  auto parse_dtype = [&] {
    const std::string name = ctx.Str(e, n::kDType);
    auto dt = DTypeFromName(name);
    if (!dt) {
      throw Error(ErrorCode::kUnsupported,
                  std::string(ctx.source) + ": " + ctx.where + ": unknown dtype '" + name + "'");
    }
    return *dt;
  };
  auto check_file = [&](const ChunkMeta& c) {
    if (!IsSafeFileName(c.file)) ctx.Fail("file name '" + c.file + "' is not a plain file name");
    if (!files.count(c.file)) ctx.Fail("file '" + c.file + "' is not listed in 'files'");
  };
  if (type == "tensor") {
    m.kind = EntryKind::kTensor;
    m.dtype = parse_dtype();
    m.shape = ctx.Dims(e, n::kShape, limits.max_rank);
    const int64_t elements = [&] {
      try {
        return NumElements(m.shape);
      } catch (const Error&) {
        ctx.Fail("shape " + FormatDims(m.shape) + " has more elements than fit in 64 bits");
      }
    }();
    internal::CheckedMul(elements, static_cast<int64_t>(DTypeSize(m.dtype)),
                         std::string(ctx.source) + ": " + ctx.where);
    const json& chunks = ctx.Req(e, n::kChunks);
    if (!chunks.is_array()) ctx.Fail("'chunks' must be an array");
    for (const json& c : chunks) {
      ChunkMeta chunk = ParseChunk(ctx, c, true, limits.max_rank);
      if (chunk.box.offsets.size() != m.shape.size() || chunk.box.sizes.size() != m.shape.size()) {
        ctx.Fail("chunk " + chunk.box.ToString() + " has a different rank than shape " + FormatDims(m.shape));
      }
      for (std::size_t d = 0; d < m.shape.size(); ++d) {
        const int64_t end = internal::CheckedAdd(chunk.box.offsets[d], chunk.box.sizes[d],
                                                 std::string(ctx.source) + ": " + ctx.where);
        if (end > m.shape[d]) {
          ctx.Fail("chunk " + chunk.box.ToString() + " lies outside shape " + FormatDims(m.shape));
        }
      }
      check_file(chunk);
      m.chunks.push_back(std::move(chunk));
    }
  } else if (type == "scalar") {
    m.kind = EntryKind::kScalar;
    m.dtype = parse_dtype();
    const json& v = ctx.Req(e, n::kValue);
    if (!v.is_number() && !v.is_boolean()) ctx.Fail("a scalar value must be a number or boolean");
    // Readers convert an integer or bool scalar to int64_t (FORMAT.md §9.5): a value
    // outside its range would wrap, or be undefined behaviour when it is a float.
    if (!IsFloating(m.dtype) &&
        ((v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) ||
         (v.is_number_float() && !(v.get<double>() >= -0x1p63 && v.get<double>() < 0x1p63)))) {
      ctx.Fail("scalar value " + v.dump() + " does not fit dtype " + std::string(DTypeName(m.dtype)));
    }
    m.value = v.dump();
  } else if (type == "bytes") {
    m.kind = EntryKind::kBytes;
    m.dtype = DType::kUInt8;
    m.size = static_cast<uint64_t>(ctx.NonNeg(e, n::kSize));
    ChunkMeta chunk = ParseChunk(ctx, e, false, limits.max_rank);
    chunk.box = Box{{0}, {static_cast<int64_t>(m.size)}};
    check_file(chunk);
    m.chunks.push_back(std::move(chunk));
  } else if (type == "json") {
    m.kind = EntryKind::kJson;
    m.value = ctx.Req(e, n::kValue).dump();
  } else {
    ctx.Fail("unknown entry type '" + type + "'");
  }
  return m;
}

}  // namespace

namespace internal {
std::string ChunkToJson(const ChunkMeta& c, bool tensor_chunk);
ChunkMeta ChunkFromJson(const json& chunk, bool tensor_chunk);
}  // namespace internal

namespace {

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
  if (c.stats) {
    const ChunkStats& s = *c.stats;
    j[n::kStats] = {{"min", StatJson(s.min)},         {"max", StatJson(s.max)},
                    {"mean", StatJson(s.mean)},       {"l2", StatJson(s.l2)},
                    {"nan_count", s.nan_count},       {"inf_count", s.inf_count},
                    {"finite_count", s.finite_count}};
  }
  return j;
}

}  // namespace

std::string internal::ChunkToJson(const ChunkMeta& c, bool tensor_chunk) { return ChunkJson(c, tensor_chunk).dump(); }

ChunkMeta internal::ChunkFromJson(const json& chunk, bool tensor_chunk) {
  const Ctx ctx{"chunk message", ""};
  return ParseChunk(ctx, chunk, tensor_chunk, ParseLimits{}.max_rank);
}

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
  if (index_.size() != entries.size()) const_cast<Metadata*>(this)->BuildIndex();
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &entries[it->second].second;
}

void Metadata::BuildIndex() {
  index_.clear();
  index_.reserve(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) index_.emplace(entries[i].first, i);
}

Metadata ParseMetadata(std::string_view text, std::string_view source, const ParseLimits& limits) {
  std::vector<std::string> order;
  const json doc = ParseWithLimits(text, source, limits, &order);
  Ctx ctx{source, ""};
  if (!doc.is_object()) ctx.Fail("the document must be a JSON object");
  Metadata m;
  if (ctx.Str(doc, n::kFormat) != n::kFormatName) ctx.Fail("'format' is not \"ckpt\"");
  const json& version = ctx.Req(doc, n::kFormatVersion);
  if (!version.is_number_integer()) ctx.Fail("'format_version' must be an integer");
  // Compared in 64 bits before narrowing: get<int>() would wrap 4294967297 to 1.
  if (version.is_number_unsigned() ? version.get<uint64_t>() > static_cast<uint64_t>(kFormatVersion)
                                   : version.get<int64_t>() > kFormatVersion) {
    throw Error(ErrorCode::kUnsupported,
                std::string(source) + ": format_version " + version.dump() +
                    " is newer than this library supports (" + std::to_string(kFormatVersion) + ")");
  }
  if (version.get<int64_t>() < 1) ctx.Fail("format_version " + version.dump() + " is invalid");
  m.format_version = version.get<int>();
  const std::string type = ctx.Str(doc, n::kStateDictType);
  auto sdt = StateDictTypeFromName(type);
  if (!sdt) ctx.Fail("unknown state_dict_type '" + type + "' (FULL, SHARDED or LOCAL)");
  m.state_dict_type = *sdt;
  const int64_t world_size = ctx.NonNeg(doc, n::kWorldSize);
  if (world_size > kMaxRanks) ctx.Fail("world_size " + std::to_string(world_size) + " is absurd (limit " + std::to_string(kMaxRanks) + ")");
  m.world_size = static_cast<int>(world_size);
  if (m.world_size < 1) ctx.Fail("world_size must be at least 1");
  if (auto it = doc.find(n::kLibraryVersion); it != doc.end() && it->is_string()) m.library_version = *it;
  if (auto it = doc.find(n::kCreated); it != doc.end() && it->is_string()) m.created = *it;
  m.mesh = doc.contains(n::kMesh) ? doc[n::kMesh].dump() : "null";
  m.user = doc.contains(n::kUser) ? doc[n::kUser].dump() : "{}";

  const json& files = ctx.Req(doc, n::kFiles);
  if (!files.is_array()) ctx.Fail("'files' must be an array");
  std::unordered_set<std::string> file_names;
  for (const json& f : files) {
    if (!f.is_object()) ctx.Fail("an element of 'files' must be an object");
    FileMeta fm;
    fm.name = ctx.Str(f, n::kName);
    if (!IsSafeFileName(fm.name)) ctx.Fail("file name '" + fm.name + "' is not a plain file name");
    if (!file_names.insert(fm.name).second) ctx.Fail("file '" + fm.name + "' is listed twice");
    const int64_t rank = ctx.NonNeg(f, n::kRank);
    if (rank > kMaxRanks) ctx.Fail("file '" + fm.name + "' has rank " + std::to_string(rank) + " (limit " + std::to_string(kMaxRanks) + ")");
    fm.rank = static_cast<int>(rank);
    fm.bytes = static_cast<uint64_t>(ctx.NonNeg(f, n::kBytes));
    m.files.push_back(std::move(fm));
  }
  const json& entries = ctx.Req(doc, n::kEntries);
  if (!entries.is_object()) ctx.Fail("'entries' must be an object");
  if (order.size() != entries.size()) ctx.Fail("could not read the order of 'entries'");
  m.entries.reserve(entries.size());
  for (const std::string& key : order) {
    if (std::string why = KeyProblem(key); !why.empty()) ctx.Fail("entries: " + why);
    Ctx ectx{source, "entry '" + key + "'"};
    m.entries.emplace_back(key, ParseEntry(ectx, entries.at(key), file_names, limits));
  }
  m.BuildIndex();
  return m;
}

std::string SerializeMetadata(const Metadata& m) {
  // Written by hand at the top level so that entries keep their order and each takes one
  // line (a 100,000-key checkpoint stays greppable and linear to write).
  auto field = [](std::string& out, const char* key, const ojson& value) {
    out += "  " + ojson(key).dump() + ": " + value.dump() + ",\n";
  };
  std::string out = "{\n";
  field(out, n::kFormat, n::kFormatName);
  field(out, n::kFormatVersion, m.format_version);
  field(out, n::kStateDictType, StateDictTypeName(m.state_dict_type));
  field(out, n::kWorldSize, m.world_size);
  field(out, n::kLibraryVersion, m.library_version);
  field(out, n::kCreated, m.created);
  field(out, n::kMesh, ojson::parse(m.mesh.empty() ? "null" : m.mesh));
  field(out, n::kUser, ojson::parse(m.user.empty() ? "{}" : m.user));
  out += "  \"" + std::string(n::kFiles) + "\": [";
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const FileMeta& f = m.files[i];
    out += (i ? ",\n    " : "\n    ") +
           ojson{{n::kName, f.name}, {n::kRank, f.rank}, {n::kBytes, f.bytes}}.dump();
  }
  out += m.files.empty() ? "],\n" : "\n  ],\n";
  out += "  \"" + std::string(n::kEntries) + "\": {";
  bool first = true;
  for (const auto& [key, e] : m.entries) {
    ojson j;
    j[n::kType] = EntryKindName(e.kind);
    switch (e.kind) {
      case EntryKind::kTensor: {
        j[n::kDType] = DTypeName(e.dtype);
        j[n::kShape] = e.shape;
        ojson chunks = ojson::array();
        for (const ChunkMeta& c : e.chunks) chunks.push_back(ChunkJson(c, true));
        j[n::kChunks] = std::move(chunks);
        break;
      }
      case EntryKind::kScalar:
        j[n::kDType] = DTypeName(e.dtype);
        j[n::kValue] = ojson::parse(e.value);
        break;
      case EntryKind::kBytes: {
        j[n::kSize] = e.size;
        const ojson chunk = ChunkJson(e.chunks.at(0), false);
        for (auto& [k, v] : chunk.items()) j[k] = v;
        break;
      }
      case EntryKind::kJson: j[n::kValue] = ojson::parse(e.value); break;
    }
    out += (first ? "\n    " : ",\n    ") + ojson(key).dump() + ": " + j.dump();
    first = false;
  }
  out += first ? "}\n}\n" : "\n  }\n}\n";
  return out;
}

}  // namespace ckpt
