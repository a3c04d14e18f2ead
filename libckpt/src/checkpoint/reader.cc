// checkpoint/reader.cc
#include "checkpoint/reader.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <unordered_map>

#include "checkpoint/object_save.h"
#include "format/grid.h"
#include "format/names.h"
#include "layout/box.h"
#include "storage/fs.h"
#include "storage/shard_index.h"
#include "storage/shard_reader.h"

namespace ckpt {

namespace {

// An s3:// checkpoint that ranged reads cannot read (format v1, compressed chunks, saved
// before files[].index_offset), downloaded as Load downloads it (a locked cache directory
// bounded by ObjectStoreOptions::cache_max_bytes) and read there; the cache goes with the
// last reader of it.
std::unique_ptr<CheckpointReader> OpenDownloaded(const std::filesystem::path& url, const ReaderOptions& o) {
  std::shared_ptr<const internal::CacheDir> cache = internal::DownloadToCache(url.string(), o.s3, 0);
  internal::Pinned p = internal::OpenPinned(cache->path(), o.resolve);
  auto r = std::make_unique<internal::Reader>(std::move(p.dir), std::move(p.metadata), o.check_structure);
  r->KeepAlive(std::move(cache));
  return r;
}

// An s3:// checkpoint: by ranged reads, or (`download`, where ranges cannot read its data)
// downloaded. Without `download` only the metadata is wanted: a v2 checkpoint's metadata
// and shard indexes are read by ranges whatever its chunks.
std::unique_ptr<CheckpointReader> OpenObject(const std::filesystem::path& dir, const ReaderOptions& o, bool download) {
  std::shared_ptr<const internal::ObjectSource> source;
  try {
    source = internal::OpenObjectSource(dir.string(), o.s3);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kUnsupported) throw;  // format version 1: downloaded
    return OpenDownloaded(dir, o);
  }
  if (download && !internal::ReadableByRanges(*source->metadata)) return OpenDownloaded(dir, o);
  if (o.resolve) {  // every chunk record read now (the metadata a caller sees is then whole)
    auto m = std::make_shared<Metadata>(*source->metadata);
    internal::ChunkCatalog catalog(source);
    internal::ResolveWith(catalog, *m);
    m->BuildIndex();
    auto resolved = std::make_shared<internal::ObjectSource>(*source);
    resolved->metadata = m;
    resolved->files.clear();
    for (const FileMeta& f : m->files) resolved->files.emplace(f.name, &f);
    source = resolved;
  }
  return std::make_unique<internal::Reader>(std::move(source), o.check_structure);
}

}  // namespace

Metadata ReadMetadata(const std::filesystem::path& dir, bool resolve) {
  if (internal::IsObjectUrl(dir)) {
    ReaderOptions o;
    o.resolve = resolve;
    return OpenObject(dir, o, /*download=*/false)->metadata();
  }
  return *internal::OpenPinned(dir, resolve).metadata;
}

std::unique_ptr<CheckpointReader> CheckpointReader::Open(const std::filesystem::path& dir, const ReaderOptions& o) {
  if (internal::IsObjectUrl(dir)) return OpenObject(dir, o, /*download=*/true);
  internal::Pinned p = internal::OpenPinned(dir, o.resolve);
  return std::make_unique<internal::Reader>(std::move(p.dir), std::move(p.metadata), o.check_structure);
}

std::unique_ptr<CheckpointReader> CheckpointReader::Open(const std::filesystem::path& dir, bool resolve) {
  ReaderOptions o;
  o.resolve = resolve;
  return Open(dir, o);
}

std::unique_ptr<CheckpointReader> CheckpointReader::Open(const std::filesystem::path& dir,
                                                         const ObjectStoreOptions& s3, bool resolve) {
  ReaderOptions o;
  o.resolve = resolve;
  o.s3 = s3;
  return Open(dir, o);
}

