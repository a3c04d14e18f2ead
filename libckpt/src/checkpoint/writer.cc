// checkpoint/writer.cc: CheckpointWriter, a single-process streaming writer.
//
// Memory: a chunk's bytes go straight to its shard, and its record (box, dataset, offset,
// checksums, statistics) into that shard's index, which the shard spills to disk as it
// grows. metadata.json (format v2) needs only each key's layout and aggregates, so per key
// the writer keeps a grid::LayoutBuilder (4 bytes a chunk while the chunks form a grid: a
// file position per cell) and running statistics; only a key whose chunks are no grid keeps
// their boxes. The Metadata is built at Commit.
#include <cstdio>
#include <map>
#include <unordered_map>

#include "checkpoint/commit.h"
#include "checkpoint/object_save.h"
#include "ckpt/checkpoint.h"
#include "format/grid.h"
#include "format/names.h"
#include "layout/box.h"
#include "storage/fs.h"
#include "storage/shard_writer.h"

namespace ckpt {
namespace {

class Writer final : public CheckpointWriter {
 public:
  Writer(std::filesystem::path dir, const Options& options) : dir_(std::move(dir)), options_(options) {
    if (options_.num_files < 1 || options_.world_size < 1) {
      throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: num_files and world_size must be >= 1");
    }
    if (internal::IsObjectUrl(dir_)) {
      // s3://: the files are staged locally under names unique to this save and uploaded at
      // Commit, which then commits metadata.json by one conditional PUT.
      object_ = internal::ObjectSave::Begin(dir_.string(), options_.s3, options_.overwrite);
      staging_ = object_->LocalStaging("writer");
    } else {
      staging_ = internal::MakeStagingDir(dir_, options_.overwrite);
    }
    shards_.resize(static_cast<std::size_t>(options_.num_files));
  }

  ~Writer() override {
    shards_.clear();
    if (!committed_ && !object_) storage::RemoveAllQuietly(staging_);
    if (!committed_ && object_) object_->DiscardUploads();
  }

  void WriteChunk(std::string_view key_view, DType dtype, const Shape& shape, const Box& box, const void* data,
                  int file_index) override {
    const std::string key(key_view);
    const std::size_t entry = CheckChunk(key, dtype, shape, box);
    Record(entry, file_index, Shard(file_index).WriteChunk(key, dtype, shape, box, data));
  }

  std::unique_ptr<ChunkStream> OpenChunk(std::string_view key_view, DType dtype, const Shape& shape, const Box& box,
                                         int file_index, const std::optional<ChunkStats>& stats) override {
    const std::string key(key_view);
    const std::size_t entry = CheckChunk(key, dtype, shape, box);
    return std::make_unique<Stream>(*this, entry, file_index,
                                    Shard(file_index).Begin(key, dtype, shape, box, stats));
  }
  void WriteScalar(std::string_view key, const Scalar& value) override {
    EntryMeta& e = Entry(std::string(key), EntryKind::kScalar);
    e.dtype = value.dtype;
    if (value.dtype == DType::kBool) {
      e.value = value.AsInt() ? "true" : "false";
    } else if (IsFloating(value.dtype)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", value.AsDouble());
      e.value = buf;
      if (e.value.find_first_of(".eE") == std::string::npos) e.value += ".0";
    } else {
      e.value = std::to_string(value.AsInt());
    }
  }

  void WriteBytes(std::string_view key, std::span<const uint8_t> data, int file_index) override {
    EntryMeta& e = Entry(std::string(key), EntryKind::kBytes);
    e.dtype = DType::kUInt8;
    e.size = data.size();
    e.chunks.push_back(Shard(file_index).WriteBytes(std::string(key), data.data(), data.size()));
  }

  void WriteJson(std::string_view key, std::string_view json_text) override {
    EntryMeta& e = Entry(std::string(key), EntryKind::kJson);
    e.value = std::string(json_text);
  }

