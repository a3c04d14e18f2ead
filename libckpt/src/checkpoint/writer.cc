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
    e.chunks.push_back(Shard(file_index).WriteChunk(key, dtype, shape, box, data));
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
  bool committed_ = false;
};

}  // namespace

std::unique_ptr<CheckpointWriter> CheckpointWriter::Create(const std::filesystem::path& dir, const Options& options) {
  return std::make_unique<Writer>(dir, options);
}

}  // namespace ckpt
