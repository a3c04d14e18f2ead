// checkpoint/writer.cc: CheckpointWriter, a single-process streaming writer.
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/commit.h"
#include "ckpt/checkpoint.h"
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
    internal::CheckTarget(dir_, options_.overwrite);
    staging_ = internal::MakeStagingDir(dir_);
    shards_.resize(static_cast<std::size_t>(options_.num_files));
  }

  ~Writer() override {
    shards_.clear();
    if (!committed_) storage::RemoveAllQuietly(staging_);
  }

  void WriteChunk(std::string_view key_view, DType dtype, const Shape& shape, const Box& box, const void* data,
                  int file_index) override {
    const std::string key(key_view);
    const std::size_t entry = CheckChunk(key, dtype, shape, box);
    ChunkMeta chunk = Shard(file_index).WriteChunk(key, dtype, shape, box, data);
    metadata_.entries[entry].second.chunks.push_back(std::move(chunk));
  }

  std::unique_ptr<ChunkStream> OpenChunk(std::string_view key_view, DType dtype, const Shape& shape, const Box& box,
                                         int file_index, const std::optional<ChunkStats>& stats) override {
    const std::string key(key_view);
    const std::size_t entry = CheckChunk(key, dtype, shape, box);
    return std::make_unique<Stream>(*this, entry, Shard(file_index).Begin(key, dtype, shape, box, stats));
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
    std::string problems;
    for (const auto& [key, e] : metadata_.entries) {
      if (e.kind != EntryKind::kTensor) continue;
      for (const std::string& p : CheckTiling(key, e)) problems += "\n  " + p;
    }
    if (!problems.empty()) {
      throw Error(ErrorCode::kInvalidArgument, dir_.string() + ": refusing to commit:" + problems);
    }
    for (std::size_t i = 0; i < shards_.size(); ++i) {
      if (!shards_[i]) continue;
      const uint64_t bytes = shards_[i]->Finish();
      metadata_.files.push_back(FileMeta{shards_[i]->file_name(), static_cast<int>(i), bytes});
    }
    shards_.clear();
    metadata_.state_dict_type = options_.state_dict_type;
    metadata_.world_size = options_.world_size;
    metadata_.mesh = options_.mesh;
    metadata_.user = options_.user_metadata;
    internal::StampMetadata(metadata_);
    metadata_.BuildIndex();
    // Round-trip through the parser: what we commit is what any reader will accept.
    ParseMetadata(SerializeMetadata(metadata_), (dir_ / "metadata.json").string());
    internal::CommitStaging(staging_, dir_, metadata_);
    committed_ = true;
    return metadata_;
  }

 private:
  class Stream final : public ChunkStream {
   public:
    Stream(Writer& w, std::size_t entry, std::unique_ptr<storage::ShardWriter::Stream> s)
        : w_(w), entry_(entry), s_(std::move(s)) {
      ++w_.open_streams_;
    }
    ~Stream() override {
      if (s_) --w_.open_streams_;
    }
    void Write(const void* data, std::size_t n) override { Open().Write(data, n); }
    void Copy(const FileRange& range, std::string_view expected_checksum) override {
      Open().Copy(w_.Source(range.file).get(), range.offset, static_cast<std::size_t>(range.length), range.file,
                  expected_checksum, range.file.string() + ": bytes at offset " + std::to_string(range.offset));
    }
    void Close() override {
      ChunkMeta chunk = Open().Finish();
      w_.metadata_.entries[entry_].second.chunks.push_back(std::move(chunk));
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
    std::unique_ptr<storage::ShardWriter::Stream> s_;
  };

  // Validates a tensor chunk against its entry (creating it on first use); returns the
  // entry's index.
  std::size_t CheckChunk(const std::string& key, DType dtype, const Shape& shape, const Box& box) {
    EntryMeta& e = Entry(key, EntryKind::kTensor);
    if (e.chunks.empty() && e.shape.empty() && !seen_tensor_.count(key)) {
      NumElements(shape);
      e.dtype = dtype;
      e.shape = shape;
      seen_tensor_.insert(key);
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
    return index_.at(key);
  }

  // An open descriptor of a file chunks are copied from (kept until the writer goes).
  const storage::Fd& Source(const std::filesystem::path& file) {
    auto it = sources_.find(file.string());
    if (it == sources_.end()) it = sources_.emplace(file.string(), storage::OpenRegularFile(file)).first;
    return it->second;
  }

  EntryMeta& Entry(const std::string& key, EntryKind kind) {
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
      s = std::make_unique<storage::ShardWriter>(staging_, internal::ShardFileName(index, options_.num_files),
                                                 options_.compression);
    }
    return *s;
  }

  std::filesystem::path dir_;
  Options options_;
  std::filesystem::path staging_;
  std::vector<std::unique_ptr<storage::ShardWriter>> shards_;
  Metadata metadata_;
  std::unordered_map<std::string, std::size_t> index_;
  std::unordered_set<std::string> seen_tensor_;
  std::map<std::string, storage::Fd> sources_;
  int open_streams_ = 0;
  bool committed_ = false;
};

}  // namespace

std::unique_ptr<CheckpointWriter> CheckpointWriter::Create(const std::filesystem::path& dir, const Options& options) {
  return std::make_unique<Writer>(dir, options);
}

}  // namespace ckpt