  Metadata Commit() override {
    if (committed_) throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: already committed");
    if (open_streams_ > 0) {
      throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: Commit() with " + std::to_string(open_streams_) +
                                                   " chunk stream(s) still open");
    }
    // Shard i is the position-th file of those written.
    std::vector<int32_t> position(shards_.size(), -1);
    for (std::size_t i = 0, n = 0; i < shards_.size(); ++i)
      if (shards_[i]) position[i] = static_cast<int32_t>(n++);
    std::string problems;
    for (std::size_t i = 0; i < metadata_.entries.size(); ++i) {
      auto& [key, e] = metadata_.entries[i];
      if (e.kind != EntryKind::kTensor) continue;
      for (const std::string& p : BuildLayout(key, e, i < keys_.size() ? keys_[i].get() : nullptr, position))
        problems += "\n  " + p;
    }
    keys_.clear();
    if (!problems.empty()) {
      throw Error(ErrorCode::kInvalidArgument, dir_.string() + ": refusing to commit:" + problems);
    }
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      if (!shards_[i]) continue;
      const storage::ShardWriter::Written shard = shards_[i]->Finish();
      metadata_.files.push_back(FileMeta{shards_[i]->file_name(), static_cast<int>(i), shard.bytes, shard.index,
                                          shard.index_offset, shard.index_bytes});
    }
    shards_.clear();
    metadata_.resolved = false;  // the chunk records are in the shard indexes
    metadata_.state_dict_type = options_.state_dict_type;
    metadata_.world_size = options_.world_size;
    metadata_.mesh = options_.mesh;
    metadata_.user = options_.user_metadata;
    internal::StampMetadata(metadata_);
    metadata_.BuildIndex();
    // Round-trip through the parser: what we commit is what any reader will accept.
    ParseMetadata(SerializeMetadata(metadata_), (dir_ / "metadata.json").string());
    if (object_) {
      for (const FileMeta& f : metadata_.files) object_->Upload(f.name);
      object_->Commit(metadata_);
    } else {
      internal::CommitStaging(staging_, dir_, metadata_);
    }
    committed_ = true;
    // Handed over, not copied: the writer is done with it, and a copy was one more entry
    // per key at a tool's peak (ckpt-convert verifies its output while it holds this).
    Metadata out = std::move(metadata_);
    metadata_ = Metadata();
    return out;
  }

 private:
  class Stream final : public ChunkStream {
   public:
    Stream(Writer& w, std::size_t entry, int file, std::unique_ptr<storage::ShardWriter::Stream> s)
        : w_(w), entry_(entry), file_(file), s_(std::move(s)) {
      ++w_.open_streams_;
    }
    ~Stream() override {
      if (s_) --w_.open_streams_;
    }
    void Write(const void* data, std::size_t n) override { Open().Write(data, n); }
    void Copy(const FileRange& range, const ChunkMeta* expected) override {
      Open().Copy(range.fd >= 0 ? range.fd : w_.Source(range.file).get(), range.offset, static_cast<std::size_t>(range.length), range.file,
                  expected, range.file.string() + ": bytes at offset " + std::to_string(range.offset));
    }
    void Close() override {
      w_.Record(entry_, file_, Open().Finish());
      s_.reset();
      --w_.open_streams_;
    }

   private:
    storage::ShardWriter::Stream& Open() {
      if (!s_) throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: chunk stream used after Close()");
      return *s_;
    }
    Writer& w_;
    std::size_t entry_;
    int file_;
    std::unique_ptr<storage::ShardWriter::Stream> s_;
  };

  // What the writer keeps of one tensor key's chunks until Commit.
  struct KeyState {
    explicit KeyState(std::size_t rank) : layout(rank) {}
    grid::LayoutBuilder layout;  // boxes, with their shard numbers as files
    StatsAccumulator stats;
    uint64_t stored_bytes = 0;
    Compression compression;
  };

  void Record(std::size_t entry, int file, const ChunkMeta& chunk) {
    KeyState& k = *keys_.at(entry);
    k.layout.Add(chunk.box, file);
    k.stats.Add(chunk.stats ? &*chunk.stats : nullptr);
    k.stored_bytes += chunk.stored_bytes;
    if (chunk.compression.codec != Compression::Codec::kNone && k.compression.codec == Compression::Codec::kNone)
      k.compression = chunk.compression;
  }

  // The entry's layout and aggregates from what was recorded (shard numbers become
  // positions in Metadata::files). Returns what keeps its chunks from tiling the tensor.
  static std::vector<std::string> BuildLayout(const std::string& key, EntryMeta& e, const KeyState* k,
                                              const std::vector<int32_t>& position) {
    std::vector<grid::PlacedBox> placed;
    if (k) placed = k->layout.Finish();
    for (grid::PlacedBox& p : placed) p.file = position.at(static_cast<std::size_t>(p.file));
    e.layout = grid::DescribeLayout(e.shape, placed);
    if (e.layout.kind != TensorLayout::Kind::kGrid) {  // a grid tiles by construction; a list may not
      std::vector<Box> boxes;
      boxes.reserve(placed.size());
      for (const grid::PlacedBox& p : placed) boxes.push_back(p.box);
      std::vector<std::string> problems = layout::TilingProblems(e.shape, boxes);
      for (std::string& p : problems) p = "tensor '" + key + "': " + p;
      if (!problems.empty()) return problems;
    }
    if (k) {
      if (IsFloating(e.dtype)) e.stats = k->stats.Result();
      e.stored_bytes = k->stored_bytes;
      e.compression = k->compression;
    }
    return {};
  }