namespace {

// A lone shard read as a checkpoint (CheckpointReader::OpenShard): its tensors as its index
// lists them, located through HDF5 (never the index: with no checksums, the dataset checks
// -- own dataset, no virtual or external storage, allowed filters -- are all there is).
class LoneShardReader final : public CheckpointReader {
 public:
  explicit LoneShardReader(const std::filesystem::path& file)
      : file_(file),
        reader_(std::make_unique<storage::ShardReader>(file.parent_path(), file.filename().string(),
                                                       /*use_index=*/false)) {
    Describe(reader_->Index().entries);
  }
  const Metadata& metadata() const override { return metadata_; }
  const std::filesystem::path& dir() const override { return file_; }
  void ReadRegion(std::string_view key, const Box& region, void* out, bool) override {
    const EntryMeta& e = Tensor(key);
    int64_t covered = 0;
    const std::string k(key);
    for (const auto& c : e.chunks) {
      auto common = layout::Intersect(c.box, region);
      if (!common) continue;
      read_ += reader_->Read(k, e.dtype, c, *common, out, region, /*verify=*/false);
      covered += common->NumElements();
    }
    if (covered != region.NumElements())
      throw Error(ErrorCode::kInvalidArgument,
                  file_.string() + ": tensor '" + k + "' region " + region.ToString() +
                      " is not wholly in this shard (it holds part of the tensor; use the checkpoint directory)");
  }
  void ReadChunk(std::string_view key, std::size_t chunk_index, void* out, bool verify) override {
    ReadRegion(key, Chunk(key, chunk_index).box, out, verify);
  }
  std::vector<uint8_t> ReadBytes(std::string_view key, bool) override {
    throw Error(ErrorCode::kNotFound, file_.string() + ": bytes entry '" + std::string(key) +
                                          "' is not listed in a lone shard; use the checkpoint directory");
  }
  std::optional<FileRange> LocateChunk(std::string_view key, std::size_t chunk_index) override {
    const ChunkMeta& c = Chunk(key, chunk_index);
    const EntryMeta& e = Tensor(key);
    const uint64_t n = static_cast<uint64_t>(c.box.NumElements()) * DTypeSize(e.dtype);
    if (n == 0) return std::nullopt;
    const auto offset = reader_->Locate(std::string(key), e.dtype, c);
    if (!offset) return std::nullopt;
    return FileRange{file_, *offset, n};
  }
  void VerifyChunk(std::string_view key, std::size_t chunk_index) override { Chunk(key, chunk_index); }
  uint64_t bytes_read() const override { return read_; }
  std::unique_ptr<CheckpointReader> Reopen() const override { return std::make_unique<LoneShardReader>(file_); }
  std::optional<std::filesystem::path> PinnedPath(std::string_view) const override { return std::nullopt; }
  void ThrowIfReplaced() const override {}
  std::vector<std::string> StructureProblems() const override { return {}; }  // a part of a checkpoint
  void CheckStructure() const override {}

 private:
  const EntryMeta& Tensor(std::string_view key) const {
    const EntryMeta* e = metadata_.Find(key);
    if (!e || e->kind != EntryKind::kTensor)
      throw Error(ErrorCode::kNotFound, file_.string() + ": no tensor '" + std::string(key) + "'");
    return *e;
  }
  const ChunkMeta& Chunk(std::string_view key, std::size_t chunk_index) const {
    const EntryMeta& e = Tensor(key);
    if (chunk_index >= e.chunks.size())
      throw Error(ErrorCode::kInvalidArgument, file_.string() + ": tensor '" + std::string(key) +
                                                   "': no chunk " + std::to_string(chunk_index) + " in this shard");
    return e.chunks[chunk_index];
  }
  // The shard's tensors as its index lists them (bytes entries are not presented).
  void Describe(const std::vector<storage::ShardIndexEntry>& index) {
    const std::string where = file_.string() + ": ckpt_shard_index";
    const std::string name = file_.filename().string();
    metadata_.files.push_back(FileMeta{name, 0, reader_->file_size(), {}});
    metadata_.library_version = "";
    metadata_.state_dict_type = StateDictType::kSharded;
    metadata_.mesh = "null";
    metadata_.user = "{}";
    std::unordered_map<std::string, std::size_t> position;  // key -> index in entries
    for (const auto& c : index) {
      if (c.bytes) continue;
      ChunkMeta chunk;
      chunk.box = c.chunk.box;
      chunk.file = name;
      chunk.dataset = c.chunk.dataset;
      chunk.pack_offset = c.chunk.pack_offset;
      auto [at, fresh] = position.emplace(c.key, metadata_.entries.size());
      EntryMeta* e = fresh ? nullptr : &metadata_.entries[at->second].second;
      if (!e) {
        metadata_.entries.emplace_back(c.key, EntryMeta{});
        e = &metadata_.entries.back().second;
        e->kind = EntryKind::kTensor;
        e->dtype = c.dtype;
        e->shape = c.shape;
      } else if (e->dtype != c.dtype || e->shape != c.shape) {
        throw Error(ErrorCode::kCorrupt, where + ": tensor '" + c.key + "' listed with different dtypes or shapes");
      }
      e->chunks.push_back(std::move(chunk));
    }
    metadata_.BuildIndex();
  }

