// storage/shard_writer.cc
#include "storage/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

#include "format/names.h"
#include "storage/digest.h"
#include "storage/file_hasher.h"
#include "storage/fs.h"
#include "storage/h5.h"
#include "storage/shard_index.h"

namespace ckpt::storage {
namespace {

constexpr std::size_t kStreamBlock = std::size_t{8} << 20;      // pwrite + digest block
constexpr uint64_t kWritebackBytes = uint64_t{64} << 20;          // start writeback this often
constexpr std::size_t kCompressChunkBytes = std::size_t{1} << 20;  // HDF5 chunk target

std::vector<hsize_t> Dims(const Shape& s) { return std::vector<hsize_t>(s.begin(), s.end()); }

// HDF5 chunk dims of about kCompressChunkBytes: whole trailing dims, a slab of dim 0
// (or of later dims if one row is larger than the target).
std::vector<hsize_t> CompressChunkDims(const Shape& sizes, std::size_t itemsize) {
  std::vector<hsize_t> chunk = Dims(sizes);
  int64_t target = static_cast<int64_t>(kCompressChunkBytes / itemsize);
  for (std::size_t d = 0; d < chunk.size(); ++d) {
    int64_t inner = 1;
    for (std::size_t e = d + 1; e < chunk.size(); ++e) inner *= static_cast<int64_t>(chunk[e]);
    if (inner <= target) {
      chunk[d] = static_cast<hsize_t>(std::clamp<int64_t>(target / std::max<int64_t>(inner, 1), 1, sizes[d]));
      break;
    }
    chunk[d] = 1;
  }
  return chunk;
}

}  // namespace

// Copies queued file ranges into a shard on one background thread, in order, so the
// caller hashes the next blocks (and prepares the next chunks) meanwhile. At most
// kCopyQueue blocks wait; a failure is rethrown by the next Push or by Drain.
class Copier {
 public:
  struct Task {
    int in_fd;
    uint64_t in_offset, out_offset;
    std::size_t len;
    std::filesystem::path in_path;
  };
  // `done(n)` is called on the copier thread after each block.
  Copier(int out_fd, std::filesystem::path out_path, std::function<void(std::size_t)> done)
      : out_fd_(out_fd), out_path_(std::move(out_path)), done_(std::move(done)) {}
  ~Copier() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void Push(Task task) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    cv_.wait(lock, [&] { return queue_.size() < kCopyQueue || error_; });
    if (error_) std::rethrow_exception(error_);
    queue_.push_back(std::move(task));
    cv_.notify_all();
  }

  void Drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return (queue_.empty() && !busy_) || error_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static constexpr std::size_t kCopyQueue = 4;

  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return !queue_.empty() || stop_; });
      if (queue_.empty()) return;  // stopping
      Task t = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr failed;
      try {
        CopyRange(t.in_fd, t.in_offset, out_fd_, t.out_offset, t.len, t.in_path, out_path_);
        done_(t.len);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      if (failed && !error_) error_ = failed;
      if (error_) queue_.clear();
      cv_.notify_all();
    }
  }

  const int out_fd_;
  const std::filesystem::path out_path_;
  const std::function<void(std::size_t)> done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::exception_ptr error_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // started by the first Push
};

