// format/shard_index.cc
#include "format/shard_index.h"

#include <algorithm>
#include <unordered_map>

#include "ckpt/error.h"
#include "format/checksum.h"
#include "format/chunk_record.h"
#include "format/compression.h"
#include "format/json_text.h"
#include "format/json_value.h"
#include "format/metadata_model.h"
#include "format/names.h"
#include "format/stats.h"

namespace ckpt::format {

namespace n = names;

std::string ShardIndexHead() {
  std::string out;
  internal::JsonObjectText j(out);
  j.Name(n::kFormat);
  j.String(n::kShardIndexFormat);
  j.Name(n::kFormatVersion);
  j.Integer(kFormatVersion);
  j.Name(n::kChunks);
  out += '[';
  return out;
}

void AppendShardRecord(std::string& out, const std::string& key, bool bytes, DType dtype, const Shape& shape,
                       const ChunkMeta& c) {
  internal::JsonObjectText j(out);
  j.Name(n::kKey);
  j.String(key);
  j.Name(n::kDType);
  if (bytes) {
    j.String(n::kBytesDType);
    j.Name(n::kSize);
    j.Integer(c.box.sizes.empty() ? int64_t{0} : c.box.sizes[0]);
  } else {
    j.String(DTypeName(dtype));
    j.Name(n::kShape);
    j.Integers(shape);
  }
  WriteChunkMembers(j, c, ChunkForm::kShardIndex, /*with_box=*/!bytes);
  j.Close();
}

std::string IndexDigest(std::string_view text) { return DigestOf(text); }

namespace {

[[noreturn]] void Corrupt(const std::string& what) { throw Error(ErrorCode::kCorrupt, what); }

// A string member into `out`: false when it is missing or not a string.
bool String(const Json& rec, const char* key, std::string& out) {
  const Json* v = Member(rec, key);
  if (!v || !v->is_string()) return false;
  out = v->get<std::string>();
  return true;
}

// An array of integers (shape, offsets, sizes): false when it is missing or not one.
bool Dims(const Json& rec, const char* key, Shape& out) {
  const Json* v = Member(rec, key);
  if (!v || !v->is_array()) return false;
  out.clear();
  for (const Json& x : *v) {
    if (!x.is_number_integer() || (x.is_number_unsigned() && !IsNonNegativeInt64(x))) return false;
    out.push_back(x.get<int64_t>());
  }
  return true;
}

// The v2 members of a record (FORMAT.md §5.5, §7): its stored size, compression, checksum,
// block digests (exactly one per block of the chunk's `bytes` raw bytes) and statistics.
void CheckV2Members(const Json& rec, uint64_t bytes, ChunkMeta& m, const std::string& what) {
  const Json* stored = Member(rec, n::kStoredBytes);
  const Json* compression = Member(rec, n::kCompression);
  if (compression && compression->is_null()) compression = nullptr;
  if (!stored) Corrupt(what + ": no \"stored_bytes\"");
  if (!stored->is_number_unsigned()) Corrupt(what + ": \"stored_bytes\" is not a non-negative integer");
  m.stored_bytes = stored->get<uint64_t>();
  // §5.5, §5.7: an uncompressed chunk (a packed one included) occupies its byte size.
  if (!compression && m.stored_bytes != bytes)
    Corrupt(what + ": stored_bytes " + std::to_string(m.stored_bytes) + " is not the " + std::to_string(bytes) +
            " bytes of the uncompressed chunk");
  const Json* checksum = Member(rec, n::kChecksum);
  if (!checksum) Corrupt(what + ": no \"checksum\"");
  if (!checksum->is_string() || !IsChecksum(checksum->get_ref<const std::string&>()))
    Corrupt(what + ": checksum " + checksum->dump() + " is not of the form xxh3-64:<16 hex digits>");
  m.checksum = checksum->get<std::string>();
  const Json* block_bytes = Member(rec, n::kBlockBytes);
  if (!block_bytes) Corrupt(what + ": no \"block_bytes\"");
  if (!block_bytes->is_number_unsigned()) Corrupt(what + ": \"block_bytes\" is not a non-negative integer");
  m.block_bytes = block_bytes->get<uint64_t>();
  if (m.block_bytes < kMinBlockBytes || m.block_bytes > kMaxBlockBytes || (m.block_bytes & (m.block_bytes - 1)))
    Corrupt(what + ": block_bytes " + std::to_string(m.block_bytes) + " is not a power of two in [4096, 67108864]");
  if (!Member(rec, n::kBlocks)) Corrupt(what + ": no \"blocks\"");
  if (!String(rec, n::kBlocks, m.blocks)) Corrupt(what + ": \"blocks\" is not a string");
  const uint64_t count = BlockCount(bytes, m.block_bytes);
  if (m.blocks.size() != count * 16)
    Corrupt(what + ": \"blocks\" holds " + std::to_string(m.blocks.size()) + " hex digits, its " +
            std::to_string(bytes) + " bytes in blocks of " + std::to_string(m.block_bytes) + " need " +
            std::to_string(count * 16));
  if (!IsLowerHex(m.blocks)) Corrupt(what + ": \"blocks\" is not lowercase hex");
  if (compression) {
    m.compression = ReadCompression(*compression, LevelRule::kStrict, [&](CompressionFault f, const Json& v) {
      if (f != CompressionFault::kLevel)
        throw Error(ErrorCode::kUnsupported, what + ": unknown compression " + compression->dump());
      Corrupt(what + ": zstd level " + v.dump() + " is out of range");
    });
  }
  const Json* stats = Member(rec, n::kStats);
  if (!stats || stats->is_null()) return;
  if (!stats->is_object()) Corrupt(what + ": \"stats\" is not an object");
  m.stats = ReadStats(*stats, /*strict=*/true, [&](const char* name, const Json* v) {
    if (!v) Corrupt(what + ": stats: no \"" + name + "\"");
    const bool real = std::find(std::begin(kStatReal), std::end(kStatReal), name) != std::end(kStatReal);
    Corrupt(what + ": stats \"" + name + "\" is not " + (real ? "a number" : "a non-negative integer (or too large)"));
  });
}

// A bytes entry's record, from its "size" on (FORMAT.md §5.5).
void ReadBytesRecord(const Json& rec, ShardIndexEntry& e, bool v2, const std::string& where) {
  ChunkMeta& m = e.chunk;
  const Json* size = Member(rec, n::kSize);
  if (!size || !size->is_number_unsigned() || size->get<uint64_t>() > (uint64_t{1} << 62))
    Corrupt(where + ": bytes entry '" + e.key + "': bad size " + (size ? size->dump() : "(none)"));
  if (m.pack_offset) Corrupt(where + ": bytes entry '" + e.key + "': a bytes entry is not packed");
  e.bytes = true;
  e.shape = {static_cast<int64_t>(size->get<uint64_t>())};
  m.box = Box::Full(e.shape);
  if (v2) CheckV2Members(rec, size->get<uint64_t>(), m, where + ": bytes entry '" + e.key + "'");
}

// A tensor's record, from its dtype on (FORMAT.md §5.5).
void ReadTensorRecord(const Json& rec, const std::string& dtype, ShardIndexEntry& e, bool v2,
                      const std::string& where) {
  ChunkMeta& m = e.chunk;
  const auto parsed = DTypeFromName(dtype);
  if (!parsed)
    throw Error(ErrorCode::kUnsupported, where + ": tensor '" + e.key + "': unknown dtype \"" + dtype + "\"");
  e.dtype = *parsed;
  if (!Dims(rec, n::kShape, e.shape) || !Dims(rec, n::kOffsets, m.box.offsets) || !Dims(rec, n::kSizes, m.box.sizes))
    Corrupt(where + ": tensor '" + e.key + "': \"shape\", \"offsets\" and \"sizes\" must be arrays of integers");
  const Shape& shape = e.shape;
  if (shape.size() > 32 || m.box.offsets.size() != shape.size() || m.box.sizes.size() != shape.size())
    Corrupt(where + ": tensor '" + e.key + "': bad rank");
  CheckExtent(shape, DTypeSize(e.dtype), where + ": tensor '" + e.key + "'");
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (m.box.offsets[d] < 0 || m.box.sizes[d] < 0 || m.box.offsets[d] > shape[d] - m.box.sizes[d])
      Corrupt(where + ": tensor '" + e.key + "' chunk " + m.box.ToString() + " lies outside shape " + DimsText(shape));
  if (v2) {
    const uint64_t bytes = static_cast<uint64_t>(m.box.NumElements()) * DTypeSize(e.dtype);
    CheckV2Members(rec, bytes, m, where + ": tensor '" + e.key + "' chunk " + m.box.ToString());
  }
}

// One record, checked (FORMAT.md §5.5).
ShardIndexEntry ReadRecord(const Json& rec, bool v2, const std::string& where) {
  if (!rec.is_object()) Corrupt(where + ": a chunk record is not an object");
  ShardIndexEntry e;
  ChunkMeta& m = e.chunk;
  std::string dtype;
  if (!String(rec, n::kKey, e.key)) Corrupt(where + ": a chunk record without a \"key\" string");
  if (!String(rec, n::kDType, dtype)) Corrupt(where + ": key '" + e.key + "': no \"dtype\" string");
  if (!String(rec, n::kDataset, m.dataset)) Corrupt(where + ": key '" + e.key + "': no \"dataset\" string");
  if (const Json* offset = Member(rec, n::kOffset)) {
    if (!offset->is_number_unsigned()) Corrupt(where + ": key '" + e.key + "': \"offset\" is not a byte offset");
    m.offset = offset->get<uint64_t>();
  }
  if (const Json* pack = Member(rec, n::kPackOffset)) {
    const Json* compression = Member(rec, n::kCompression);
    if (!v2 || !pack->is_number_unsigned() || !m.offset || (compression && !compression->is_null()))
      Corrupt(where + ": key '" + e.key + "': \"" + n::kPackOffset +
              "\" is not a byte offset of an uncompressed chunk with an \"offset\"");
    m.pack_offset = pack->get<uint64_t>();
  }
  if (dtype == n::kBytesDType) {
    ReadBytesRecord(rec, e, v2, where);
  } else {
    ReadTensorRecord(rec, dtype, e, v2, where);
  }
  return e;
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
    const uint64_t bytes = static_cast<uint64_t>(c.box.NumElements()) * (e.bytes ? 1 : DTypeSize(e.dtype));
    if (*c.offset < *c.pack_offset || *c.pack_offset > (uint64_t{1} << 62))
      Corrupt(where + ": key '" + e.key + "': pack_offset " + std::to_string(*c.pack_offset) +
              " lies before the file's start (offset " + std::to_string(*c.offset) + ")");
    packs[c.dataset].push_back({*c.pack_offset, *c.pack_offset + bytes, &e});
  }
  for (auto& [name, members] : packs) {
    if (!n::IsPackName(name))
      Corrupt(where + ": key '" + members.front().e->key + "': a packed chunk names '" + std::string(name) +
              "', not a pack (" + n::kPackPrefix + "<n>, n a decimal number without leading zeros)");
    std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) { return a.at < b.at; });
    const uint64_t base = *members.front().e->chunk.offset - members.front().at;
    for (std::size_t i = 0; i < members.size(); ++i) {
      const ShardIndexEntry& e = *members[i].e;
      const std::string what =
          where + ": key '" + e.key + "' chunk " + e.chunk.box.ToString() + " in pack '" + std::string(name) + "'";
      if (*e.chunk.offset - members[i].at != base)
        Corrupt(what + ": offset " + std::to_string(*e.chunk.offset) + " minus pack_offset " +
                std::to_string(members[i].at) + " is not the pack's data offset " + std::to_string(base) +
                " that its other members give");
      if (i > 0 && members[i].at < members[i - 1].end) {
        const ShardIndexEntry& o = *members[i - 1].e;
        Corrupt(what + ": its bytes from byte " + std::to_string(members[i].at) + " overlap those of key '" + o.key +
                "' chunk " + o.chunk.box.ToString() + " (to byte " + std::to_string(members[i - 1].end) + ")");
      }
    }
  }
}

