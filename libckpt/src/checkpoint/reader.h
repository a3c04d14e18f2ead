// checkpoint/reader.h: the CheckpointReader implementation, shared by Load and tools.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/object_read.h"
#include "ckpt/checkpoint.h"
#include "storage/shard_reader.h"

namespace ckpt::internal {

// Reads metadata.json of the checkpoint open as `dir` (its digest checked, FORMAT.md §3.6);
// `text_hash` (if given) receives a hash of its text, which tells ranks whether they read
// the same checkpoint. With `resolve`, a v2 checkpoint's chunks are read from every shard
// index (each checked against its digest), so every EntryMeta::chunks is filled.
Metadata ReadMetadataAt(const storage::Dir& dir, uint64_t* text_hash = nullptr, bool resolve = true);

// A checkpoint pinned for reading (FORMAT.md §2.7): its directory handle and the metadata
// read through it. Every reader (Load, CheckpointReader, the tools) starts here and opens
// every shard through `dir`, so it reads this one checkpoint from its first read to its
// last, or fails with kChanged.
struct Pinned {
  storage::Dir dir;
  std::shared_ptr<const Metadata> metadata;
  uint64_t text_hash = 0;  // of metadata.json's text (ReadMetadataAt)
};
// Opens the directory `dir` and reads its metadata through the handle; if the checkpoint
// is replaced between the two (kChanged: the old directory's files removed before they
// were read), starts again on the new one, a few times, before giving up with kChanged.
Pinned OpenPinned(const std::filesystem::path& dir, bool resolve);

// The chunk records of a v2 checkpoint (FORMAT.md §5.5), read from each shard's index on
// first use, once per file, each checked against its digest in metadata.json before it is
// believed. Shared by the readers of one load (thread-safe).
class ChunkCatalog {
 public:
  ChunkCatalog(storage::Dir dir, std::shared_ptr<const Metadata> metadata);
  // The same for a checkpoint on object storage: each index fetched by one ranged GET.
  explicit ChunkCatalog(std::shared_ptr<const ObjectSource> source);
  ~ChunkCatalog();
  // The record of the chunk `box` of `key` in file `file` (its position in files), which
  // the layout of `e` says is there. kCorrupt naming the file and key when the index does
  // not hold it, or holds it with another dtype or shape.
  const ChunkMeta& Find(const std::string& key, const EntryMeta& e, const Box& box, int32_t file);
  // Every record of file `file`, by key (parsed once).
  const std::unordered_map<std::string, std::vector<storage::ShardIndexEntry>>& Records(int32_t file);

 private:
  struct File;
  File& Load(int32_t file);
  storage::Dir dir_;
  std::shared_ptr<const Metadata> metadata_;
  std::shared_ptr<const ObjectSource> source_;  // object storage: where the indexes come from
  std::filesystem::path base_;                  // dir_.path() or the s3:// URL, for messages
  std::mutex mu_;
  std::vector<std::unique_ptr<File>> files_;
};

// What keeps a tensor entry's chunks from tiling it (FORMAT.md §8.5): over its chunks when
// it has them (v1, resolved), else over a v2 explicit list; a v2 grid tiles by construction.
std::vector<std::string> EntryTilingProblems(const std::string& key, const EntryMeta& e, bool resolved);

// Fills every EntryMeta::chunks of a v2 metadata from the shard indexes (layout order).
void Resolve(const storage::Dir& dir, Metadata& m);
// The same, the records taken from `catalog` (of `m`'s checkpoint).
void ResolveWith(ChunkCatalog& catalog, Metadata& m);
// FORMAT.md §3.5: a v2 entry's stored_bytes is the sum of its records' (`records`, saturated
// at UINT64_MAX); throws kCorrupt naming metadata.json and the key otherwise.
void CheckStoredBytes(const std::string& key, const EntryMeta& e, uint64_t records);

class Reader final : public CheckpointReader {
 public:
  // Reads the checkpoint through the directory handle `dir` (metadata read from it too),
  // so a reader racing an overwrite sees one checkpoint whole, never a mix. Readers of
  // one checkpoint may share the handle and metadata (one reader per thread). Unless told
  // the check was done already, refuses metadata whose chunks do not tile every tensor
  // (FORMAT.md §8.5): a gap would leave part of a caller's buffer unwritten.
  Reader(storage::Dir dir, std::shared_ptr<const Metadata> metadata, bool check_tiling = true,
         std::shared_ptr<ChunkCatalog> catalog = nullptr);
  // A checkpoint on object storage (checkpoint/object_read.h): no HDF5, ranged GETs only.
  explicit Reader(std::shared_ptr<const ObjectSource> source, bool check_tiling = true,
                  std::shared_ptr<ChunkCatalog> catalog = nullptr);
  const std::shared_ptr<ChunkCatalog>& catalog() const { return catalog_; }
  // What must outlive this reader and those Reopen makes (a downloaded checkpoint's cache
  // directory, CheckpointReader::Open).
  void KeepAlive(std::shared_ptr<const void> what) { keep_alive_ = std::move(what); }