  std::filesystem::path file_;
  std::unique_ptr<storage::ShardReader> reader_;
  Metadata metadata_;
  uint64_t read_ = 0;
};

}  // namespace

std::unique_ptr<CheckpointReader> CheckpointReader::OpenShard(const std::filesystem::path& file) {
  return std::make_unique<LoneShardReader>(file);
}

namespace internal {

std::unique_ptr<CheckpointReader> Reader::Reopen() const {
  auto r = source_ ? std::make_unique<Reader>(source_, /*check_tiling=*/false, catalog_)
                   : std::make_unique<Reader>(handle_, metadata_, /*check_tiling=*/false, catalog_);
  r->keep_alive_ = keep_alive_;
  return r;
}

std::optional<std::filesystem::path> Reader::PinnedPath(std::string_view name) const {
  if (source_) return std::nullopt;
  return std::filesystem::path(storage::ProcPath(handle_.fd())) / name;
}

void Reader::ThrowIfReplaced() const {
  if (!source_ && handle_.Replaced()) handle_.ThrowChanged("its files are no longer all there");
}

Pinned OpenPinned(const std::filesystem::path& dir, bool resolve) {
  constexpr int kAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    try {
      Pinned p;
      p.dir = storage::Dir::Open(dir);
      p.metadata = std::make_shared<const Metadata>(ReadMetadataAt(p.dir, &p.text_hash, resolve));
      return p;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kChanged || attempt == kAttempts) throw;
    }
  }
}

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
  Metadata m = ParseMetadata(text, (dir.path() / names::kMetadataFile).string(), limits);
  if (resolve && !m.resolved) Resolve(dir, m);
  return m;
}

// --- the chunk catalog of a v2 checkpoint ------------------------------------------------

struct ChunkCatalog::File {
  std::once_flag once;
  std::exception_ptr failed;
  std::unordered_map<std::string, std::vector<storage::ShardIndexEntry>> records;  // by key
};

ChunkCatalog::ChunkCatalog(storage::Dir dir, std::shared_ptr<const Metadata> metadata)
    : dir_(std::move(dir)), metadata_(std::move(metadata)), base_(dir_.path()) {
  files_.resize(metadata_->files.size());
  for (auto& f : files_) f = std::make_unique<File>();
}

ChunkCatalog::ChunkCatalog(std::shared_ptr<const ObjectSource> source)
    : metadata_(source->metadata), source_(std::move(source)), base_(source_->url) {
  files_.resize(metadata_->files.size());
  for (auto& f : files_) f = std::make_unique<File>();
}

ChunkCatalog::~ChunkCatalog() = default;

