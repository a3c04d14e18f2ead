// checkpoint/reader.h: the CheckpointReader implementation, shared by Load and tools.
#pragma once

#include <map>
#include <memory>
#include <unordered_set>

#include "ckpt/checkpoint.h"
#include "storage/shard_reader.h"

namespace ckpt::internal {

// Reads metadata.json of the checkpoint open as `dir`; `text_hash` (if given) receives a
// hash of its text, which tells ranks whether they read the same checkpoint.
Metadata ReadMetadataAt(const storage::Dir& dir, uint64_t* text_hash = nullptr);

class Reader final : public CheckpointReader {
 public:
  // Reads the checkpoint through the directory handle `dir` (metadata read from it too),
  // so a reader racing an overwrite sees one checkpoint whole, never a mix. Readers of
  // one checkpoint may share the handle and metadata (one reader per thread). Unless told
  // the check was done already, refuses metadata whose chunks do not tile every tensor
  // (FORMAT.md §8.5): a gap would leave part of a caller's buffer unwritten.
  Reader(storage::Dir dir, std::shared_ptr<const Metadata> metadata, bool check_tiling = true);

  const Metadata& metadata() const override { return *metadata_; }
  const std::shared_ptr<const Metadata>& shared_metadata() const { return metadata_; }
  const std::filesystem::path& dir() const override { return dir_; }
  void ReadRegion(std::string_view key, const Box& region, void* out, bool verify) override;
  void ReadChunk(std::string_view key, std::size_t chunk_index, void* out, bool verify) override;
  std::vector<uint8_t> ReadBytes(std::string_view key, bool verify) override;
  std::optional<FileRange> LocateChunk(std::string_view key, std::size_t chunk_index) override;
  void VerifyChunk(std::string_view key, std::size_t chunk_index) override;
  uint64_t bytes_read() const override { return bytes_read_; }

  // ReadRegion, with partial chunks verified too (reading them whole) when asked.
  void ReadRegionEx(std::string_view key, const Box& region, void* out, bool verify, bool verify_partial);

 private:
  const EntryMeta& TensorEntry(std::string_view key);
  storage::ShardReader& Shard(const std::string& file);
  void VerifyDigest(const std::string& key, const ChunkMeta& chunk, const storage::Digest& digest) const;

  storage::Dir handle_;
  std::filesystem::path dir_;
  std::shared_ptr<const Metadata> metadata_;
  std::map<std::string, std::unique_ptr<storage::ShardReader>> shards_;
  uint64_t bytes_read_ = 0;
};

}  // namespace ckpt::internal