  const Metadata& metadata() const override { return *metadata_; }
  const std::shared_ptr<const Metadata>& shared_metadata() const { return metadata_; }
  const std::filesystem::path& dir() const override { return dir_; }
  void ReadRegion(std::string_view key, const Box& region, void* out, bool verify) override;
  void ReadChunk(std::string_view key, std::size_t chunk_index, void* out, bool verify) override;
  std::vector<uint8_t> ReadBytes(std::string_view key, bool verify) override;
  std::optional<FileRange> LocateChunk(std::string_view key, std::size_t chunk_index) override;
  void VerifyChunk(std::string_view key, std::size_t chunk_index) override;
  uint64_t bytes_read() const override { return bytes_read_; }
  std::unique_ptr<CheckpointReader> Reopen() const override;
  std::optional<std::filesystem::path> PinnedPath(std::string_view name) const override;
  void ThrowIfReplaced() const override;
  std::vector<std::string> StructureProblems() const override;
  void CheckStructure() const override;
  // Large contiguous reads with O_DIRECT under `policy` (storage::DirectReader), for the
  // shards opened from now on; nullopt (the default): buffered.
  void UseDirectIo(std::optional<storage::DirectReader::Policy> policy) { direct_ = policy; }
  // Object storage: the small chunks this reader's load will read, by file, so that one GET
  // serves a run of them (ObjectWindow, object_read.h); nullptr (the default): one GET each.
  void UseWindow(std::shared_ptr<const ObjectSpans> spans) { window_.spans = std::move(spans); }
  // Of bytes_read(), those read with O_DIRECT.
  uint64_t bytes_read_direct() const;

  // The stored chunks of `key` that meet `region`: v1 (or resolved) from the metadata, v2
  // from the layout's cells and the shard indexes of their files (each read once, checked
  // against its digest in metadata.json). kCorrupt naming file and key when an index lacks
  // a chunk the layout has.
  std::vector<const ChunkMeta*> ChunksMeeting(const std::string& key, const EntryMeta& e, const Box& region);
  // Reads into `out` (laid out as `region`) the part of `region` that the stored chunk `c`,
  // one of ChunksMeeting's, holds: ReadRegion a stored chunk at a time, so that a caller
  // reading many regions can order the reads by where their bytes lie in the files.
  void ReadRegionPart(const std::string& key, const ChunkMeta& c, const Box& region, void* out, bool verify);
  // The chunk `chunk_index` of `key` in layout order (ReadChunk, LocateChunk, VerifyChunk).
  const ChunkMeta& ChunkAt(const std::string& key, const EntryMeta& e, std::size_t chunk_index);

 private:
  const EntryMeta& TensorEntry(std::string_view key);
  void CheckOpen(bool check_tiling);
  // Reads `region` of the stored chunk `c` into `out` (over `out_box`): from its shard, or
  // its object. Returns the bytes read.
  uint64_t ReadStored(const std::string& key, DType dtype, const ChunkMeta& c, const Box& region, void* out,
                      const Box& out_box, bool verify);
  storage::ShardReader& Shard(const std::string& file);

  storage::Dir handle_;
  std::shared_ptr<const ObjectSource> source_;  // set: the checkpoint is on object storage
  std::filesystem::path dir_;
  std::shared_ptr<const Metadata> metadata_;
  std::shared_ptr<const void> keep_alive_;
  std::shared_ptr<ChunkCatalog> catalog_;  // v2 and not resolved: where chunk records come from
  std::map<std::string, std::unique_ptr<storage::ShardReader>> shards_;
  uint64_t bytes_read_ = 0;
  std::optional<storage::DirectReader::Policy> direct_;
  ObjectWindow window_;  // object storage: small chunks served from one GET (object_read.h)
};

}  // namespace ckpt::internal