ChunkCatalog::File& ChunkCatalog::Load(int32_t index) {
  if (index < 0 || static_cast<std::size_t>(index) >= files_.size()) {
    throw Error(ErrorCode::kCorrupt, base_.string() + ": file number " + std::to_string(index) + " is not one of the " +
                                         std::to_string(files_.size()) + " in metadata.json");
  }
  File& f = *files_[static_cast<std::size_t>(index)];
  std::call_once(f.once, [&] {
    try {
      const FileMeta& meta = metadata_->files[static_cast<std::size_t>(index)];
      std::string text;
      if (source_) {
        text = FetchIndexText(*source_, meta);
      } else {
        storage::ShardReader shard(dir_, meta.name, /*use_index=*/false);
        text = shard.IndexText();
      }
      const std::string where = (base_ / meta.name).string() + ": " + names::kShardIndexAttr;
      if (text.empty()) throw Error(ErrorCode::kCorrupt, where + ": missing (not a ckpt shard, or damaged)");
      const std::string got = storage::IndexDigest(text);
      if (got != meta.index) {
        throw Error(ErrorCode::kCorrupt, where + ": digest mismatch: metadata.json says " + meta.index +
                                             ", the index hashes to " + got +
                                             " (the shard was changed or damaged after it was written)");
      }
      storage::ShardIndex parsed = storage::ParseShardIndex(text, where);
      if (parsed.format_version < 2) {
        throw Error(ErrorCode::kCorrupt, where + ": a version " + std::to_string(parsed.format_version) +
                                             " index in a version 2 checkpoint");
      }
      for (storage::ShardIndexEntry& r : parsed.entries) {
        r.chunk.file = meta.name;
        std::string key = r.key;
        f.records[key].push_back(std::move(r));
      }
      // By offsets, for Find's binary search (a key may have millions of chunks in a file).
      for (auto& [key, list] : f.records)
        std::sort(list.begin(), list.end(), [](const storage::ShardIndexEntry& a, const storage::ShardIndexEntry& b) {
          return a.chunk.box.offsets < b.chunk.box.offsets;
        });
    } catch (...) {
      f.failed = std::current_exception();
    }
  });
  if (f.failed) std::rethrow_exception(f.failed);
  return f;
}

const std::unordered_map<std::string, std::vector<storage::ShardIndexEntry>>& ChunkCatalog::Records(int32_t file) {
  return Load(file).records;
}

namespace {
// Orders records by their chunk's offsets, and against a box's offsets.
struct OffsetsLess {
  bool operator()(const storage::ShardIndexEntry& r, const Shape& o) const { return r.chunk.box.offsets < o; }
  bool operator()(const Shape& o, const storage::ShardIndexEntry& r) const { return o < r.chunk.box.offsets; }
};
}  // namespace

const ChunkMeta& ChunkCatalog::Find(const std::string& key, const EntryMeta& e, const Box& box, int32_t file) {
  const auto& records = Load(file).records;
  // Called per chunk a read meets: the message is built only for an error.
  const auto corrupt = [&](const std::string& why) {
    return Error(ErrorCode::kCorrupt, (base_ / metadata_->files[static_cast<std::size_t>(file)].name).string() +
                                          ": " + std::string(EntryKindName(e.kind)) + " '" + key + "' chunk " +
                                          box.ToString() + ": " + why);
  };
  const auto it = records.find(key);
  const storage::ShardIndexEntry* found = nullptr;
  if (it != records.end()) {
    const auto [lo, hi] = std::equal_range(it->second.begin(), it->second.end(), box.offsets,
                                           OffsetsLess{});
    if (hi - lo > 1) throw corrupt("listed twice in the shard index");
    if (lo != hi) found = &*lo;
  }
  if (!found) throw corrupt("metadata.json places it in this file, its index does not hold it");
  if (found->chunk.box.sizes != box.sizes) {
    throw corrupt("the shard index gives it the box " + found->chunk.box.ToString() + ", the layout in metadata.json " +
                  box.ToString());
  }
  const bool bytes = e.kind == EntryKind::kBytes;
  if (found->bytes != bytes || (!bytes && (found->dtype != e.dtype || found->shape != e.shape))) {
    throw corrupt("the shard index describes it as another " + std::string(bytes ? "kind" : "dtype or shape") +
                  " than metadata.json");
  }
  return found->chunk;
}

void CheckStoredBytes(const std::string& key, const EntryMeta& e, uint64_t records) {
  if (records == e.stored_bytes) return;
  throw Error(ErrorCode::kCorrupt, std::string(names::kMetadataFile) + ": " + std::string(EntryKindName(e.kind)) +
                                       " '" + key + "': stored_bytes " + std::to_string(e.stored_bytes) +
                                       " is not the " + std::to_string(records) +
                                       " its chunk records in the shard indexes sum to (FORMAT.md §3.5)");
}

void Resolve(const storage::Dir& dir, Metadata& m) {
  auto shared = std::make_shared<const Metadata>(m);  // the catalog reads files and layouts only
  ChunkCatalog catalog(dir, shared);
  ResolveWith(catalog, m);
}

