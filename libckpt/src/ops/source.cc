// ops/source.cc: see ckpt/ops/source.h.
#include "ckpt/ops/source.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/digest.h"
#include "ckpt/error.h"
#include "ckpt/files.h"
#include "ckpt/ops/safetensors.h"
#include "ops/util.h"

namespace ckpt::ops {
namespace {

using nlohmann::json;

// A checkpoint (a directory, pinned: FORMAT.md §2.7; or s3://) or a lone shard, read
// through libckpt's CheckpointReader. Copies made by Reopen (for other threads) read the
// very checkpoint this one reads. Opened without the structure check, so that a broken
// checkpoint can still be described; the check runs before the first read of data.
// On object storage the store is reached as the library reaches it (ObjectStoreOptions{}:
// AWS_* environment, ~/.aws files).
class ReaderSource final : public Source {
 public:
  ReaderSource(const std::filesystem::path& path, SourceKind kind, std::unique_ptr<CheckpointReader> reader)
      : kind_(kind), reader_(std::move(reader)) {
    path_ = path;
    metadata_ = reader_->metadata();
  }
  SourceKind kind() const override { return kind_; }
  std::unique_ptr<Source> Reopen() const override {
    auto copy = std::make_unique<ReaderSource>(path_, kind_, reader_->Reopen());
    copy->checked_ = checked_;
    return copy;
  }
  std::filesystem::path PinnedFile(const std::string& name) const override {
    return reader_->PinnedPath(name).value_or(std::filesystem::path());
  }
  void ThrowIfReplaced() const override { reader_->ThrowIfReplaced(); }
  void ReadRegion(std::string_view key, const Box& region, void* out) override {
    Reader().ReadRegion(key, region, out, /*verify=*/true);
  }
  std::vector<uint8_t> ReadBytes(std::string_view key) override { return Reader().ReadBytes(key, /*verify=*/true); }
  uint64_t bytes_read() const override { return reader_->bytes_read(); }
  std::optional<FileRange> Locate(std::string_view key, std::size_t chunk) override {
    return Reader().LocateChunk(key, chunk);
  }
  void VerifyChunk(std::string_view key, std::size_t chunk) override { Reader().VerifyChunk(key, chunk); }

 private:
  CheckpointReader& Reader() {
    if (!checked_) reader_->CheckStructure();  // as a reader opened with the check would have
    checked_ = true;
    return *reader_;
  }
  SourceKind kind_;
  std::unique_ptr<CheckpointReader> reader_;
  bool checked_ = false;
};

// One .safetensors file, or the Hub's sharded layout (an index and the files it names):
// each file's tensors, as whole-tensor chunks of that file.
class SafetensorsSource final : public Source {
 public:
  SafetensorsSource(const std::filesystem::path& file, bool skip_unsupported) {
    path_ = file;
    Add(SafetensorsReader::Open(file, skip_unsupported));
    Finish();
  }
  SafetensorsSource(const SafetensorsIndex& index, bool skip_unsupported) {
    path_ = index.path;
    const std::filesystem::path dir = index.path.parent_path();
    std::unordered_map<std::string_view, std::string_view> file_of;  // weight_map
    for (const auto& [tensor, file] : index.weight_map) file_of.emplace(tensor, file);
    for (const std::string& name : index.files) {
      try {
        Add(SafetensorsReader::Open(dir / name, skip_unsupported));
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kNotFound) throw;
        throw Error(ErrorCode::kCorrupt, index.path.string() + ": the weight_map names " + name +
                                             ", which is not there (" + e.what() + ")");
      }
      const SafetensorsReader& r = *readers_.back();
      auto listed = [&](const std::string& tensor) {
        const auto it = file_of.find(tensor);
        if (it == file_of.end())
          throw Error(ErrorCode::kCorrupt, index.path.string() + ": tensor '" + tensor + "' of " + name +
                                               " is not in the weight_map");
        if (it->second != name)
          throw Error(ErrorCode::kCorrupt, index.path.string() + ": tensor '" + tensor + "' is in " + name +
                                               " but the weight_map puts it in " + std::string(it->second));
      };
      for (const auto& t : r.tensors()) listed(t.name);
      for (const auto& [tensor, dtype] : r.skipped()) listed(tensor);
    }
    for (const auto& [tensor, file] : index.weight_map)
      if (!where_.count(tensor) && !skipped_names_.count(tensor))
        throw Error(ErrorCode::kCorrupt, index.path.string() + ": weight_map puts tensor '" + tensor + "' in " +
                                             file + ", which does not hold it");
    Finish();
  }
  SourceKind kind() const override { return SourceKind::kSafetensors; }
  // Bytes of a file that carries ckpt's digests are checked before they are returned: a
  // whole tensor as it is read, part of one by checking the whole tensor first (once).
  void ReadRegion(std::string_view key, const Box& region, void* out) override {
    const auto [r, t] = Find(key);
    const uint64_t n = static_cast<uint64_t>(region.NumElements()) * DTypeSize(t->dtype);
    const bool whole = region == Box::Full(t->shape);
    if (r->block_bytes() && !whole) VerifyTensor(*r, *t);
    r->ReadRegion(*t, region, out);
    read_ += n;
    if (r->block_bytes() && whole && !verified_.count(t)) {  // the bytes just read, not read again
      ChunkDigest digest(DType::kUInt8, false, r->block_bytes());
      digest.Update(out, static_cast<std::size_t>(n));
      CheckTensorDigest(*r, *t, digest);
    }
  }
  std::vector<uint8_t> ReadBytes(std::string_view key) override {
    throw Error(ErrorCode::kNotFound, path_.string() + ": no bytes entry '" + std::string(key) +
                                          "' (safetensors holds tensors only)");
  }
  uint64_t bytes_read() const override { return read_; }
  std::optional<FileRange> Locate(std::string_view key, std::size_t chunk) override {
    const auto [r, t] = Find(key);
    if (chunk != 0) throw Error(ErrorCode::kNotFound, path_.string() + ": no tensor '" + std::string(key) + "'");
    if (t->end == t->begin) return std::nullopt;
    return FileRange{r->path(), r->data_start() + t->begin, t->end - t->begin};
  }
  void VerifyChunk(std::string_view key, std::size_t) override {  // against ckpt's digests, if the file has them
    const auto [r, t] = Find(key);
    if (r->block_bytes()) VerifyTensor(*r, *t);
  }

