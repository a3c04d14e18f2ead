// storage/shard_index.cc
#include "storage/shard_index.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <algorithm>
#include <limits>
#include <unordered_map>

#include "ckpt/error.h"
#include "format/json_reader.h"
#include "format/json_text.h"
#include "format/names.h"
#include "storage/digest.h"

namespace ckpt::storage {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

constexpr const char* kOffset = "offset";  // §5.5: the data's byte offset in the file
constexpr const char* kKey = "key";
constexpr const char* kBytesDType = "bytes";
constexpr const char* kBlockBytes = "block_bytes";  // §7: v2 blocked checksums
constexpr const char* kBlocks = "blocks";
// §7.3 statistics, spelled as metadata.json v1 spells them (format/metadata.cc).
constexpr const char* kStatReal[] = {"min", "max", "mean", "l2"};
constexpr const char* kStatCount[] = {"nan_count", "inf_count", "finite_count"};

std::string ShapeText(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The byte size of `shape` must not overflow (FORMAT.md §8.4).
void CheckExtent(const Shape& shape, std::size_t itemsize, const std::string& what) {
  uint64_t n = itemsize;
  for (int64_t s : shape) {
    if (s < 0) throw Error(ErrorCode::kCorrupt, what + ": negative extent in shape " + ShapeText(shape));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(s), &n) || n > (uint64_t{1} << 62))
      throw Error(ErrorCode::kCorrupt, what + ": shape " + ShapeText(shape) + " is absurd: its byte size overflows 64 bits");
  }
}

}  // namespace

void ShardIndexBuilder::Add(const ShardIndexEntry& e) { Add(e.key, e.bytes, e.dtype, e.shape, e.chunk); }

void ShardIndexBuilder::Add(const std::string& key, bool bytes, DType dtype, const Shape& shape, const ChunkMeta& c) {
  if (any_) chunks_ += ',';
  any_ = true;
  internal::JsonObjectText j(chunks_);
  j.Name(kKey);
  j.String(key);
  j.Name(names::kDType);
  if (bytes) {
    j.String(kBytesDType);
    j.Name(names::kSize);
    j.Integer(c.box.sizes.empty() ? int64_t{0} : c.box.sizes[0]);
  } else {
    j.String(DTypeName(dtype));
    j.Name(names::kShape);
    j.Integers(shape);
    j.Name(names::kOffsets);
    j.Integers(c.box.offsets);
    j.Name(names::kSizes);
    j.Integers(c.box.sizes);
  }
  j.Name(names::kDataset);
  j.String(c.dataset);
  if (c.offset) {
    j.Name(kOffset);
    j.Integer(*c.offset);
  }
  if (c.pack_offset) {
    j.Name(names::kPackOffset);
    j.Integer(*c.pack_offset);
  }
  j.Name(names::kStoredBytes);
  j.Integer(c.stored_bytes);
  if (c.compression.codec == Compression::Codec::kZstd) {
    j.Name(names::kCompression);
    internal::JsonObjectText z(chunks_);
    z.Name(names::kCodec);
    z.String(names::kZstd);
    z.Name(names::kLevel);
    z.Integer(c.compression.level);
    z.Name(names::kShuffle);
    z.Raw("true");
    z.Close();
  }
  j.Name(names::kChecksum);
  j.String(c.checksum);
  j.Name(kBlockBytes);
  j.Integer(c.block_bytes);
  j.Name(kBlocks);
  j.String(c.blocks);
  if (c.stats) {
    const ChunkStats& st = *c.stats;
    const double real[] = {st.min, st.max, st.mean, st.l2};
    const int64_t count[] = {st.nan_count, st.inf_count, st.finite_count};
    j.Name(names::kStats);
    internal::JsonObjectText o(chunks_);
    for (int i = 0; i < 4; ++i) {
      o.Name(kStatReal[i]);
      o.RealOrNull(real[i]);
    }
    for (int i = 0; i < 3; ++i) {
      o.Name(kStatCount[i]);
      o.Integer(count[i]);
    }
    o.Close();
  }
  j.Close();
  if (!spill_dir_.empty() && chunks_.size() >= kSpillBytes) Spill();
}

