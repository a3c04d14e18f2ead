// checkpoint/reader.cc
#include "checkpoint/reader.h"

#include <cstring>
#include <functional>
#include <optional>

#include "format/names.h"
#include "layout/box.h"
#include "storage/fs.h"

namespace ckpt {

Metadata ReadMetadata(const std::filesystem::path& dir, bool resolve) {
  return internal::ReadMetadataAt(storage::Dir::Open(dir), nullptr, resolve);
}

std::unique_ptr<CheckpointReader> CheckpointReader::Open(const std::filesystem::path& dir) {
  const storage::Dir d = storage::Dir::Open(dir);
  return std::make_unique<internal::Reader>(d, std::make_shared<const Metadata>(internal::ReadMetadataAt(d)));
}

namespace internal {

Metadata ReadMetadataAt(const storage::Dir& dir, uint64_t* text_hash, bool resolve) {
  const ParseLimits limits;
  std::string text;
  try {
    text = storage::ReadFileLimitedAt(dir, names::kMetadataFile, limits.max_bytes);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kNotFound) throw;
    throw Error(ErrorCode::kNotFound,
                dir.path().string() + ": not a checkpoint (no metadata.json; an interrupted save never commits one)");
  }
  if (text_hash) *text_hash = std::hash<std::string>{}(text);
  Metadata md = ParseMetadata(text, (dir.path() / names::kMetadataFile).string(), limits);
  // lead replaces: v1 metadata.json over v2 shards until metadata v2 is written.
  if (resolve) storage::AdoptBlockDigests(dir, md);
  return md;
}

Reader::Reader(storage::Dir dir, std::shared_ptr<const Metadata> metadata, bool check_tiling)
    : handle_(std::move(dir)), dir_(handle_.path()), metadata_(std::move(metadata)) {
  if (!check_tiling) return;
  std::vector<std::string> problems;
  for (const auto& [key, e] : metadata_->entries) {
    if (e.kind != EntryKind::kTensor) continue;
    for (std::string& p : CheckTiling(key, e)) problems.push_back(std::move(p));
  }
  if (problems.empty()) return;
  std::string msg = (dir_ / names::kMetadataFile).string() + ": chunks do not tile their tensors:";
  for (std::size_t i = 0; i < problems.size() && i < 20; ++i) msg += "\n  " + problems[i];
  if (problems.size() > 20) msg += "\n  ... and " + std::to_string(problems.size() - 20) + " more";
  throw Error(ErrorCode::kCorrupt, msg);
}

const EntryMeta& Reader::TensorEntry(std::string_view key) {
  const EntryMeta* e = metadata_->Find(key);
  if (!e) throw Error(ErrorCode::kNotFound, dir_.string() + ": no key '" + std::string(key) + "'");
  if (e->kind != EntryKind::kTensor) {
    throw Error(ErrorCode::kMismatch, dir_.string() + ": key '" + std::string(key) + "' is a " +
                                          std::string(EntryKindName(e->kind)) + ", not a tensor");
  }
  return *e;
}

storage::ShardReader& Reader::Shard(const std::string& file) {
  auto it = shards_.find(file);
  if (it == shards_.end()) {
    it = shards_.emplace(file, std::make_unique<storage::ShardReader>(handle_, file)).first;
  }
  return *it->second;
}

void Reader::ReadRegion(std::string_view key_view, const Box& region, void* out, bool verify) {
  const std::string key(key_view);
  const EntryMeta& e = TensorEntry(key);
  if (!layout::Contains(Box::Full(e.shape), region) || region.offsets.size() != e.shape.size()) {
    throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': region " + region.ToString() +
                                                 " is not inside the tensor " + Box::Full(e.shape).ToString());
  }
  for (const ChunkMeta& c : e.chunks) {
    const auto inter = layout::Intersect(c.box, region);
    if (!inter) continue;
    bytes_read_ += Shard(c.file).Read(key, e.dtype, c, *inter, out, region, verify);
  }
}

void Reader::ReadChunk(std::string_view key_view, std::size_t chunk_index, void* out, bool verify) {
  const std::string key(key_view);
  const EntryMeta* e = metadata_->Find(key);
  if (!e) throw Error(ErrorCode::kNotFound, dir_.string() + ": no key '" + key + "'");
  if (chunk_index >= e->chunks.size()) {
    throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': no chunk " + std::to_string(chunk_index));
  }
  const ChunkMeta& c = e->chunks[chunk_index];
  bytes_read_ += Shard(c.file).Read(key, e->dtype, c, c.box, out, c.box, verify);
}

std::optional<FileRange> Reader::LocateChunk(std::string_view key_view, std::size_t chunk_index) {
  const std::string key(key_view);
  const EntryMeta* e = metadata_->Find(key);
  if (!e) throw Error(ErrorCode::kNotFound, dir_.string() + ": no key '" + key + "'");
  if (chunk_index >= e->chunks.size()) {
    throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': no chunk " + std::to_string(chunk_index));
  }
  if (e->kind != EntryKind::kTensor && e->kind != EntryKind::kBytes) {
    throw Error(ErrorCode::kMismatch, dir_.string() + ": key '" + key + "' is a " +
                                          std::string(EntryKindName(e->kind)) + ": it has no stored bytes");
  }
  const ChunkMeta& c = e->chunks[chunk_index];  // a bytes entry's box is its 1-D extent (parser)
  const uint64_t length = static_cast<uint64_t>(c.box.NumElements()) * DTypeSize(e->dtype);
  if (length == 0) return std::nullopt;
  const auto offset = Shard(c.file).Locate(key, e->dtype, c);
  if (!offset) return std::nullopt;
  return FileRange{dir_ / c.file, *offset, length};
}

void Reader::VerifyChunk(std::string_view key_view, std::size_t chunk_index) {
  const std::string key(key_view);
  LocateChunk(key, chunk_index);  // checks key, kind and index
  const EntryMeta& e = *metadata_->Find(key);
  const ChunkMeta& c = e.chunks[chunk_index];
  bytes_read_ += Shard(c.file).Verify(key, e.dtype, c);
}

std::vector<uint8_t> Reader::ReadBytes(std::string_view key_view, bool verify) {
  const std::string key(key_view);
  const EntryMeta* e = metadata_->Find(key);
  if (!e) throw Error(ErrorCode::kNotFound, dir_.string() + ": no key '" + key + "'");
  if (e->kind != EntryKind::kBytes) {
    throw Error(ErrorCode::kMismatch, "key '" + key + "' is a " + std::string(EntryKindName(e->kind)) + ", not bytes");
  }
  if (e->chunks.empty() || e->size > Shard(e->chunks[0].file).file_size()) {
    throw Error(ErrorCode::kCorrupt, dir_.string() + ": bytes entry '" + key + "' claims " + std::to_string(e->size) +
                                         " bytes, more than its file holds");
  }
  std::vector<uint8_t> out(e->size);
  ReadChunk(key, 0, out.data(), verify);
  return out;
}

}  // namespace internal
}  // namespace ckpt
