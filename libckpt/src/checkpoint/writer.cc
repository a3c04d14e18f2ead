// checkpoint/writer.cc: CheckpointWriter, a single-process streaming writer.
//
// Memory: a chunk's bytes go straight to its shard; the writer keeps one compact record
// per chunk (box, checksum, sizes, statistics), turned into the Metadata only at Commit.
// Strings every chunk would repeat (its file name, a dataset name that follows from key
// and box) are not kept per chunk.
#include <cstdio>
#include <map>
#include <unordered_map>

#include "checkpoint/commit.h"
#include "ckpt/checkpoint.h"
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
    BuildChunks();
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
      const storage::ShardWriter::Written shard = shards_[i]->Finish();
      metadata_.files.push_back(FileMeta{shards_[i]->file_name(), static_cast<int>(i), shard.bytes, shard.index});
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
    Stream(Writer& w, std::size_t entry, int file, std::unique_ptr<storage::ShardWriter::Stream> s)
        : w_(w), entry_(entry), file_(file), s_(std::move(s)) {
      ++w_.open_streams_;
    }
    ~Stream() override {
      if (s_) --w_.open_streams_;
    }
    void Write(const void* data, std::size_t n) override { Open().Write(data, n); }
    void Copy(const FileRange& range, const ChunkMeta* expected) override {
      Open().Copy(w_.Source(range.file).get(), range.offset, static_cast<std::size_t>(range.length), range.file,
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

  // One tensor chunk as written, compactly. Its box lives in boxes_ (offsets, then sizes,
  // rank-of-the-tensor values each); a dataset name or checksum that does not follow the
  // usual form is kept whole in unusual_.
  struct ChunkRecord {
    uint32_t entry;
    uint32_t file;
    std::size_t box;
    uint64_t checksum;
    uint64_t stored_bytes;
    Compression compression;
    bool has_stats;
    ChunkStats stats;
  };
  struct Unusual {
    std::string file, dataset, checksum;
  };

  void Record(std::size_t entry, int file, ChunkMeta chunk) {
    const auto& [key, e] = metadata_.entries[entry];
    ChunkRecord r{static_cast<uint32_t>(entry), static_cast<uint32_t>(file), boxes_.size(), 0,
                  chunk.stored_bytes, chunk.compression, chunk.stats.has_value(),
                  chunk.stats.value_or(ChunkStats{})};
    boxes_.insert(boxes_.end(), chunk.box.offsets.begin(), chunk.box.offsets.end());
    boxes_.insert(boxes_.end(), chunk.box.sizes.begin(), chunk.box.sizes.end());
    Unusual odd;
    if (chunk.file != shards_[static_cast<std::size_t>(file)]->file_name()) odd.file = std::move(chunk.file);
    if (chunk.dataset != names::DatasetName(key, chunk.box.offsets, chunk.box == Box::Full(e.shape)))
      odd.dataset = std::move(chunk.dataset);
    if (!ParseChecksum(chunk.checksum, &r.checksum)) odd.checksum = std::move(chunk.checksum);
    if (!odd.file.empty() || !odd.dataset.empty() || !odd.checksum.empty()) unusual_.emplace(records_.size(), std::move(odd));
    records_.push_back(r);
  }

  static bool ParseChecksum(const std::string& text, uint64_t* value) {
    const std::string_view prefix = names::kChecksumPrefix;
    if (text.size() != prefix.size() + 16 || text.compare(0, prefix.size(), prefix) != 0) return false;
    uint64_t v = 0;
    for (std::size_t i = prefix.size(); i < text.size(); ++i) {
      const char c = text[i];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      v = (v << 4) | static_cast<uint64_t>(d);
    }
    *value = v;
    return true;
  }

  // The records become the entries' chunks, in the order they were written.
  void BuildChunks() {
    std::vector<uint32_t> count(metadata_.entries.size(), 0);
    for (const ChunkRecord& r : records_) ++count[r.entry];
    for (std::size_t i = 0; i < count.size(); ++i) metadata_.entries[i].second.chunks.reserve(count[i]);
    for (std::size_t i = 0; i < records_.size(); ++i) {
      const ChunkRecord& r = records_[i];
      auto& [key, e] = metadata_.entries[r.entry];
      const auto nd = static_cast<std::ptrdiff_t>(e.shape.size());
      const auto b = boxes_.begin() + static_cast<std::ptrdiff_t>(r.box);
      ChunkMeta c;
      c.box.offsets.assign(b, b + nd);
      c.box.sizes.assign(b + nd, b + 2 * nd);
      auto odd = unusual_.find(i);
      const bool has_odd = odd != unusual_.end();
      c.file = has_odd && !odd->second.file.empty()
                   ? std::move(odd->second.file)
                   : internal::ShardFileName(static_cast<int>(r.file), options_.num_files);
      c.compression = r.compression;
      c.stored_bytes = r.stored_bytes;
      if (r.has_stats) c.stats = r.stats;
      if (has_odd && !odd->second.dataset.empty()) {
        c.dataset = std::move(odd->second.dataset);
      } else {
        c.dataset = names::DatasetName(key, c.box.offsets, c.box == Box::Full(e.shape));
      }
      if (has_odd && !odd->second.checksum.empty()) {
        c.checksum = std::move(odd->second.checksum);
      } else {
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(r.checksum));
        c.checksum = std::string(names::kChecksumPrefix) + hex;
      }
      e.chunks.push_back(std::move(c));
    }
    std::vector<ChunkRecord>().swap(records_);
    std::vector<int64_t>().swap(boxes_);
    unusual_.clear();
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
  std::vector<bool> typed_;  // per entry: a tensor whose first chunk fixed dtype and shape
  std::vector<ChunkRecord> records_;
  std::vector<int64_t> boxes_;
  std::map<std::size_t, Unusual> unusual_;  // by record
  std::map<std::string, storage::Fd> sources_;
  int open_streams_ = 0;
  bool committed_ = false;
};

}  // namespace

std::unique_ptr<CheckpointWriter> CheckpointWriter::Create(const std::filesystem::path& dir, const Options& options) {
  return std::make_unique<Writer>(dir, options);
}

}  // namespace ckpt