 private:
  static std::string Where(const SafetensorsReader& r, const SafetensorsTensor& t) {
    return r.path().string() + ": tensor '" + t.name + "'";
  }
  // Tensor `t`'s bytes, read from its file, against its digests (once per tensor).
  void VerifyTensor(const SafetensorsReader& r, const SafetensorsTensor& t) {
    if (verified_.count(&t)) return;
    ChunkDigest digest(DType::kUInt8, false, r.block_bytes());
    r.ScanTensor(t, [&](const unsigned char* p, std::size_t n) { digest.Update(p, n); });
    CheckTensorDigest(r, t, digest);
  }
  // `digest` of all of `t`'s bytes against the blocks its file records; `t` verified after.
  void CheckTensorDigest(const SafetensorsReader& r, const SafetensorsTensor& t, const ChunkDigest& digest) {
    digest.Check(metadata_.Find(t.name)->chunks.front(), t.end - t.begin, Where(r, t));
    verified_.insert(&t);
  }
  void Add(std::unique_ptr<SafetensorsReader> reader) {
    const SafetensorsReader& r = *reader;
    const std::string name = r.path().filename().string();
    metadata_.files.push_back(FileMeta{name, 0, r.file_size(), {}});
    for (const auto& [k, v] : r.metadata())  // the first file's value wins; digests describe the file, not the model
      if (!IsSafetensorsDigestKey(k)) user_.emplace(k, v);
    for (const auto& s : r.skipped()) {
      skipped_.push_back(s);
      skipped_names_.insert(s.first);
    }
    for (const auto& t : r.tensors()) {
      if (!where_.emplace(t.name, readers_.size()).second || skipped_names_.count(t.name))
        throw Error(ErrorCode::kCorrupt, r.path().string() + ": tensor '" + t.name + "' is in another file too");
      EntryMeta e;
      e.kind = EntryKind::kTensor;
      e.dtype = t.dtype;
      e.shape = t.shape;
      ChunkMeta c;
      c.box = Box::Full(t.shape);
      c.file = name;
      c.dataset = t.name;
      c.stored_bytes = t.end - t.begin;
      if (r.block_bytes()) {  // ckpt's digests: readers and the copies of a convert check them
        c.block_bytes = r.block_bytes();
        c.blocks = t.blocks;
        c.checksum = ChecksumOfBlocks(t.blocks);
      }
      e.chunks.push_back(std::move(c));
      metadata_.entries.emplace_back(t.name, std::move(e));
    }
    readers_.push_back(std::move(reader));
  }
  void Finish() {
    metadata_.state_dict_type = StateDictType::kFull;
    metadata_.world_size = 1;
    metadata_.library_version = "safetensors";
    metadata_.mesh = "null";
    json user = json::object();
    for (const auto& [k, v] : user_) user[k] = v;
    metadata_.user = user.dump();
    metadata_.BuildIndex();
  }
  std::pair<const SafetensorsReader*, const SafetensorsTensor*> Find(std::string_view key) const {
    const auto it = where_.find(std::string(key));
    const SafetensorsTensor* t = it == where_.end() ? nullptr : readers_[it->second]->Find(key);
    if (!t) throw Error(ErrorCode::kNotFound, path_.string() + ": no tensor '" + std::string(key) + "'");
    return {readers_[it->second].get(), t};
  }

