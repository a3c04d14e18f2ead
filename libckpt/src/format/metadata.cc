// format/metadata.cc: the metadata model's own functions (ckpt/metadata.h): names, safe
// file names, the key index, and the layout a list of chunks makes.
#include "ckpt/metadata.h"

#include <algorithm>

#include "format/checked.h"
#include "format/flat_index.h"
#include "format/grid.h"
#include "format/metadata_model.h"

namespace ckpt {
namespace format {

void DeriveLayout(EntryMeta& m, const std::vector<ChunkMeta>& chunks, const FileIndex& files) {
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

}  // namespace format

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

}  // namespace ckpt