// The index document: its header checked as it comes, its records read one at a time and
// checked at once when the header is known (the writer puts it first); "chunks" met before
// the header is passed over and read in a second pass over the text (nothing of it kept
// meanwhile). A problem of meaning stops the reading where it is met.
class IndexReader final : public JsonVisitor {
 public:
  IndexReader(std::string_view text, const std::string& where) : text_(text), where_(where) {}

  bool Descend(const JsonPath& path, bool object) override {
    if (path.empty()) {
      if (!object) Corrupt(where_ + ": not a ckpt-shard index");
      return true;
    }
    if (path.size() != 1 || path[0] != n::kChunks) return false;
    chunks_ = true;
    if (!Known()) return later_ = true;  // streamed past, its elements ignored
    if (object) Corrupt(where_ + ": \"chunks\" is not an array");
    return true;
  }

  void Value(const JsonPath& path, Json&& v) override {
    if (path.empty()) Corrupt(where_ + ": not a ckpt-shard index");
    if (path.size() == 2) {
      if (Known() && !(later_ && !again_)) out.entries.push_back(ReadRecord(v, out.format_version >= 2, where_));
    } else if (again_) {
      if (path[0] == n::kChunks) Corrupt(where_ + ": \"chunks\" is not an array");
    } else if (path[0] == n::kFormat) {
      if (!v.is_string() || v.get_ref<const std::string&>() != n::kShardIndexFormat)
        Corrupt(where_ + ": not a ckpt-shard index");
      format_ = true;
    } else if (path[0] == n::kFormatVersion) {
      Version(v);
    } else if (path[0] == n::kChunks) {
      chunks_ = true;
      if (Known()) Corrupt(where_ + ": \"chunks\" is not an array");
      later_ = true;
    }
  }

