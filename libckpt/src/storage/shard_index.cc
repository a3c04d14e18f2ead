// storage/shard_index.cc
#include "storage/shard_index.h"

#include <nlohmann/json.hpp>

#include "ckpt/error.h"
#include "format/names.h"

namespace ckpt::storage {
namespace {

using nlohmann::json;

constexpr const char* kOffset = "offset";  // §5.5: the data's byte offset in the file
constexpr const char* kKey = "key";
constexpr const char* kBytesDType = "bytes";

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

void ShardIndexBuilder::Add(const ShardIndexEntry& e) {
  json j;
  j[kKey] = e.key;
  if (e.bytes) {
    j[names::kDType] = kBytesDType;
    j[names::kSize] = e.box.sizes.empty() ? 0 : e.box.sizes[0];
  } else {
    j[names::kDType] = DTypeName(e.dtype);
    j[names::kShape] = e.shape;
    j[names::kOffsets] = e.box.offsets;
    j[names::kSizes] = e.box.sizes;
  }
  j[names::kDataset] = e.dataset;
  if (e.offset) j[kOffset] = *e.offset;
  if (!chunks_.empty()) chunks_ += ',';
  chunks_ += j.dump();
}

std::string ShardIndexBuilder::Finish() const {
  const json head = {{names::kFormat, names::kShardIndexFormat}, {names::kFormatVersion, kFormatVersion}};
  std::string text = head.dump();
  text.pop_back();  // '}'
  return text + ",\"" + names::kChunks + "\":[" + chunks_ + "]}";
}

std::vector<ShardIndexEntry> ParseShardIndex(std::string_view text, const std::string& where) {
  std::vector<ShardIndexEntry> out;
  try {
    const json j = json::parse(text);
    if (!j.is_object() || j.value(names::kFormat, "") != names::kShardIndexFormat)
      throw Error(ErrorCode::kCorrupt, where + ": not a ckpt-shard index");
    const int version = j.value(names::kFormatVersion, 0);
    if (version > kFormatVersion)
      throw Error(ErrorCode::kUnsupported, where + ": format_version " + std::to_string(version) +
                                               " is newer than this reader supports (" +
                                               std::to_string(kFormatVersion) + ")");
    const json& chunks = j.at(names::kChunks);
    if (!chunks.is_array()) throw Error(ErrorCode::kCorrupt, where + ": \"chunks\" is not an array");
    out.reserve(chunks.size());
    for (const auto& c : chunks) {
      ShardIndexEntry e;
      e.key = c.at(kKey).get<std::string>();
      const std::string dtype = c.at(names::kDType).get<std::string>();
      e.dataset = c.at(names::kDataset).get<std::string>();
      if (c.contains(kOffset)) {
        if (!c[kOffset].is_number_unsigned())
          throw Error(ErrorCode::kCorrupt, where + ": key '" + e.key + "': \"offset\" is not a byte offset");
        e.offset = c[kOffset].get<uint64_t>();
      }
      if (dtype == kBytesDType) {
        const json& size = c.at(names::kSize);
        if (!size.is_number_unsigned() || size.get<uint64_t>() > (uint64_t{1} << 62))
          throw Error(ErrorCode::kCorrupt, where + ": bytes entry '" + e.key + "': bad size " + size.dump());
        e.bytes = true;
        e.shape = {size.get<int64_t>()};
        e.box = Box::Full(e.shape);
        out.push_back(std::move(e));
        continue;
      }
      const auto parsed = DTypeFromName(dtype);
      if (!parsed)
        throw Error(ErrorCode::kUnsupported, where + ": tensor '" + e.key + "': unknown dtype " + c.at(names::kDType).dump());
      e.dtype = *parsed;
      e.box.offsets = c.at(names::kOffsets).get<Shape>();
      e.box.sizes = c.at(names::kSizes).get<Shape>();
      e.shape = c.at(names::kShape).get<Shape>();
      const Shape& shape = e.shape;
      if (shape.size() > 32 || e.box.offsets.size() != shape.size() || e.box.sizes.size() != shape.size())
        throw Error(ErrorCode::kCorrupt, where + ": tensor '" + e.key + "': bad rank");
      CheckExtent(shape, DTypeSize(e.dtype), where + ": tensor '" + e.key + "'");
      for (std::size_t d = 0; d < shape.size(); ++d)
        if (e.box.offsets[d] < 0 || e.box.sizes[d] < 0 || e.box.offsets[d] > shape[d] - e.box.sizes[d])
          throw Error(ErrorCode::kCorrupt, where + ": tensor '" + e.key + "' chunk " + e.box.ToString() +
                                               " lies outside shape " + ShapeText(shape));
      out.push_back(std::move(e));
    }
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kCorrupt, where + ": " + e.what());
  }
  return out;
}

}  // namespace ckpt::storage