void ResolveWith(ChunkCatalog& catalog, Metadata& m) {
  for (auto& kv : m.entries) {  // (not a structured binding: clang 14 cannot capture one)
    const std::string& key = kv.first;
    EntryMeta& e = kv.second;
    if (e.kind != EntryKind::kTensor && e.kind != EntryKind::kBytes) continue;
    e.chunks.clear();
    const Shape shape = e.kind == EntryKind::kBytes ? Shape{static_cast<int64_t>(e.size)} : e.shape;
    grid::ForEachChunk(e.layout, shape, [&](const Box& box, int32_t file) {
      const ChunkMeta& c = catalog.Find(key, e, box, file);
      e.chunks.push_back(c);
    });
  }
  m.resolved = true;
}

// --- the reader --------------------------------------------------------------------------

std::vector<std::string> EntryTilingProblems(const std::string& key, const EntryMeta& e, bool resolved) {
  if (e.kind != EntryKind::kTensor) return {};
  if (!e.chunks.empty() || resolved) return CheckTiling(key, e);
  if (e.layout.kind != TensorLayout::Kind::kChunks) return {};  // a grid tiles by construction (checked at parse)
  EntryMeta pieces;  // the explicit list, as boxes CheckTiling can check
  pieces.shape = e.shape;
  pieces.chunks.resize(e.layout.pieces.size());
  for (std::size_t i = 0; i < e.layout.pieces.size(); ++i) pieces.chunks[i].box = e.layout.pieces[i].box;
  return CheckTiling(key, pieces);
}

Reader::Reader(storage::Dir dir, std::shared_ptr<const Metadata> metadata, bool check_tiling,
               std::shared_ptr<ChunkCatalog> catalog)
    : handle_(std::move(dir)), dir_(handle_.path()), metadata_(std::move(metadata)), catalog_(std::move(catalog)) {
  if (!metadata_->resolved && !catalog_) catalog_ = std::make_shared<ChunkCatalog>(handle_, metadata_);
  CheckOpen(check_tiling);
}

Reader::Reader(std::shared_ptr<const ObjectSource> source, bool check_tiling, std::shared_ptr<ChunkCatalog> catalog)
    : source_(std::move(source)), dir_(source_->url), metadata_(source_->metadata), catalog_(std::move(catalog)) {
  if (!metadata_->resolved && !catalog_) catalog_ = std::make_shared<ChunkCatalog>(source_);
  CheckOpen(check_tiling);
}

void Reader::CheckOpen(bool check_tiling) {
  if (check_tiling) CheckStructure();
}

namespace {

// FORMAT.md §8.5: what keeps the entries' chunks from tiling their tensors.
std::vector<std::string> TilingProblemsOf(const Metadata& md) {
  std::vector<std::string> problems;
  for (const auto& [key, e] : md.entries)
    for (std::string& p : EntryTilingProblems(key, e, md.resolved)) problems.push_back(std::move(p));
  return problems;
}

// FORMAT.md §3.5: a v2 entry's stored_bytes sums its records' (checked once all are read):
// calls `check(key, entry, sum)` for each entry that has records.
void ForEachStoredSum(const Metadata& md, const std::function<void(const std::string&, const EntryMeta&, uint64_t)>& check) {
  if (!md.resolved || md.format_version < 2) return;
  for (const auto& [key, e] : md.entries) {
    if (e.kind != EntryKind::kTensor && e.kind != EntryKind::kBytes) continue;
    uint64_t stored = 0;
    for (const ChunkMeta& c : e.chunks) stored = c.stored_bytes > UINT64_MAX - stored ? UINT64_MAX : stored + c.stored_bytes;
    check(key, e, stored);
  }
}

}  // namespace

std::vector<std::string> Reader::StructureProblems() const {
  std::vector<std::string> problems = TilingProblemsOf(*metadata_);
  if (!problems.empty()) return problems;  // sums over chunks that do not tile say nothing more
  ForEachStoredSum(*metadata_, [&](const std::string& key, const EntryMeta& e, uint64_t stored) {
    try {
      CheckStoredBytes(key, e, stored);
    } catch (const Error& err) {
      problems.push_back(err.what());
    }
  });
  return problems;
}

