// checkpoint/reader.cc
#include "checkpoint/reader.h"

#include <cstring>
#include <functional>
#include <optional>

#include "format/names.h"
#include "layout/box.h"
#include "storage/fs.h"

namespace ckpt {

Metadata ReadMetadata(const std::filesystem::path& dir) { return internal::ReadMetadataAt(storage::Dir::Open(dir)); }

std::unique_ptr<CheckpointReader> CheckpointReader::Open(const std::filesystem::path& dir) {
  const storage::Dir d = storage::Dir::Open(dir);
  return std::make_unique<internal::Reader>(d, std::make_shared<const Metadata>(internal::ReadMetadataAt(d)));
}

namespace internal {

Metadata ReadMetadataAt(const storage::Dir& dir, uint64_t* text_hash) {
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
  return ParseMetadata(text, (dir.path() / names::kMetadataFile).string(), limits);
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

void Reader::VerifyDigest(const std::string& key, const ChunkMeta& chunk, const storage::Digest& digest) const {
  const std::string got = digest.Checksum();
  if (got != chunk.checksum) {
    throw Error(ErrorCode::kCorrupt, (dir_ / chunk.file).string() + ": key '" + key + "' chunk " +
                                         chunk.box.ToString() + " (dataset '" + chunk.dataset +
                                         "'): checksum mismatch: metadata says " + chunk.checksum +
                                         ", the data hashes to " + got);
  }
}

void Reader::ReadRegion(std::string_view key, const Box& region, void* out, bool verify) {
  ReadRegionEx(key, region, out, verify, false);
}

void Reader::ReadRegionEx(std::string_view key_view, const Box& region, void* out, bool verify, bool verify_partial) {
  const std::string key(key_view);
  const EntryMeta& e = TensorEntry(key);
  if (!layout::Contains(Box::Full(e.shape), region) || region.offsets.size() != e.shape.size()) {
    throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': region " + region.ToString() +
                                                 " is not inside the tensor " + Box::Full(e.shape).ToString());
  }
  const std::size_t item = DTypeSize(e.dtype);
  for (const ChunkMeta& c : e.chunks) {
    const auto inter = layout::Intersect(c.box, region);
    if (!inter) continue;
    const bool whole = *inter == c.box;
    storage::ShardReader& shard = Shard(c.file);
    if (whole || !verify || !verify_partial) {
      // A digest (and its hash state) only for chunks that will be verified.
      std::optional<storage::Digest> digest;
      if (whole && verify) digest.emplace(e.dtype, false);
      bytes_read_ += shard.Read(key, e.dtype, c, *inter, out, region, digest ? &*digest : nullptr);
      if (digest) VerifyDigest(key, c, *digest);
      continue;
    }
    // Verify a partly needed chunk: read it whole, check it, copy the part.
    std::vector<unsigned char> tmp(static_cast<std::size_t>(c.box.NumElements()) * item);
    storage::Digest digest(e.dtype, false);
    bytes_read_ += shard.Read(key, e.dtype, c, c.box, tmp.data(), c.box, &digest);
    VerifyDigest(key, c, digest);
    layout::ForEachRun(c.box, region, *inter, [&](const layout::Run& run) {
      std::memcpy(static_cast<unsigned char*>(out) + run.dst * item, tmp.data() + run.src * item,
                  static_cast<std::size_t>(run.count) * item);
    });
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
  storage::Digest digest(e->dtype, false);
  bytes_read_ += Shard(c.file).Read(key, e->dtype, c, c.box, out, c.box, verify ? &digest : nullptr);
  if (verify) VerifyDigest(key, c, digest);
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
  const auto range = LocateChunk(key, chunk_index);  // checks key, index and dataset
  const EntryMeta& e = *metadata_->Find(key);
  const ChunkMeta& c = e.chunks[chunk_index];
  storage::Digest digest(e.dtype, false);
  if (range) {
    Shard(c.file).Hash(range->offset, range->length, digest);
    bytes_read_ += range->length;
  } else {  // compressed or empty: decompressed whole
    const uint64_t n = static_cast<uint64_t>(c.box.NumElements()) * DTypeSize(e.dtype);
    std::vector<unsigned char> tmp(std::max<uint64_t>(n, 1));
    ReadChunk(key, chunk_index, tmp.data(), false);
    digest.Update(tmp.data(), n);
  }
  VerifyDigest(key, c, digest);
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
