// storage/shard_index.cc
#include "storage/shard_index.h"

#include <nlohmann/json.hpp>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "ckpt/error.h"
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

bool IsChecksum(const json& v) {
  if (!v.is_string()) return false;
  const std::string& s = v.get_ref<const std::string&>();
  const std::string_view prefix = names::kChecksumPrefix;
  if (s.size() != prefix.size() + 16 || s.compare(0, prefix.size(), prefix) != 0) return false;
  for (std::size_t i = prefix.size(); i < s.size(); ++i)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return false;
  return true;
}

uint64_t Unsigned(const json& c, const char* member, const std::string& what) {
  const json& v = c.at(member);
  if (!v.is_number_unsigned()) throw Error(ErrorCode::kCorrupt, what + ": \"" + member + "\" is not a non-negative integer");
  return v.get<uint64_t>();
}

// The v2 members of a record (FORMAT.md §5.5, §7): its stored size, compression, checksum,
// block digests (exactly one per block of the chunk's `n` raw bytes) and statistics.
void ParseV2Members(const json& c, uint64_t n, ChunkMeta& m, const std::string& what) {
  m.stored_bytes = Unsigned(c, names::kStoredBytes, what);
  if (!IsChecksum(c.at(names::kChecksum)))
    throw Error(ErrorCode::kCorrupt, what + ": checksum " + c.at(names::kChecksum).dump() +
                                         " is not of the form xxh3-64:<16 hex digits>");
  m.checksum = c.at(names::kChecksum).get<std::string>();
  m.block_bytes = Unsigned(c, kBlockBytes, what);
  if (m.block_bytes < kMinBlockBytes || m.block_bytes > kMaxBlockBytes || (m.block_bytes & (m.block_bytes - 1)))
    throw Error(ErrorCode::kCorrupt, what + ": block_bytes " + std::to_string(m.block_bytes) +
                                         " is not a power of two in [4096, 67108864]");
  const json& blocks = c.at(kBlocks);
  if (!blocks.is_string()) throw Error(ErrorCode::kCorrupt, what + ": \"blocks\" is not a string");
  m.blocks = blocks.get<std::string>();
  const uint64_t count = BlockCount(n, m.block_bytes);
  if (m.blocks.size() != count * 16)
    throw Error(ErrorCode::kCorrupt, what + ": \"blocks\" holds " + std::to_string(m.blocks.size()) +
                                         " hex digits, its " + std::to_string(n) + " bytes in blocks of " +
                                         std::to_string(m.block_bytes) + " need " + std::to_string(count * 16));
  for (char ch : m.blocks)
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f')))
      throw Error(ErrorCode::kCorrupt, what + ": \"blocks\" is not lowercase hex");
  if (c.contains(names::kCompression) && !c[names::kCompression].is_null()) {
    const json& z = c[names::kCompression];
    if (!z.is_object() || z.value(names::kCodec, "") != names::kZstd)
      throw Error(ErrorCode::kUnsupported, what + ": unknown compression " + z.dump());
    m.compression.codec = Compression::Codec::kZstd;
    if (z.contains(names::kLevel)) {
      if (!z[names::kLevel].is_number_integer() || z[names::kLevel].get<int64_t>() < -131072 ||
          z[names::kLevel].get<int64_t>() > 22)
        throw Error(ErrorCode::kCorrupt, what + ": zstd level " + z[names::kLevel].dump() + " is out of range");
      m.compression.level = z[names::kLevel].get<int>();
    }
  }
  if (c.contains(names::kStats) && !c[names::kStats].is_null()) {
    const json& o = c[names::kStats];
    if (!o.is_object()) throw Error(ErrorCode::kCorrupt, what + ": \"stats\" is not an object");
    ChunkStats st;
    double* real[] = {&st.min, &st.max, &st.mean, &st.l2};
    int64_t* count_of[] = {&st.nan_count, &st.inf_count, &st.finite_count};
    for (int i = 0; i < 4; ++i) {
      const json& v = o.at(kStatReal[i]);
      if (!v.is_null() && !v.is_number())
        throw Error(ErrorCode::kCorrupt, what + ": stats \"" + kStatReal[i] + "\" is not a number");
      *real[i] = v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
    }
    for (int i = 0; i < 3; ++i) {
      const uint64_t v = Unsigned(o, kStatCount[i], what + ": stats");
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw Error(ErrorCode::kCorrupt, what + ": stats \"" + kStatCount[i] + "\" is too large");
      *count_of[i] = static_cast<int64_t>(v);
    }
    m.stats = st;
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
    const json j = json::parse(text);
    if (!j.is_object() || j.value(names::kFormat, "") != names::kShardIndexFormat)
      throw Error(ErrorCode::kCorrupt, where + ": not a ckpt-shard index");
    const json& v = j.at(names::kFormatVersion);
    if (!v.is_number_integer()) throw Error(ErrorCode::kCorrupt, where + ": format_version is not an integer");
    const int64_t version = v.get<int64_t>();
    if (version > kFormatVersion)
      throw Error(ErrorCode::kUnsupported, where + ": format_version " + std::to_string(version) +
                                               " is newer than this reader supports (" +
                                               std::to_string(kFormatVersion) + ")");
    if (version < kOldestFormatVersion)
      throw Error(ErrorCode::kCorrupt, where + ": format_version " + std::to_string(version) + " is not a version");
    out.format_version = static_cast<int>(version);
    const bool v2 = version >= 2;
    const json& chunks = j.at(names::kChunks);
    if (!chunks.is_array()) throw Error(ErrorCode::kCorrupt, where + ": \"chunks\" is not an array");
    out.entries.reserve(chunks.size());
    for (const auto& c : chunks) {
      if (!c.is_object()) throw Error(ErrorCode::kCorrupt, where + ": a chunk record is not an object");
      ShardIndexEntry e;
      ChunkMeta& m = e.chunk;
      e.key = c.at(kKey).get<std::string>();
      const std::string dtype = c.at(names::kDType).get<std::string>();
      m.dataset = c.at(names::kDataset).get<std::string>();
      if (c.contains(kOffset)) {
        if (!c[kOffset].is_number_unsigned())
          throw Error(ErrorCode::kCorrupt, where + ": key '" + e.key + "': \"offset\" is not a byte offset");
        m.offset = c[kOffset].get<uint64_t>();
      }
      if (c.contains(names::kPackOffset)) {
        if (!v2 || !c[names::kPackOffset].is_number_unsigned() || !m.offset ||
            (c.contains(names::kCompression) && !c[names::kCompression].is_null()))
          throw Error(ErrorCode::kCorrupt, where + ": key '" + e.key + "': \"" + names::kPackOffset +
                                               "\" is not a byte offset of an uncompressed chunk with an \"offset\"");
        m.pack_offset = c[names::kPackOffset].get<uint64_t>();
      }
      if (dtype == kBytesDType) {
        const json& size = c.at(names::kSize);
        if (!size.is_number_unsigned() || size.get<uint64_t>() > (uint64_t{1} << 62))
          throw Error(ErrorCode::kCorrupt, where + ": bytes entry '" + e.key + "': bad size " + size.dump());
        if (m.pack_offset)
          throw Error(ErrorCode::kCorrupt, where + ": bytes entry '" + e.key + "': a bytes entry is not packed");
        e.bytes = true;
        e.shape = {size.get<int64_t>()};
        m.box = Box::Full(e.shape);
        if (v2) ParseV2Members(c, size.get<uint64_t>(), m, where + ": bytes entry '" + e.key + "'");
        out.entries.push_back(std::move(e));
        continue;
      }
      const auto parsed = DTypeFromName(dtype);
      if (!parsed)
        throw Error(ErrorCode::kUnsupported, where + ": tensor '" + e.key + "': unknown dtype " + c.at(names::kDType).dump());
      e.dtype = *parsed;
      m.box.offsets = c.at(names::kOffsets).get<Shape>();
      m.box.sizes = c.at(names::kSizes).get<Shape>();
      e.shape = c.at(names::kShape).get<Shape>();
      const Shape& shape = e.shape;
      if (shape.size() > 32 || m.box.offsets.size() != shape.size() || m.box.sizes.size() != shape.size())
        throw Error(ErrorCode::kCorrupt, where + ": tensor '" + e.key + "': bad rank");
      CheckExtent(shape, DTypeSize(e.dtype), where + ": tensor '" + e.key + "'");
      for (std::size_t d = 0; d < shape.size(); ++d)
        if (m.box.offsets[d] < 0 || m.box.sizes[d] < 0 || m.box.offsets[d] > shape[d] - m.box.sizes[d])
          throw Error(ErrorCode::kCorrupt, where + ": tensor '" + e.key + "' chunk " + m.box.ToString() +
                                               " lies outside shape " + ShapeText(shape));
      if (v2) {
        const uint64_t n = static_cast<uint64_t>(m.box.NumElements()) * DTypeSize(e.dtype);
        ParseV2Members(c, n, m, where + ": tensor '" + e.key + "' chunk " + m.box.ToString());
      }
      out.entries.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kCorrupt, where + ": " + e.what());
  }
  CheckPackedRecords(out, where);
  return out;
}

}  // namespace ckpt::storage