void Reader::CheckStructure() const {
  const std::vector<std::string> problems = TilingProblemsOf(*metadata_);
  if (problems.empty()) {
    ForEachStoredSum(*metadata_, CheckStoredBytes);
    return;
  }
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
    // A v2 chunk carries its offset from a digest-checked index: the v1 fast path (which
    // parses the index again per reader) is only for v1 checkpoints.
    it = shards_.emplace(file, std::make_unique<storage::ShardReader>(handle_, file, metadata_->format_version < 2)).first;
    if (metadata_->format_version >= 2) it->second->TrustRecords();
    it->second->UseDirectIo(direct_);
  }
  return *it->second;
}

uint64_t Reader::bytes_read_direct() const {
  uint64_t n = 0;
  for (const auto& [file, shard] : shards_) n += shard->bytes_read_direct();
  return n;
}

std::vector<const ChunkMeta*> Reader::ChunksMeeting(const std::string& key, const EntryMeta& e, const Box& region) {
  std::vector<const ChunkMeta*> out;
  if (!catalog_ || !e.chunks.empty()) {
    for (const ChunkMeta& c : e.chunks)
      if (layout::Intersect(c.box, region)) out.push_back(&c);
  } else {
    grid::ForEachCell(e.layout, e.shape, region,
                      [&](const Box& box, int32_t file) { out.push_back(&catalog_->Find(key, e, box, file)); });
  }
  // The chunks found must fill the region: they tile the tensor (checked at open), so
  // anything else is a layout this reader misread, and a read that filled less than it
  // was asked would return unwritten memory as data (issue 32.3).
  int64_t covered = 0;
  bool overflow = false;  // (chunks that overlap: refused at open, but never an overflow here)
  for (const ChunkMeta* c : out) {
    if (const auto inter = layout::Intersect(c->box, region))
      overflow |= __builtin_add_overflow(covered, inter->NumElements(), &covered);
  }
  if (overflow || covered != region.NumElements()) {
    throw Error(ErrorCode::kCorrupt, dir_.string() + ": tensor '" + key + "': the chunks its layout names cover " +
                                         std::to_string(covered) + " of the " + std::to_string(region.NumElements()) +
                                         " elements of " + region.ToString());
  }
  return out;
}

const ChunkMeta& Reader::ChunkAt(const std::string& key, const EntryMeta& e, std::size_t chunk_index) {
  if (!catalog_ || !e.chunks.empty()) {
    if (chunk_index >= e.chunks.size()) {
      throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': no chunk " + std::to_string(chunk_index));
    }
    return e.chunks[chunk_index];
  }
  const Shape shape = e.kind == EntryKind::kBytes ? Shape{static_cast<int64_t>(e.size)} : e.shape;
  const ChunkMeta* found = nullptr;
  std::size_t i = 0;
  grid::ForEachChunk(e.layout, shape, [&](const Box& box, int32_t file) {
    if (i++ == chunk_index) found = &catalog_->Find(key, e, box, file);
  });
  if (!found) throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': no chunk " + std::to_string(chunk_index));
  return *found;
}

void Reader::ReadRegion(std::string_view key_view, const Box& region, void* out, bool verify) {
  const std::string key(key_view);
  const EntryMeta& e = TensorEntry(key);
  if (!layout::Contains(Box::Full(e.shape), region) || region.offsets.size() != e.shape.size()) {
    throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': region " + region.ToString() +
                                                 " is not inside the tensor " + Box::Full(e.shape).ToString());
  }
  for (const ChunkMeta* c : ChunksMeeting(key, e, region)) ReadRegionPart(key, *c, region, out, verify);
}

void Reader::ReadRegionPart(const std::string& key, const ChunkMeta& c, const Box& region, void* out, bool verify) {
  const auto inter = layout::Intersect(c.box, region);
  if (!inter) return;
  bytes_read_ += ReadStored(key, TensorEntry(key).dtype, c, *inter, out, region, verify);
}

uint64_t Reader::ReadStored(const std::string& key, DType dtype, const ChunkMeta& c, const Box& region, void* out,
                            const Box& out_box, bool verify) {
  if (source_) return ReadObjectPart(*source_, key, dtype, c, region, out, out_box, verify, &window_);
  return Shard(c.file).Read(key, dtype, c, region, out, out_box, verify);
}