  std::vector<std::unique_ptr<SafetensorsReader>> readers_;
  std::unordered_map<std::string, std::size_t> where_;  // tensor -> index in readers_
  std::unordered_set<std::string> skipped_names_;
  std::map<std::string, std::string> user_;
  std::unordered_set<const SafetensorsTensor*> verified_;  // checked against their digests
  uint64_t read_ = 0;
};

// The first `n` bytes of a file the user named (fewer if it is shorter); refuses a FIFO,
// device or directory without blocking on it.
std::string Head(const std::filesystem::path& p, std::size_t n) {
  const files::File f = files::File::OpenForRead(p, /*follow_symlinks=*/true);
  std::string head(static_cast<std::size_t>(std::min<uint64_t>(n, f.Size())), '\0');
  f.ReadAt(head.data(), head.size(), 0);
  return head;
}

}  // namespace

std::string_view SourceKindName(SourceKind kind) {
  switch (kind) {
    case SourceKind::kCheckpoint: return "checkpoint";
    case SourceKind::kShard: return "shard";
    case SourceKind::kSafetensors: return "safetensors";
  }
  return "?";
}

bool Source::HoldsWhole(std::string_view key) const {
  const EntryMeta* e = metadata_.Find(key);
  if (!e || e->kind != EntryKind::kTensor) return e != nullptr;
  if (kind() != SourceKind::kShard) return true;
  uint64_t n = 0;
  for (const auto& c : e->chunks) n += static_cast<uint64_t>(c.box.NumElements());
  return n == static_cast<uint64_t>(NumElements(e->shape));
}

std::unique_ptr<Source> Source::Reopen() const { return Open(path_, !skipped_.empty()); }

std::unique_ptr<Source> Source::Open(const std::filesystem::path& path, bool skip_unsupported, bool resolve) {
  ReaderOptions checkpoint;
  checkpoint.resolve = resolve;
  checkpoint.check_structure = false;
  if (IsObjectUrl(path))
    return std::make_unique<ReaderSource>(path, SourceKind::kCheckpoint, CheckpointReader::Open(path, checkpoint));
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st))
    throw Error(ErrorCode::kNotFound, path.string() + ": no such file or directory");
  if (std::filesystem::is_directory(st)) {
    if (!std::filesystem::exists(path / kMetadataFileName, ec))
      if (const auto model = FindHubModel(path)) {  // a Hub model directory: sharded, or one file
        if (model->filename().string().ends_with(kSafetensorsIndexSuffix))
          return std::make_unique<SafetensorsSource>(ReadSafetensorsIndex(*model), skip_unsupported);
        return std::make_unique<SafetensorsSource>(*model, skip_unsupported);
      }
    if (!std::filesystem::exists(path / kMetadataFileName, ec))
      throw Error(ErrorCode::kNotFound,
                  path.string() + ": not a checkpoint (no metadata.json; an uncommitted save?)");
    return std::make_unique<ReaderSource>(path, SourceKind::kCheckpoint, CheckpointReader::Open(path, checkpoint));
  }
  if (path.extension() == ".safetensors") return std::make_unique<SafetensorsSource>(path, skip_unsupported);
  if (path.filename().string().ends_with(kSafetensorsIndexSuffix))
    return std::make_unique<SafetensorsSource>(ReadSafetensorsIndex(path), skip_unsupported);
  const std::string head = Head(path, 9);
  if (head.starts_with(std::string_view("\x89HDF\r\n\x1a\n", 8))) return std::make_unique<ReaderSource>(path, SourceKind::kShard, CheckpointReader::OpenShard(path));
  if (path.filename() == kMetadataFileName) return Open(path.parent_path(), skip_unsupported, resolve);
  // A safetensors file under another name: its header starts after 8 bytes with '{'.
  if (head.size() == 9 && head[8] == '{') return std::make_unique<SafetensorsSource>(path, skip_unsupported);
  throw Error(ErrorCode::kUnsupported,
              path.string() + ": neither a checkpoint directory, an HDF5 shard nor a safetensors file");
}

}  // namespace ckpt::ops