void ShardIndexBuilder::Spill() {
  const fs::path what = spill_dir_ / "(shard index spill)";
  if (!spill_) {
    const int fd = Fs().Open(spill_dir_, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      const int err = errno;
      if (err == EOPNOTSUPP || err == EISDIR || err == EINVAL) {  // no unnamed files here: keep it in memory
        spill_dir_.clear();
        return;
      }
      throw Error(ErrorCode::kIO,
                  spill_dir_.string() + ": creating a temporary file for the shard index: " + std::strerror(err));
    }
    spill_ = Fd(fd);
  }
  WriteExact(spill_.get(), chunks_.data(), chunks_.size(), spilled_, what);
  spilled_ += chunks_.size();
  chunks_.clear();
}

std::string ShardIndexBuilder::Finish() {
  const ordered_json head = {{names::kFormat, names::kShardIndexFormat}, {names::kFormatVersion, kFormatVersion}};
  std::string text = head.dump();
  text.pop_back();  // '}'
  text += ",\"" + std::string(names::kChunks) + "\":[";
  if (spilled_ > 0) {
    const std::size_t at = text.size();
    text.resize(at + static_cast<std::size_t>(spilled_));
    ReadExact(spill_.get(), text.data() + at, static_cast<std::size_t>(spilled_), 0,
              spill_dir_ / "(shard index spill)");
    spill_.Close(spill_dir_ / "(shard index spill)");
    spilled_ = 0;
  }
  text += chunks_;
  std::string().swap(chunks_);
  text += "]}";
  return text;
}

std::string IndexDigest(std::string_view text) { return FormatChecksum(HashBlock(text.data(), text.size())); }