  // Validates a tensor chunk against its entry (creating it on first use); returns the
  // entry's index.
  std::size_t CheckChunk(const std::string& key, DType dtype, const Shape& shape, const Box& box) {
    EntryMeta& e = Entry(key, EntryKind::kTensor);
    const std::size_t entry = index_.at(key);
    if (typed_.size() <= entry) typed_.resize(entry + 1, false);
    if (!typed_[entry]) {  // the first chunk of the key fixes its dtype and shape
      NumElements(shape);
      e.dtype = dtype;
      e.shape = shape;
      typed_[entry] = true;
      if (keys_.size() <= entry) keys_.resize(entry + 1);
      keys_[entry] = std::make_unique<KeyState>(shape.size());
    } else if (e.dtype != dtype || e.shape != shape) {
      throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: key '" + key + "': chunk of " +
                                                   std::string(DTypeName(dtype)) + " " + Box::Full(shape).ToString() +
                                                   " after one of " + std::string(DTypeName(e.dtype)) + " " +
                                                   Box::Full(e.shape).ToString());
    }
    if (!layout::Contains(Box::Full(shape), box)) {
      throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: key '" + key + "': chunk " + box.ToString() +
                                                   " lies outside " + Box::Full(shape).ToString());
    }
    return entry;
  }

  // An open descriptor of a file chunks are copied from (kept until the writer goes).
  const storage::Fd& Source(const std::filesystem::path& file) {
    auto it = sources_.find(file.string());
    if (it == sources_.end()) it = sources_.emplace(file.string(), storage::OpenRegularFile(file)).first;
    return it->second;
  }

  EntryMeta& Entry(const std::string& key, EntryKind kind) {
    if (committed_) throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: key '" + key + "' written after Commit()");
    if (std::string why = KeyProblem(key); !why.empty()) {
      throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: " + why);
    }
    auto it = index_.find(key);
    if (it == index_.end()) {
      it = index_.emplace(key, metadata_.entries.size()).first;
      EntryMeta e;
      e.kind = kind;
      metadata_.entries.emplace_back(key, std::move(e));
    } else if (metadata_.entries[it->second].second.kind != kind || kind != EntryKind::kTensor) {
      throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: key '" + key + "' written twice");
    }
    return metadata_.entries[it->second].second;
  }

  storage::ShardWriter& Shard(int index) {
    if (index < 0 || index >= options_.num_files) {
      throw Error(ErrorCode::kInvalidArgument, "CheckpointWriter: file index " + std::to_string(index) +
                                                   " out of range [0, " + std::to_string(options_.num_files) + ")");
    }
    auto& s = shards_[static_cast<std::size_t>(index)];
    if (!s) {
      std::string name = internal::ShardFileName(index, options_.num_files);
      if (object_) name = object_->ObjectName(name);
      s = std::make_unique<storage::ShardWriter>(staging_, name,
                                                 options_.compression, storage::kDefaultBlockBytes,
                                                 options_.pack_bytes);
    }
    return *s;
  }

  std::filesystem::path dir_;
  Options options_;
  std::filesystem::path staging_;
  std::unique_ptr<internal::ObjectSave> object_;  // an s3:// target's (object_save.h)
  std::vector<std::unique_ptr<storage::ShardWriter>> shards_;
  Metadata metadata_;
  std::unordered_map<std::string, std::size_t> index_;
  std::vector<bool> typed_;  // per entry: a tensor whose first chunk fixed dtype and shape
  std::vector<std::unique_ptr<KeyState>> keys_;  // per entry: a tensor's chunks so far
  std::map<std::string, storage::Fd> sources_;
  int open_streams_ = 0;
  bool committed_ = false;
};

}  // namespace

std::unique_ptr<CheckpointWriter> CheckpointWriter::Create(const std::filesystem::path& dir, const Options& options) {
  return std::make_unique<Writer>(dir, options);
}

}  // namespace ckpt