  // After the text: what must have been there, and the records met before the header.
  void Finish() {
    if (!format_) Corrupt(where_ + ": not a ckpt-shard index");
    if (!version_) Corrupt(where_ + ": no format_version");
    if (!chunks_) Corrupt(where_ + ": no \"chunks\"");
    if (!later_) return;
    again_ = true;
    ReadJson(text_, ParseLimits{}.max_depth, *this);  // the first pass found no JSON problem
  }

  ShardIndex out;

 private:
  bool Known() const { return format_ && version_; }

  void Version(const Json& v) {
    if (!v.is_number_integer()) Corrupt(where_ + ": format_version is not an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kFormatVersion))
      throw Error(ErrorCode::kUnsupported, where_ + ": format_version " + v.dump() +
                                               " is newer than this reader supports (" +
                                               std::to_string(kFormatVersion) + ")");
    const int64_t version = v.get<int64_t>();
    if (version < kOldestFormatVersion)
      Corrupt(where_ + ": format_version " + std::to_string(version) + " is not a version");
    out.format_version = static_cast<int>(version);
    version_ = true;
  }

  std::string_view text_;
  const std::string& where_;
  bool format_ = false, version_ = false, chunks_ = false;
  bool later_ = false;  // "chunks" came before the header
  bool again_ = false;  // the second pass
};

}  // namespace

void CheckExtent(const Shape& shape, std::size_t itemsize, const std::string& what) {
  uint64_t bytes = itemsize;
  for (int64_t s : shape) {
    if (s < 0) Corrupt(what + ": negative extent in shape " + DimsText(shape));
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(s), &bytes) || bytes > (uint64_t{1} << 62))
      Corrupt(what + ": shape " + DimsText(shape) + " is absurd: its byte size overflows 64 bits");
  }
}

ShardIndex ParseShardIndex(std::string_view text, const std::string& where) {
  IndexReader reader(text, where);
  if (const auto problem = ReadJson(text, ParseLimits{}.max_depth, reader)) Corrupt(where + ": " + problem->what);
  reader.Finish();
  CheckPackedRecords(reader.out, where);
  return std::move(reader.out);
}

}  // namespace ckpt::format