namespace {

using internal::JsonError;
using internal::JsonReader;
using internal::KeySet;
using Next = JsonReader::Next;
using NumberKind = JsonReader::NumberKind;

// One pass over the text with the pull reader of metadata.json (format/json_reader.h): no
// document tree, each record read straight into its ShardIndexEntry. (A tree of a shard's
// index costs about ten times the text and, built and freed, most of ckpt-verify's time.)
// A repeated member is refused, as in metadata.json.
[[noreturn]] void Corrupt(const std::string& what) { throw Error(ErrorCode::kCorrupt, what); }

bool IsLowerHex(std::string_view s) {
  for (char ch : s)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  return true;
}

bool IsChecksum(std::string_view s) {
  const std::string_view prefix = names::kChecksumPrefix;
  return s.size() == prefix.size() + 16 && s.substr(0, prefix.size()) == prefix && IsLowerHex(s.substr(prefix.size()));
}

// A value that must be a string: copied into `out`; false (the value skipped) otherwise.
bool ReadString(JsonReader& r, std::string& out) {
  if (r.Peek() != Next::kString) {
    r.Skip();
    return false;
  }
  out.assign(r.ReadString());
  return true;
}

// A value that must be a non-negative integer: false (the value skipped) otherwise.
bool ReadUnsigned(JsonReader& r, uint64_t& out) {
  if (r.Peek() != Next::kNumber) {
    r.Skip();
    return false;
  }
  const JsonReader::Number n = r.ReadNumber();
  out = n.u;
  return n.kind == NumberKind::kUint;
}

// An array of integers (shape, offsets, sizes), at most 33 of them kept (more is a bad
// rank); false when it is not such an array.
bool ReadDims(JsonReader& r, Shape& out) {
  out.clear();
  if (r.Peek() != Next::kArray) {
    r.Skip();
    return false;
  }
  r.BeginArray();
  bool first = true, ok = true;
  while (r.NextElement(&first)) {
    if (r.Peek() != Next::kNumber) {
      r.Skip();
      ok = false;
      continue;
    }
    const JsonReader::Number n = r.ReadNumber();
    if (n.kind == NumberKind::kFloat || (n.kind == NumberKind::kUint && n.u > uint64_t{INT64_MAX})) ok = false;
    if (ok && out.size() <= 32) out.push_back(n.kind == NumberKind::kUint ? static_cast<int64_t>(n.u) : n.i);
  }
  return ok;
}

// A record's members as read, checked once the record is complete.
struct RawRecord {
  bool key = false, dtype = false, dataset = false, size = false, shape = false, offsets = false, sizes = false;
  bool stored_bytes = false, checksum = false, block_bytes = false, blocks = false;
  std::string dtype_name;
  std::string_view size_text, checksum_text, blocks_text, compression_text, level_text;
  uint64_t size_value = 0;
  bool size_ok = false, stored_ok = false, block_bytes_ok = false, checksum_ok = false, blocks_ok = false;
  bool offset_bad = false, dims_bad = false;
  bool pack_offset = false, pack_offset_bad = false;
  bool compression = false, compression_bad = false, level = false, level_ok = false;
  int64_t level_value = 0;
  bool stats = false, stats_bad = false;
  std::string_view stats_problem;  // the first bad stats member
  bool stat_seen[7] = {};
  bool stat_ok[7] = {};
};

// stats: {"min", "max", "mean", "l2": number or null, "nan_count", "inf_count",
// "finite_count": non-negative integers}.
void ReadStats(JsonReader& r, RawRecord& raw, ChunkStats& st) {
  if (r.Peek() == Next::kNull) {
    r.ReadNull();
    return;
  }
  if (r.Peek() != Next::kObject) {
    r.Skip();
    raw.stats = raw.stats_bad = true;
    return;
  }
  raw.stats = true;
  double* real[] = {&st.min, &st.max, &st.mean, &st.l2};
  int64_t* count_of[] = {&st.nan_count, &st.inf_count, &st.finite_count};
  r.BeginObject();
  KeySet keys;
  bool first = true;
  std::string_view k;
  while (r.NextMember(&first, keys, &k)) {
    int i = 0;
    while (i < 7 && k != (i < 4 ? kStatReal[i] : kStatCount[i - 4])) ++i;
    if (i == 7) {
      r.Skip();
      continue;
    }
    raw.stat_seen[i] = true;
    const Next t = r.Peek();
    if (i < 4) {
      if (t == Next::kNull) {
        r.ReadNull();
        *real[i] = std::numeric_limits<double>::quiet_NaN();
        raw.stat_ok[i] = true;
      } else if (t == Next::kNumber) {
        *real[i] = r.ReadNumber().AsDouble();
        raw.stat_ok[i] = true;
      } else {
        r.Skip();
      }
    } else {
      uint64_t v = 0;
      raw.stat_ok[i] = ReadUnsigned(r, v) && v <= uint64_t{INT64_MAX};
      *count_of[i - 4] = static_cast<int64_t>(v);
    }
  }
}

// The text of a value read by `read` (for messages).
template <class F>
std::string_view Capture(JsonReader& r, F&& read) {
  r.Peek();
  const char* start = r.pos();
  read();
  return std::string_view(start, static_cast<std::size_t>(r.pos() - start));
}

// compression: null, or {"codec": "zstd", "level": integer, ...}.
void ReadCompression(JsonReader& r, RawRecord& raw, Compression& z) {
  if (r.Peek() == Next::kNull) {
    r.ReadNull();
    return;
  }
  raw.compression = true;
  bool zstd = false;
  raw.compression_text = Capture(r, [&] {
    if (r.Peek() != Next::kObject) {
      r.Skip();
      return;
    }
    r.BeginObject();
    KeySet keys;
    bool first = true;
    std::string_view k;
    while (r.NextMember(&first, keys, &k)) {
      if (k == names::kCodec && r.Peek() == Next::kString) {
        zstd = r.ReadString() == names::kZstd;
      } else if (k == names::kCodec) {
        zstd = false;
        r.Skip();
      } else if (k == names::kLevel) {
        raw.level = true;
        raw.level_ok = false;
        raw.level_text = Capture(r, [&] {
          if (r.Peek() != Next::kNumber) return void(r.Skip());
          const JsonReader::Number n = r.ReadNumber();
          raw.level_ok = n.kind != NumberKind::kFloat && (n.kind == NumberKind::kInt || n.u <= 22);
          raw.level_value = n.kind == NumberKind::kUint ? static_cast<int64_t>(std::min<uint64_t>(n.u, 22)) : n.i;
        });
      } else {
        r.Skip();
      }
    }
  });
  raw.compression_bad = !zstd;
  if (zstd) z.codec = Compression::Codec::kZstd;
}

// Reads one member of a record into `e` (or `raw`, to be checked when the record is whole).
void ReadRecordMember(JsonReader& r, std::string_view k, ShardIndexEntry& e, RawRecord& raw) {
  ChunkMeta& m = e.chunk;
  if (k == kKey) {
    raw.key = ReadString(r, e.key);
  } else if (k == names::kDType) {
    raw.dtype = ReadString(r, raw.dtype_name);
  } else if (k == names::kDataset) {
    raw.dataset = ReadString(r, m.dataset);
  } else if (k == kOffset) {
    uint64_t v = 0;
    raw.offset_bad = !ReadUnsigned(r, v);
    m.offset = v;
  } else if (k == names::kPackOffset) {
    uint64_t v = 0;
    raw.pack_offset = true;
    raw.pack_offset_bad = !ReadUnsigned(r, v);
    m.pack_offset = v;
  } else if (k == names::kSize) {
    raw.size = true;
    raw.size_text = Capture(r, [&] { raw.size_ok = ReadUnsigned(r, raw.size_value) && raw.size_value <= (uint64_t{1} << 62); });
  } else if (k == names::kShape) {
    raw.shape = true;
    raw.dims_bad |= !ReadDims(r, e.shape);
  } else if (k == names::kOffsets) {
    raw.offsets = true;
    raw.dims_bad |= !ReadDims(r, m.box.offsets);
  } else if (k == names::kSizes) {
    raw.sizes = true;
    raw.dims_bad |= !ReadDims(r, m.box.sizes);
  } else if (k == names::kStoredBytes) {
    raw.stored_bytes = true;
    raw.stored_ok = ReadUnsigned(r, m.stored_bytes);
  } else if (k == names::kChecksum) {
    raw.checksum = true;
    raw.checksum_text = Capture(r, [&] { raw.checksum_ok = ReadString(r, m.checksum) && IsChecksum(m.checksum); });
  } else if (k == kBlockBytes) {
    raw.block_bytes = true;
    raw.block_bytes_ok = ReadUnsigned(r, m.block_bytes);
  } else if (k == kBlocks) {
    raw.blocks = true;
    raw.blocks_ok = ReadString(r, m.blocks);
  } else if (k == names::kCompression) {
    ReadCompression(r, raw, m.compression);
  } else if (k == names::kStats) {
    ChunkStats st;
    ReadStats(r, raw, st);
    if (raw.stats && !raw.stats_bad) m.stats = st;
  } else {
    r.Skip();
  }
}

// The v2 members of a record (FORMAT.md §5.5, §7): its stored size, compression, checksum,
// block digests (exactly one per block of the chunk's `n` raw bytes) and statistics.
void CheckV2Members(const RawRecord& raw, uint64_t n, ChunkMeta& m, const std::string& what) {
  if (!raw.stored_bytes) Corrupt(what + ": no \"stored_bytes\"");
  if (!raw.stored_ok) Corrupt(what + ": \"stored_bytes\" is not a non-negative integer");
  // §5.5, §5.7: an uncompressed chunk (a packed one included) occupies its byte size.
  if (!raw.compression && m.stored_bytes != n)
    Corrupt(what + ": stored_bytes " + std::to_string(m.stored_bytes) + " is not the " + std::to_string(n) +
            " bytes of the uncompressed chunk");
  if (!raw.checksum) Corrupt(what + ": no \"checksum\"");
  if (!raw.checksum_ok)
    Corrupt(what + ": checksum " + std::string(raw.checksum_text) + " is not of the form xxh3-64:<16 hex digits>");
  if (!raw.block_bytes) Corrupt(what + ": no \"block_bytes\"");
  if (!raw.block_bytes_ok) Corrupt(what + ": \"block_bytes\" is not a non-negative integer");
  if (m.block_bytes < kMinBlockBytes || m.block_bytes > kMaxBlockBytes || (m.block_bytes & (m.block_bytes - 1)))
    Corrupt(what + ": block_bytes " + std::to_string(m.block_bytes) + " is not a power of two in [4096, 67108864]");
  if (!raw.blocks) Corrupt(what + ": no \"blocks\"");
  if (!raw.blocks_ok) Corrupt(what + ": \"blocks\" is not a string");
  const uint64_t count = BlockCount(n, m.block_bytes);
  if (m.blocks.size() != count * 16)
    Corrupt(what + ": \"blocks\" holds " + std::to_string(m.blocks.size()) + " hex digits, its " + std::to_string(n) +
            " bytes in blocks of " + std::to_string(m.block_bytes) + " need " + std::to_string(count * 16));
  if (!IsLowerHex(m.blocks)) Corrupt(what + ": \"blocks\" is not lowercase hex");
  if (raw.compression && raw.compression_bad)
    throw Error(ErrorCode::kUnsupported, what + ": unknown compression " + std::string(raw.compression_text));
  if (raw.level) {
    if (!raw.level_ok || raw.level_value < -131072 || raw.level_value > 22)
      Corrupt(what + ": zstd level " + std::string(raw.level_text) + " is out of range");
    m.compression.level = static_cast<int>(raw.level_value);
  }
  if (raw.stats) {
    if (raw.stats_bad) Corrupt(what + ": \"stats\" is not an object");
    for (int i = 0; i < 7; ++i) {
      const char* name = i < 4 ? kStatReal[i] : kStatCount[i - 4];
      if (!raw.stat_seen[i]) Corrupt(what + ": stats: no \"" + name + "\"");
      if (!raw.stat_ok[i])
        Corrupt(what + ": stats \"" + name + "\" is not " + (i < 4 ? "a number" : "a non-negative integer (or too large)"));
    }
  }
}

// Checks a complete record (FORMAT.md §5.5) and fills what follows from its members.
void CheckRecord(const RawRecord& raw, ShardIndexEntry& e, bool v2, const std::string& where) {
  ChunkMeta& m = e.chunk;
  if (!raw.key) Corrupt(where + ": a chunk record without a \"key\" string");
  if (!raw.dtype) Corrupt(where + ": key '" + e.key + "': no \"dtype\" string");
  if (!raw.dataset) Corrupt(where + ": key '" + e.key + "': no \"dataset\" string");
  if (raw.offset_bad) Corrupt(where + ": key '" + e.key + "': \"offset\" is not a byte offset");
  if (raw.pack_offset && (!v2 || raw.pack_offset_bad || !m.offset || raw.compression))
    Corrupt(where + ": key '" + e.key + "': \"" + names::kPackOffset +
            "\" is not a byte offset of an uncompressed chunk with an \"offset\"");
  if (raw.dtype_name == kBytesDType) {
    if (!raw.size || !raw.size_ok)
      Corrupt(where + ": bytes entry '" + e.key + "': bad size " + (raw.size ? std::string(raw.size_text) : "(none)"));
    if (m.pack_offset) Corrupt(where + ": bytes entry '" + e.key + "': a bytes entry is not packed");
    e.bytes = true;
    e.shape = {static_cast<int64_t>(raw.size_value)};
    m.box = Box::Full(e.shape);
    if (v2) CheckV2Members(raw, raw.size_value, m, where + ": bytes entry '" + e.key + "'");
    return;
  }
  const auto parsed = DTypeFromName(raw.dtype_name);
  if (!parsed)
    throw Error(ErrorCode::kUnsupported, where + ": tensor '" + e.key + "': unknown dtype \"" + raw.dtype_name + "\"");
  e.dtype = *parsed;
  if (!raw.offsets || !raw.sizes || !raw.shape || raw.dims_bad)
    Corrupt(where + ": tensor '" + e.key + "': \"shape\", \"offsets\" and \"sizes\" must be arrays of integers");
  const Shape& shape = e.shape;
  if (shape.size() > 32 || m.box.offsets.size() != shape.size() || m.box.sizes.size() != shape.size())
    Corrupt(where + ": tensor '" + e.key + "': bad rank");
  CheckExtent(shape, DTypeSize(e.dtype), where + ": tensor '" + e.key + "'");
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (m.box.offsets[d] < 0 || m.box.sizes[d] < 0 || m.box.offsets[d] > shape[d] - m.box.sizes[d])
      Corrupt(where + ": tensor '" + e.key + "' chunk " + m.box.ToString() + " lies outside shape " + ShapeText(shape));
  if (v2) {
    const uint64_t n = static_cast<uint64_t>(m.box.NumElements()) * DTypeSize(e.dtype);
    CheckV2Members(raw, n, m, where + ": tensor '" + e.key + "' chunk " + m.box.ToString());
  }
}

// The records of the "chunks" array that comes next, appended to `out`.
void ReadRecords(JsonReader& r, bool v2, const std::string& where, std::vector<ShardIndexEntry>& out) {
  if (r.Peek() != Next::kArray) Corrupt(where + ": \"chunks\" is not an array");
  r.BeginArray();
  bool first = true;
  while (r.NextElement(&first)) {
    if (r.Peek() != Next::kObject) Corrupt(where + ": a chunk record is not an object");
    ShardIndexEntry e;
    RawRecord raw;
    r.BeginObject();
    KeySet keys;
    bool first_member = true;
    std::string_view k;
    while (r.NextMember(&first_member, keys, &k)) ReadRecordMember(r, k, e, raw);
    CheckRecord(raw, e, v2, where);
    out.push_back(std::move(e));
  }
}

// FORMAT.md §5.7: the members of one pack share its base (offset - pack_offset) and do
// not overlap.
void CheckPackedRecords(const ShardIndex& index, const std::string& where) {
  struct Member {
    uint64_t at, end;
    const ShardIndexEntry* e;
  };
  std::unordered_map<std::string_view, std::vector<Member>> packs;
  for (const ShardIndexEntry& e : index.entries) {
    const ChunkMeta& c = e.chunk;
    if (!c.pack_offset) continue;
    const uint64_t n = static_cast<uint64_t>(c.box.NumElements()) * (e.bytes ? 1 : DTypeSize(e.dtype));
    if (*c.offset < *c.pack_offset || *c.pack_offset > (uint64_t{1} << 62))
      throw Error(ErrorCode::kCorrupt, where + ": key '" + e.key + "': pack_offset " + std::to_string(*c.pack_offset) +
                                           " lies before the file's start (offset " + std::to_string(*c.offset) + ")");
    packs[c.dataset].push_back({*c.pack_offset, *c.pack_offset + n, &e});
  }
  for (auto& [name, members] : packs) {
    if (!names::IsPackName(name))
      throw Error(ErrorCode::kCorrupt, where + ": key '" + members.front().e->key + "': a packed chunk names '" +
                                           std::string(name) + "', not a pack (" + names::kPackPrefix +
                                           "<n>, n a decimal number without leading zeros)");
    std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) { return a.at < b.at; });
    const uint64_t base = *members.front().e->chunk.offset - members.front().at;
    for (std::size_t i = 0; i < members.size(); ++i) {
      const ShardIndexEntry& e = *members[i].e;
      const std::string what = where + ": key '" + e.key + "' chunk " + e.chunk.box.ToString() + " in pack '" +
                               std::string(name) + "'";
      if (*e.chunk.offset - members[i].at != base)
        throw Error(ErrorCode::kCorrupt, what + ": offset " + std::to_string(*e.chunk.offset) + " minus pack_offset " +
                                             std::to_string(members[i].at) + " is not the pack's data offset " +
                                             std::to_string(base) + " that its other members give");
      if (i > 0 && members[i].at < members[i - 1].end) {
        const ShardIndexEntry& o = *members[i - 1].e;
        throw Error(ErrorCode::kCorrupt, what + ": its bytes from byte " + std::to_string(members[i].at) +
                                             " overlap those of key '" + o.key + "' chunk " + o.chunk.box.ToString() +
                                             " (to byte " + std::to_string(members[i - 1].end) + ")");
      }
    }
  }
}

}  // namespace