void Reader::ReadChunk(std::string_view key_view, std::size_t chunk_index, void* out, bool verify) {
  const std::string key(key_view);
  const EntryMeta* e = metadata_->Find(key);
  if (!e) throw Error(ErrorCode::kNotFound, dir_.string() + ": no key '" + key + "'");
  const ChunkMeta& c = ChunkAt(key, *e, chunk_index);
  bytes_read_ += ReadStored(key, e->dtype, c, c.box, out, c.box, verify);
}

std::optional<FileRange> Reader::LocateChunk(std::string_view key_view, std::size_t chunk_index) {
  const std::string key(key_view);
  const EntryMeta* e = metadata_->Find(key);
  if (!e) throw Error(ErrorCode::kNotFound, dir_.string() + ": no key '" + key + "'");
  if (e->kind != EntryKind::kTensor && e->kind != EntryKind::kBytes) {
    throw Error(ErrorCode::kMismatch, dir_.string() + ": key '" + key + "' is a " +
                                          std::string(EntryKindName(e->kind)) + ": it has no stored bytes");
  }
  const ChunkMeta& c = ChunkAt(key, *e, chunk_index);  // a bytes entry's box is its 1-D extent (parser)
  const uint64_t length = static_cast<uint64_t>(c.box.NumElements()) * DTypeSize(e->dtype);
  if (length == 0 || source_) return std::nullopt;  // (an object is no local file)
  storage::ShardReader& shard = Shard(c.file);
  const auto offset = shard.Locate(key, e->dtype, c);
  if (!offset) return std::nullopt;
  return FileRange{dir_ / c.file, *offset, length, shard.fd()};  // the pinned file, not whatever is at the path now
}

void Reader::VerifyChunk(std::string_view key_view, std::size_t chunk_index) {
  const std::string key(key_view);
  const EntryMeta* e = metadata_->Find(key);
  if (!e) throw Error(ErrorCode::kNotFound, dir_.string() + ": no key '" + key + "'");
  if (e->kind != EntryKind::kTensor && e->kind != EntryKind::kBytes) {
    throw Error(ErrorCode::kMismatch, dir_.string() + ": key '" + key + "' is a " +
                                          std::string(EntryKindName(e->kind)) + ": it has no stored bytes");
  }
  const ChunkMeta& c = ChunkAt(key, *e, chunk_index);
  if (source_) {  // every block fetched and checked, and the checksum over them
    const uint64_t n = static_cast<uint64_t>(c.box.NumElements()) * DTypeSize(e->dtype);
    if (n > source_->File(c.file).bytes) {
      throw Error(ErrorCode::kCorrupt, dir_.string() + ": '" + key + "' chunk " + c.box.ToString() + " claims " +
                                           std::to_string(n) + " bytes, more than its file holds");
    }
    std::vector<unsigned char> tmp(static_cast<std::size_t>(n));
    bytes_read_ += ReadObjectPart(*source_, key, e->dtype, c, c.box, tmp.data(), c.box, true);
    return;
  }
  bytes_read_ += Shard(c.file).Verify(key, e->dtype, c);
}

std::vector<uint8_t> Reader::ReadBytes(std::string_view key_view, bool verify) {
  const std::string key(key_view);
  const EntryMeta* e = metadata_->Find(key);
  if (!e) throw Error(ErrorCode::kNotFound, dir_.string() + ": no key '" + key + "'");
  if (e->kind != EntryKind::kBytes) {
    throw Error(ErrorCode::kMismatch, "key '" + key + "' is a " + std::string(EntryKindName(e->kind)) + ", not bytes");
  }
  const ChunkMeta& c = ChunkAt(key, *e, 0);
  if (e->size > (source_ ? source_->File(c.file).bytes : Shard(c.file).file_size())) {
    throw Error(ErrorCode::kCorrupt, dir_.string() + ": bytes entry '" + key + "' claims " + std::to_string(e->size) +
                                         " bytes, more than its file holds");
  }
  std::vector<uint8_t> out(e->size);
  ReadChunk(key, 0, out.data(), verify);
  return out;
}

}  // namespace internal
}  // namespace ckpt