struct ShardWriter::Impl {
  std::filesystem::path path;
  Compression compression;
  uint64_t block_bytes = kDefaultBlockBytes;
  h5::Handle file;
  Fd fd;
  ShardIndexBuilder index;
  // Contiguous, space allocated at creation (so its file offset is known), never filled.
  h5::Handle contiguous_dcpl = [] {
    h5::Init();
    h5::Handle p = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
    h5::Check(H5Pset_layout(p.get(), H5D_CONTIGUOUS), "H5Pset_layout");
    h5::Check(H5Pset_alloc_time(p.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time");
    h5::Check(H5Pset_fill_time(p.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
    return p;
  }();
  std::unordered_set<std::string> datasets;
  std::atomic<uint64_t> unflushed{0};  // bytes written since writeback was last started
  std::unique_ptr<Copier> copier;      // declared after fd: stopped before it closes

  // Called after data is written (by this thread or the copier): every kWritebackBytes,
  // starts writeback of the file so the disk works while the rest is produced and the
  // final fsync has little left.
  void Wrote(std::size_t n) {
    if (unflushed.fetch_add(n) + n < kWritebackBytes) return;
    unflushed = 0;
    StartWriteback(fd.get(), 0, 0);
  }

  Copier& Copies() {
    if (!copier) copier = std::make_unique<Copier>(fd.get(), path, [this](std::size_t n) { Wrote(n); });
    return *copier;
  }

  // Fills in the chunk's digests (v2: blocked) and data offset, and adds its index record.
  void RecordChunk(const std::string& key, bool bytes, DType dtype, const Shape& shape, ChunkMeta& meta,
                   const Digest& digest, uint64_t data_offset) {
    meta.checksum = digest.Checksum();
    meta.block_bytes = digest.block_bytes();
    meta.blocks = digest.Blocks();
    if (data_offset) meta.offset = data_offset;
    ShardIndexEntry e;
    e.key = key;
    e.bytes = bytes;
    e.dtype = dtype;
    e.shape = shape;
    e.chunk = meta;
    e.chunk.file.clear();  // the record is inside its file
    index.Add(e);
  }

  uint64_t DataOffset(hid_t ds, const std::string& key) const {
    const haddr_t offset = H5Dget_offset(ds);
    if (offset == HADDR_UNDEF) {
      throw Error(ErrorCode::kIO, path.string() + ": key '" + key + "': dataset has no file address" +
                                      h5::ErrorStack());
    }
    return offset;
  }

  h5::Handle CreateDataset(const std::string& name, DType dtype, const Shape& sizes, bool compress,
                           const std::string& key) {
    if (!datasets.insert(name).second) {
      throw Error(ErrorCode::kInvalidArgument,
                  path.filename().string() + ": key '" + key + "' writes dataset '" + name + "' twice");
    }
    const hid_t type = h5::SharedFileType(dtype);
    h5::Handle space = h5::MakeSpace(Dims(sizes));
    h5::Handle chunked_dcpl;
    hid_t dcpl = contiguous_dcpl.get();
    if (compress) {
      chunked_dcpl = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
      dcpl = chunked_dcpl.get();
      const auto chunk = CompressChunkDims(sizes, DTypeSize(dtype));
      h5::Check(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
      h5::Check(H5Pset_shuffle(dcpl), "H5Pset_shuffle");
      const unsigned level = static_cast<unsigned>(compression.level);
      h5::Check(H5Pset_filter(dcpl, names::kZstdFilterId, H5Z_FLAG_MANDATORY, 1, &level),
                "H5Pset_filter(zstd)");
      h5::Check(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
    }
    h5::Handle ds = h5::Dataset(h5::Check(
        H5Dcreate2(file.get(), name.c_str(), type, space.get(), H5P_DEFAULT, dcpl, H5P_DEFAULT),
        path.filename().string() + ": key '" + key + "': creating dataset '" + name + "'"));
    if (h5::NeedsDTypeAttr(dtype)) h5::WriteStringAttr(ds.get(), names::kDTypeAttr, std::string(DTypeName(dtype)));
    return ds;
  }

  // Digests a block in pieces that fit in L2, so the statistics read what the hash has just
  // brought into the cache instead of memory again (about 1.4x the throughput of one call).
  static void DigestInPieces(Digest& digest, const unsigned char* p, std::size_t n) {
    constexpr std::size_t kPiece = std::size_t{256} << 10;
    for (std::size_t pos = 0; pos < n; pos += kPiece) digest.Update(p + pos, std::min(kPiece, n - pos));
  }

  // Streams `n` bytes of `data` into the contiguous dataset `ds`, digesting each block.
  // Returns the data's offset in the file (0 when there is no data).
  uint64_t StreamContiguous(hid_t ds, const void* data, std::size_t n, Digest& digest, const std::string& key) {
    if (n == 0) return 0;
    const uint64_t offset = DataOffset(ds, key);
    const auto* p = static_cast<const unsigned char*>(data);
    if (n <= kStreamBlock) {  // one block: no pipeline (a thread per small chunk costs more)
      DigestInPieces(digest, p, n);
      WriteExact(fd.get(), p, n, offset, path);
      Wrote(n);
      return offset;
    }
    // Two-stage pipeline: block i is written on a helper thread while block i+1 is
    // digested here, so hashing costs no time when a core is free.
    std::future<void> writing;
    for (std::size_t pos = 0; pos < n; pos += kStreamBlock) {
      const std::size_t len = std::min(kStreamBlock, n - pos);
      DigestInPieces(digest, p + pos, len);
      if (writing.valid()) {
        writing.get();
        Wrote(kStreamBlock);
      }
      writing = std::async(std::launch::async, [this, p, pos, len, offset] {
        WriteExact(fd.get(), p + pos, len, offset + pos, path);
      });
    }
    if (writing.valid()) writing.get();
    Wrote((n - 1) % kStreamBlock + 1);  // the last block
    return offset;
  }
};

ShardWriter::ShardWriter(const std::filesystem::path& dir, std::string file_name, Compression compression,
                         uint64_t block_bytes)
    : impl_(std::make_unique<Impl>()), file_name_(std::move(file_name)) {
  if (block_bytes < kMinBlockBytes || block_bytes > kMaxBlockBytes || (block_bytes & (block_bytes - 1))) {
    throw Error(ErrorCode::kInvalidArgument, file_name_ + ": block size " + std::to_string(block_bytes) +
                                                 " is not a power of two in [4096, 67108864]");
  }
  impl_->block_bytes = block_bytes;
  h5::Init();
  impl_->path = dir / file_name_;
  impl_->compression = compression;
  h5::Handle fapl = h5::Plist(H5Pcreate(H5P_FILE_ACCESS));
  // 1.8 object formats: compact/dense link storage, so a root group with many thousands
  // of datasets stays fast, and large attributes (the shard index) are allowed.
  h5::Check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18), "H5Pset_libver_bounds");
  impl_->file = h5::File(h5::Check(H5Fcreate(impl_->path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                                   impl_->path.string() + ": creating HDF5 file"));
  impl_->fd = OpenFile(impl_->path, O_WRONLY);
}

ShardWriter::~ShardWriter() = default;

ChunkMeta ShardWriter::WriteChunk(const std::string& key, DType dtype, const Shape& shape, const Box& box,
                                  const void* data) {
  const int64_t elements = box.NumElements();
  const std::size_t nbytes = static_cast<std::size_t>(elements) * DTypeSize(dtype);
  if (nbytes > 0 && data == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, "key '" + key + "' chunk " + box.ToString() + ": null data");
  }
  const bool whole = box == Box::Full(shape);
  const bool compress = impl_->compression.codec == Compression::Codec::kZstd && !box.sizes.empty() &&
                        elements > 0;
  ChunkMeta meta;
  meta.box = box;
  meta.file = file_name_;
  meta.dataset = h5::DatasetName(key, box.offsets, whole);
  h5::Handle ds = impl_->CreateDataset(meta.dataset, dtype, box.sizes, compress, key);
  Digest digest(dtype, /*with_stats=*/true, impl_->block_bytes);
  uint64_t data_offset = 0;
  if (compress) {
    digest.Update(data, nbytes);
    h5::Check(H5Dwrite(ds.get(), h5::SharedFileType(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
              impl_->path.string() + ": key '" + key + "': writing compressed dataset");
    meta.compression = impl_->compression;
    meta.stored_bytes = H5Dget_storage_size(ds.get());
  } else {
    data_offset = impl_->StreamContiguous(ds.get(), data, nbytes, digest, key);
    meta.stored_bytes = nbytes;
  }
  meta.stats = digest.Stats();
  impl_->RecordChunk(key, false, dtype, shape, meta, digest, data_offset);
  return meta;
}

struct ShardWriter::Stream::State {
  Impl* shard = nullptr;
  std::string key;
  DType dtype = DType::kUInt8;
  Shape shape;
  ChunkMeta meta;
  h5::Handle ds;
  uint64_t offset = 0;  // of the data in the file
  uint64_t total = 0, pos = 0;
  std::unique_ptr<Digest> digest;

  void Reserve(std::size_t n) {
    if (n > total - pos) {
      throw Error(ErrorCode::kInvalidArgument, shard->path.filename().string() + ": key '" + key + "' chunk " +
                                                   meta.box.ToString() + ": more than its " +
                                                   std::to_string(total) + " bytes given");
    }
  }
};

ShardWriter::Stream::Stream(std::unique_ptr<State> state) : state_(std::move(state)) {}
ShardWriter::Stream::~Stream() = default;

std::unique_ptr<ShardWriter::Stream> ShardWriter::Begin(const std::string& key, DType dtype, const Shape& shape,
                                                        const Box& box, const std::optional<ChunkStats>& stats) {
  auto st = std::make_unique<Stream::State>();
  st->shard = impl_.get();
  st->key = key;
  st->dtype = dtype;
  st->shape = shape;
  st->meta.box = box;
  st->meta.file = file_name_;
  st->meta.dataset = h5::DatasetName(key, box.offsets, box == Box::Full(shape));
  st->total = static_cast<uint64_t>(box.NumElements()) * DTypeSize(dtype);
  st->meta.stored_bytes = st->total;
  st->ds = impl_->CreateDataset(st->meta.dataset, dtype, box.sizes, /*compress=*/false, key);
  if (st->total > 0) st->offset = impl_->DataOffset(st->ds.get(), key);
  st->digest = std::make_unique<Digest>(dtype, /*with_stats=*/!stats, impl_->block_bytes);
  st->meta.stats = stats;
  return std::unique_ptr<Stream>(new Stream(std::move(st)));
}

void ShardWriter::Stream::Write(const void* data, std::size_t n) {
  State& s = *state_;
  s.Reserve(n);
  if (n == 0) return;
  s.digest->Update(data, n);
  WriteExact(s.shard->fd.get(), data, n, s.offset + s.pos, s.shard->path);
  s.pos += n;
  s.shard->Wrote(n);
}

void ShardWriter::Stream::Copy(int fd, uint64_t offset, std::size_t n, const std::filesystem::path& path,
                               const ChunkMeta* expected, std::string_view what) {
  State& s = *state_;
  s.Reserve(n);
  // The range's own digest, when it is a whole stored chunk: v1 over its bytes, v2 in the
  // blocks that chunk was written with.
  std::optional<Digest> own;
  if (expected) own.emplace(DType::kUInt8, false, expected->block_bytes);
  // Each piece is hashed here as the FileHasher hands it over (a large range from the
  // page cache's own pages, a small one through a cache-sized buffer), then copied inside
  // the kernel by the shard's copier thread while the next piece is hashed. The copies
  // complete by ShardWriter::Finish.
  Copier& copier = s.shard->Copies();
  FileHasher source(fd, path);
  source.Scan(offset, n, [&](const unsigned char* p, std::size_t len, uint64_t done) {
    s.digest->Update(p, len);
    if (own) own->Update(p, len);
    copier.Push({fd, offset + done, s.offset + s.pos + done, len, path});
  });
  s.pos += n;
  if (own) CheckDigest(*own, *expected, n, what);
}

ChunkMeta ShardWriter::Stream::Finish() {
  State& s = *state_;
  if (s.pos != s.total) {
    throw Error(ErrorCode::kInvalidArgument, s.shard->path.filename().string() + ": key '" + s.key + "' chunk " +
                                                 s.meta.box.ToString() + ": " + std::to_string(s.pos) + " of its " +
                                                 std::to_string(s.total) + " bytes given");
  }
  if (!s.meta.stats) s.meta.stats = s.digest->Stats();
  s.shard->RecordChunk(s.key, false, s.dtype, s.shape, s.meta, *s.digest, s.total ? s.offset : 0);
  return std::move(s.meta);
}

ChunkMeta ShardWriter::WriteBytes(const std::string& key, const void* data, std::size_t n) {
  ChunkMeta meta;
  meta.box = Box{{0}, {static_cast<int64_t>(n)}};
  meta.file = file_name_;
  meta.dataset = h5::EscapeKey(key);
  h5::Handle ds = impl_->CreateDataset(meta.dataset, DType::kUInt8, meta.box.sizes, false, key);
  Digest digest(DType::kUInt8, false, impl_->block_bytes);
  const uint64_t data_offset = impl_->StreamContiguous(ds.get(), data, n, digest, key);
  meta.stored_bytes = n;
  impl_->RecordChunk(key, true, DType::kUInt8, {static_cast<int64_t>(n)}, meta, digest, data_offset);
  return meta;
}

ShardWriter::Written ShardWriter::Finish() {
  if (impl_->copier) impl_->copier->Drain();
  Written out;
  const std::string index = impl_->index.Finish();
  out.index = IndexDigest(index);
  h5::WriteStringAttr(impl_->file.get(), names::kShardIndexAttr, index);
  if (impl_->file.Close() < 0) {
    throw Error(ErrorCode::kIO, impl_->path.string() + ": closing HDF5 file" + h5::ErrorStack());
  }
  const auto fsync_start = std::chrono::steady_clock::now();
  FsyncFd(impl_->fd.get(), impl_->path);
  out.fsync_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - fsync_start).count();
  out.bytes = FileSize(impl_->fd.get(), impl_->path);
  impl_->fd.Close(impl_->path);
  return out;
}

}  // namespace ckpt::storage