ShardIndex ParseShardIndex(std::string_view text, const std::string& where) {
  ShardIndex out;
  try {
    JsonReader r(text, ParseLimits{}.max_depth);
    if (r.Peek() != Next::kObject) Corrupt(where + ": not a ckpt-shard index");
    // Members in any order: the records are read as they come once "format" and
    // "format_version" are known (the writer puts them first), else from the text kept.
    bool format = false, version_known = false, chunks = false;
    std::string_view later;  // "chunks" met before the version
    auto header = [&](std::string_view k) {
      if (k == names::kFormat) {
        std::string f;
        if (!ReadString(r, f) || f != names::kShardIndexFormat) Corrupt(where + ": not a ckpt-shard index");
        format = true;
        return;
      }
      if (r.Peek() != Next::kNumber) Corrupt(where + ": format_version is not an integer");
      const JsonReader::Number n = r.ReadNumber();
      if (n.kind == NumberKind::kFloat) Corrupt(where + ": format_version is not an integer");
      if (n.kind == NumberKind::kUint && n.u > static_cast<uint64_t>(kFormatVersion))
        throw Error(ErrorCode::kUnsupported, where + ": format_version " + std::to_string(n.u) +
                                                 " is newer than this reader supports (" +
                                                 std::to_string(kFormatVersion) + ")");
      const int64_t version = n.kind == NumberKind::kUint ? static_cast<int64_t>(n.u) : n.i;
      if (version < kOldestFormatVersion)
        Corrupt(where + ": format_version " + std::to_string(version) + " is not a version");
      out.format_version = static_cast<int>(version);
      version_known = true;
    };
    r.BeginObject();
    KeySet keys;
    bool first = true;
    std::string_view k;
    while (r.NextMember(&first, keys, &k)) {
      if (k == names::kFormat || k == names::kFormatVersion) {
        header(k);
      } else if (k == names::kChunks) {
        chunks = true;
        if (format && version_known) {
          ReadRecords(r, out.format_version >= 2, where, out.entries);
        } else {
          later = Capture(r, [&] { r.Skip(); });
        }
      } else {
        r.Skip();
      }
    }
    r.Finish();
    if (!format) Corrupt(where + ": not a ckpt-shard index");
    if (!version_known) Corrupt(where + ": no format_version");
    if (!chunks) Corrupt(where + ": no \"chunks\"");
    if (!later.empty()) {
      JsonReader again(later, ParseLimits{}.max_depth, /*depth=*/1);
      ReadRecords(again, out.format_version >= 2, where, out.entries);
    }
  } catch (const JsonError& e) {
    if (!e.syntax) Corrupt(where + ": " + e.what);
    try {  // worded as nlohmann::json words it
      const json unused = json::parse(text);
    } catch (const json::exception& je) {
      Corrupt(where + ": " + je.what());
    }
    Corrupt(where + ": invalid JSON at byte " + std::to_string(e.offset));
  }
  CheckPackedRecords(out, where);
  return out;
}

}  // namespace ckpt::storage
