// storage/shard_writer.cc
#include "storage/shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>

#include "format/names.h"
#include "storage/digest.h"
#include "storage/file_hasher.h"
#include "storage/fs.h"
#include "storage/h5.h"
#include "storage/shard_index.h"

namespace ckpt::storage {
namespace {

constexpr uint64_t kWritebackBytes = uint64_t{64} << 20;          // start writeback this often
constexpr std::size_t kDigestPiece = std::size_t{256} << 10;       // digested at a time, in cache
constexpr std::size_t kCompressChunkBytes = std::size_t{1} << 20;  // HDF5 chunk target
constexpr std::size_t kMetadataCacheBytes = std::size_t{1} << 20;  // HDF5's metadata cache, per shard
// Where HDF5 places a dataset of at least kAlignFrom bytes: at a multiple of kAlignTo, so
// its data starts on a page and no piece written to it shares a page with another write
// (the page cache can hold it in whole pages and large folios). Unaligned, HDF5 put data at
// odd KiB offsets, and gpt2s's save took a median 0.78 s against 0.62 s aligned (ext4, 12
// interleaved rounds; its load 0.75 s against 0.65 s). The space it costs is under kAlignTo
// per such dataset.
constexpr hsize_t kAlignFrom = hsize_t{1} << 20, kAlignTo = hsize_t{64} << 10;

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
  // `done(out_offset, n)` is called on the copier thread after each block.
  Copier(int out_fd, std::filesystem::path out_path, std::function<void(uint64_t, std::size_t)> done)
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
    if (!thread_.joinable() && !inline_) {
      try {
        thread_ = std::thread([this] { Run(); });
      } catch (const std::system_error&) {
        inline_ = true;  // the system starts no thread: every copy on the caller's thread
      }
    }
    if (inline_) {
      lock.unlock();
      CopyRange(task.in_fd, task.in_offset, out_fd_, task.out_offset, task.len, task.in_path, out_path_);
      done_(task.out_offset, task.len);
      return;
    }
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
        done_(t.out_offset, t.len);
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
  const std::function<void(uint64_t, std::size_t)> done_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  std::exception_ptr error_;
  bool busy_ = false, stop_ = false, inline_ = false;
  std::thread thread_;  // started by the first Push
};

struct ShardWriter::Impl {
  std::filesystem::path path;
  Compression compression;
  uint64_t block_bytes = kDefaultBlockBytes;
  h5::Handle file;
  Fd fd;
  ShardIndexBuilder index;
  // Contiguous, space allocated at creation (so its file offset is known), never filled;
  // no modification time in the object header (a message and a clock read per dataset).
  h5::Handle contiguous_dcpl = [] {
    h5::Init();
    h5::Handle p = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
    h5::Check(H5Pset_obj_track_times(p.get(), 0), "H5Pset_obj_track_times");
    h5::Check(H5Pset_layout(p.get(), H5D_CONTIGUOUS), "H5Pset_layout");
    h5::Check(H5Pset_alloc_time(p.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time");
    h5::Check(H5Pset_fill_time(p.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
    return p;
  }();
  std::atomic<uint64_t> unflushed{0};  // bytes written since writeback was last started
  std::unique_ptr<Copier> copier;      // declared after fd: stopped before it closes

  // Called after data is written (by this thread, the pool or the copier): every kWritebackBytes,
  // starts writeback of the file so the disk works while the rest is produced and the
  // final fsync has little left. `offset` is where this writer itself wrote the `n` bytes
  // with pwrite, into a dataset's space that nothing writes again: they are final, and the
  // observer (ShardWriter::OnFinalBytes) hears of them. kNotFinal: HDF5 wrote them (it
  // may hold them in its sieve buffer until the dataset closes), not reported.
  static constexpr uint64_t kNotFinal = ~uint64_t{0};
  bool transient = false;  // ShardWriter::SetTransient: no writeback, no fsync
  FinalBytes on_final;     // ShardWriter::OnFinalBytes

  void Wrote(uint64_t offset, std::size_t n) {
    if (on_final && offset != kNotFinal && n > 0) on_final(offset, n);
    if (transient || unflushed.fetch_add(n) + n < kWritebackBytes) return;
    unflushed = 0;
    StartWriteback(fd.get(), 0, 0);
  }

  // The hasher of each file chunks are copied from (by descriptor and name), kept from one
  // copy to the next: it knows how far it has asked the kernel to read ahead, so a merge
  // that copies a file's chunks in order asks once per window, not once per chunk (each
  // ask walks the page cache over the whole read-ahead window).
  std::map<std::pair<int, std::string>, std::unique_ptr<FileHasher>> sources;

  FileHasher& Source(int in_fd, const std::filesystem::path& in_path) {
    auto& hasher = sources[{in_fd, in_path.string()}];
    if (!hasher) hasher = std::make_unique<FileHasher>(in_fd, in_path);
    return *hasher;
  }

  Copier& Copies() {
    if (!copier) copier = std::make_unique<Copier>(fd.get(), path, [this](uint64_t at, std::size_t n) { Wrote(at, n); });
    return *copier;
  }

  // Fills in the chunk's digests (v2: blocked).
  static void Digested(ChunkMeta& meta, const Digest& digest) {
    meta.checksum = digest.Checksum();
    meta.block_bytes = digest.block_bytes();
    meta.blocks = digest.Blocks();
  }

  // Fills in the chunk's digests and data offset, and adds its index record.
  void RecordChunk(const std::string& key, bool bytes, DType dtype, const Shape& shape, ChunkMeta& meta,
                   const Digest& digest, uint64_t data_offset) {
    Digested(meta, digest);
    if (data_offset) meta.offset = data_offset;
    index.Add(key, bytes, dtype, shape, meta);  // its `file` not written: the record is inside it
  }

  uint64_t DataOffset(hid_t ds, const std::string& key) const {
    const haddr_t offset = H5Dget_offset(ds);
    if (offset == HADDR_UNDEF) {
      throw Error(ErrorCode::kIO, path.string() + ": key '" + key + "': dataset has no file address" +
                                      h5::ErrorStack());
    }
    return offset;
  }

  // `dcpl_default`: the library's default creation properties (contiguous, space allocated
  // by the first write), for a dataset whose data HDF5 writes itself: HDF5 copies any other
  // property list into every dataset it makes, a large part of a small dataset's cost.
  h5::Handle CreateDataset(const std::string& name, DType dtype, const Shape& sizes, bool compress,
                           const std::string& key, bool dcpl_default = false) {
    const hid_t type = h5::SharedFileType(dtype);
    h5::Handle space = h5::MakeSpace(Dims(sizes));
    h5::Handle chunked_dcpl;
    hid_t dcpl = dcpl_default ? H5P_DEFAULT : contiguous_dcpl.get();
    if (compress) {
      chunked_dcpl = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
      dcpl = chunked_dcpl.get();
      h5::Check(H5Pset_obj_track_times(dcpl, 0), "H5Pset_obj_track_times");
      const auto chunk = CompressChunkDims(sizes, DTypeSize(dtype));
      h5::Check(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
      h5::Check(H5Pset_shuffle(dcpl), "H5Pset_shuffle");
      const unsigned level = static_cast<unsigned>(compression.level);
      h5::Check(H5Pset_filter(dcpl, names::kZstdFilterId, H5Z_FLAG_MANDATORY, 1, &level),
                "H5Pset_filter(zstd)");
      h5::Check(H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
    }
    // HDF5 refuses a name that is taken; only then is the name looked up, to say why. (A set
    // of the names made, kept to say it, held 65-85 B a chunk: most of a CheckpointWriter's
    // memory per chunk.)
    const hid_t id = H5Dcreate2(file.get(), name.c_str(), type, space.get(), H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (id < 0) {
      const std::string stack = h5::ErrorStack();  // before H5Lexists replaces it
      const std::string where = path.filename().string() + ": key '" + key + "'";
      if (H5Lexists(file.get(), name.c_str(), H5P_DEFAULT) > 0)
        throw Error(ErrorCode::kInvalidArgument, where + " writes dataset '" + name + "' twice");
      throw Error(ErrorCode::kIO, where + ": creating dataset '" + name + "'" + stack);
    }
    h5::Handle ds = h5::Dataset(id);
    if (h5::NeedsDTypeAttr(dtype)) h5::WriteStringAttr(ds.get(), names::kDTypeAttr, std::string(DTypeName(dtype)));
    return ds;
  }

  // Reserved chunks (ShardWriter::Reserve): their datasets are made kBatch at a time, with
  // the process's HDF5 batch lock held (h5::BatchMutex), by the WriteChunk that first needs
  // one; made ones wait in `made` with their data offsets.
  // A reserved chunk of at most kHdf5Writes bytes whose data was given is written by
  // HDF5 as its dataset is made (H5Dwrite, so its dataset can take the default creation
  // properties, which HDF5 does not copy), and only digested by WriteChunk; larger ones are
  // streamed by WriteChunk (StreamContiguous), outside every lock.
  static constexpr std::size_t kBatch = 256;
  static constexpr uint64_t kHdf5Writes = uint64_t{64} << 10;
  // A reserved chunk of at most `pack_threshold` bytes whose data was given is packed
  // (FORMAT.md §5.7): a run of such chunks, in the order reserved, shares one contiguous
  // uint8 dataset of at most kPackBytes (a chunk larger than that alone), its members back
  // to back with no padding. WriteChunk digests each member and copies it into `pack`, the
  // pack's bytes in memory, which is written in one piece once its last member is in.
  static constexpr uint64_t kPackBytes = uint64_t{1} << 20;
  uint64_t pack_threshold = 0;  // 0: no packing
  uint64_t packs_made = 0;
  struct PackBuffer {
    std::vector<unsigned char> bytes;
    uint64_t base = 0;    // file offset of the pack's data
    uint64_t filled = 0;  // member bytes copied in so far
  } pack;
  struct Announced {
    std::string key, dataset;
    DType dtype;
    Shape sizes;
    uint64_t bytes;
    const void* data;  // nullptr: not given
  };
  struct Made {
    std::string dataset;
    DType dtype;
    Shape sizes;
    uint64_t offset;  // 0: no data
    const void* written;  // the data HDF5 wrote (or, packed, the data reserved), or nullptr
    std::string pack;     // packed: the pack's dataset name, else empty
    uint64_t pack_offset = 0, pack_base = 0, pack_size = 0;
  };
  struct Taken {
    uint64_t offset;
    bool written;
    const Made* packed;  // the packed member's place, valid until the next TakeReserved
  };
  Made taken_pack;  // the last packed member taken

  // Small chunks written without being reserved (a CheckpointWriter's, a device chunk's)
  // are packed too: their bytes wait here, copied, until the pack is full (kPackBytes) or
  // the shard is finished; then the pack is made and written whole and their records,
  // whose offsets are known only then, are added.
  struct Deferred {
    std::string pack;  // its name, chosen with its first member
    std::vector<unsigned char> bytes;
    struct Member {
      std::string key;
      DType dtype;
      Shape shape;
      ChunkMeta meta;
    };
    std::vector<Member> members;
  } deferred;

  bool Deferrable(std::size_t n, const void* data) const {
    return pack_threshold > 0 && data && n > 0 && n <= pack_threshold;
  }

  // Packs `n` bytes at `data` of a digested chunk (meta: its box, digests and stats); fills
  // in its pack and place in it.
  void Defer(const std::string& key, DType dtype, const Shape& shape, ChunkMeta& meta, const void* data,
             std::size_t n) {
    if (!deferred.members.empty() && deferred.bytes.size() + n > kPackBytes) FlushDeferred();
    if (deferred.members.empty()) deferred.pack = names::kPackPrefix + std::to_string(packs_made++);
    meta.dataset = deferred.pack;
    meta.pack_offset = deferred.bytes.size();
    meta.stored_bytes = n;
    const auto* p = static_cast<const unsigned char*>(data);
    deferred.bytes.insert(deferred.bytes.end(), p, p + n);
    deferred.members.push_back({key, dtype, shape, meta});
    deferred.members.back().meta.file.clear();
  }

  void FlushDeferred() {
    if (deferred.members.empty()) return;
    const std::string& first = deferred.members.front().key;
    h5::Handle ds = CreateDataset(deferred.pack, DType::kUInt8, {static_cast<int64_t>(deferred.bytes.size())},
                                  /*compress=*/false, first);
    const uint64_t base = DataOffset(ds.get(), first);
    WriteExact(fd.get(), deferred.bytes.data(), deferred.bytes.size(), base, path);
    Wrote(base, deferred.bytes.size());
    for (auto& m : deferred.members) {
      m.meta.offset = base + *m.meta.pack_offset;
      index.Add(m.key, false, m.dtype, m.shape, m.meta);
    }
    deferred.members.clear();
    deferred.bytes.clear();
  }

  bool Packable(const Announced& a) const {
    return pack_threshold > 0 && a.data && a.bytes > 0 && a.bytes <= pack_threshold;
  }

  // Makes the pack dataset for the run of packable chunks at the front of `announced`
  // (as many as fit in kPackBytes, at least one) and queues them in `made`.
  void MakePack() {
    uint64_t total = 0;
    std::size_t n = 0;
    while (n < announced.size() && Packable(announced[n]) &&
           (n == 0 || total + announced[n].bytes <= kPackBytes)) {
      total += announced[n].bytes;
      ++n;
    }
    const std::string name = names::kPackPrefix + std::to_string(packs_made);
    h5::Handle ds = CreateDataset(name, DType::kUInt8, {static_cast<int64_t>(total)}, /*compress=*/false,
                                  announced.front().key);
    ++packs_made;
    const uint64_t base = DataOffset(ds.get(), announced.front().key);
    uint64_t pos = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Announced& a = announced.front();
      made.push_back({a.dataset, a.dtype, a.sizes, base + pos, a.data, name, pos, base, total});
      pos += a.bytes;
      announced.pop_front();
    }
  }

  // Digests packed member `m` (`n` bytes at `data`) into `digest` and copies it into the
  // pack, which is written once its last member is in.
  void WritePacked(const Made& m, const void* data, std::size_t n, Digest& digest) {
    if (pack.filled == 0) pack.bytes.resize(static_cast<std::size_t>(m.pack_size));
    if (m.pack_base != pack.base && pack.filled != 0) {
      throw Error(ErrorCode::kInternal, path.filename().string() + ": pack '" + m.pack + "' begun before the last one was full");
    }
    pack.base = m.pack_base;
    digest.Update(data, n);
    std::memcpy(pack.bytes.data() + m.pack_offset, data, n);
    pack.filled += n;
    if (pack.filled < m.pack_size) return;
    WriteExact(fd.get(), pack.bytes.data(), pack.bytes.size(), pack.base, path);
    Wrote(pack.base, pack.bytes.size());
    pack.filled = 0;
  }
  std::deque<Announced> announced;
  std::deque<Made> made;

  // The data offset of reserved dataset `name`, made now (with the next ones) if it is not
  // yet. kInternal if the chunks come in another order than they were reserved in, or
  // differ from what was reserved.
  Taken TakeReserved(const std::string& name, DType dtype, const Shape& sizes, const void* data) {
    if (made.empty()) {
      if (announced.empty() || announced.front().dataset != name) {
        throw Error(ErrorCode::kInternal, path.filename().string() + ": dataset '" + name +
                                              "' written out of the order its chunks were reserved in");
      }
      std::lock_guard<std::mutex> batch(h5::BatchMutex());
      while (!announced.empty() && made.size() < kBatch) {
        const Announced& a = announced.front();
        try {
          if (Packable(a)) {
            MakePack();
            continue;
          }
          const bool hdf5_writes = a.data && a.bytes > 0 && a.bytes <= kHdf5Writes;
          h5::Handle ds = CreateDataset(a.dataset, a.dtype, a.sizes, /*compress=*/false, a.key, hdf5_writes);
          if (hdf5_writes) {
            h5::Check(H5Dwrite(ds.get(), h5::SharedFileType(a.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, a.data),
                      path.string() + ": key '" + a.key + "': writing dataset '" + a.dataset + "'");
          }
          made.push_back({a.dataset, a.dtype, a.sizes, a.bytes ? DataOffset(ds.get(), a.key) : 0,
                          hdf5_writes ? a.data : nullptr, {}, 0, 0, 0});
        } catch (...) {
          // The chunk asked for fails here and now; a later one when its turn comes (made again).
          if (made.empty()) throw;
          break;
        }
        announced.pop_front();
      }
    }
    const Made& m = made.front();
    if (m.dataset != name || m.dtype != dtype || m.sizes != sizes || (m.written && m.written != data)) {
      throw Error(ErrorCode::kInternal, path.filename().string() + ": dataset '" + name +
                                            "' written out of the order its chunks were reserved in, or not "
                                            "as reserved");
    }
    Taken taken{m.offset, m.written != nullptr, nullptr};
    if (!m.pack.empty()) {
      taken_pack = std::move(made.front());
      taken.packed = &taken_pack;
    }
    made.pop_front();
    return taken;
  }

  // Streams `n` bytes of `data` to its contiguous dataset's place, `offset` in the file,
  // and digests them: a large chunk's pieces are written in order by one task of the worker
  // pool while the others hash it and sum its statistics in segments (Digest::UpdateParallel;
  // one thread writes the file). Returns `offset` (0 when there is no data).
  uint64_t StreamContiguous(uint64_t offset, const void* data, std::size_t n, Digest& digest) {
    if (n == 0) return 0;
    digest.UpdateParallel(data, n, [this, offset](const unsigned char* p, std::size_t len, std::size_t pos) {
      WriteExact(fd.get(), p, len, offset + pos, path);
      Wrote(offset + pos, len);
    });
    return offset;
  }
};

ShardWriter::ShardWriter(const std::filesystem::path& dir, std::string file_name, Compression compression,
                         uint64_t block_bytes, uint64_t pack_threshold)
    : impl_(std::make_unique<Impl>()), file_name_(std::move(file_name)) {
  impl_->pack_threshold = std::min(pack_threshold, Impl::kPackBytes);  // a pack's bound: no chunk above it is packed
  if (block_bytes < kMinBlockBytes || block_bytes > kMaxBlockBytes || (block_bytes & (block_bytes - 1))) {
    throw Error(ErrorCode::kInvalidArgument, file_name_ + ": block size " + std::to_string(block_bytes) +
                                                 " is not a power of two in [4096, 67108864]");
  }
  impl_->block_bytes = block_bytes;
  h5::Init();
  impl_->path = dir / file_name_;
  impl_->compression = compression;
  impl_->index = ShardIndexBuilder(dir);
  h5::Handle fapl = h5::Plist(H5Pcreate(H5P_FILE_ACCESS));
  // 1.8 object formats: compact/dense link storage, so a root group with many thousands
  // of datasets stays fast, and large attributes (the shard index) are allowed.
  h5::Check(H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V18), "H5Pset_libver_bounds");
  // HDF5's metadata cache grows (adaptively, to 32 MiB by default) with the object headers
  // and link-index nodes of datasets just created, which this writer never reads back: a
  // small fixed size keeps a writer of many chunks, with many shards open, small.
  h5::SetFixedMetadataCache(fapl.get(), kMetadataCacheBytes);
  h5::Check(H5Pset_alignment(fapl.get(), kAlignFrom, kAlignTo), "H5Pset_alignment");
  impl_->file = h5::File(h5::Check(H5Fcreate(impl_->path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()),
                                   impl_->path.string() + ": creating HDF5 file"));
  impl_->fd = OpenFile(impl_->path, O_WRONLY);
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::SetTransient() { impl_->transient = true; }

void ShardWriter::OnFinalBytes(FinalBytes observer) { impl_->on_final = std::move(observer); }

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
  Digest digest(dtype, /*with_stats=*/true, impl_->block_bytes);
  uint64_t data_offset = 0;
  if (!compress && (!impl_->made.empty() || !impl_->announced.empty())) {
    const Impl::Taken taken = impl_->TakeReserved(meta.dataset, dtype, box.sizes, data);
    if (taken.packed) {
      impl_->WritePacked(*taken.packed, data, nbytes, digest);
      meta.dataset = taken.packed->pack;
      meta.pack_offset = taken.packed->pack_offset;
      data_offset = taken.offset;
    } else if (taken.written) {
      digest.Update(data, nbytes);
      data_offset = taken.offset;
      impl_->Wrote(Impl::kNotFinal, nbytes);
    } else {
      data_offset = impl_->StreamContiguous(taken.offset, data, nbytes, digest);
    }
    meta.stored_bytes = nbytes;
  } else if (compress) {
    h5::Handle ds = impl_->CreateDataset(meta.dataset, dtype, box.sizes, compress, key);
    digest.UpdateParallel(data, nbytes);
    h5::Check(H5Dwrite(ds.get(), h5::SharedFileType(dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, data),
              impl_->path.string() + ": key '" + key + "': writing compressed dataset");
    meta.compression = impl_->compression;
    meta.stored_bytes = H5Dget_storage_size(ds.get());
  } else if (impl_->Deferrable(nbytes, data)) {
    digest.Update(data, nbytes);
    meta.stats = digest.Stats();
    Impl::Digested(meta, digest);
    impl_->Defer(key, dtype, shape, meta, data, nbytes);  // recorded when its pack is written
    return meta;
  } else {
    h5::Handle ds = impl_->CreateDataset(meta.dataset, dtype, box.sizes, compress, key);
    data_offset = impl_->StreamContiguous(nbytes ? impl_->DataOffset(ds.get(), key) : 0, data, nbytes, digest);
    meta.stored_bytes = nbytes;
  }
  meta.stats = digest.Stats();
  impl_->RecordChunk(key, false, dtype, shape, meta, digest, data_offset);
  return meta;
}

void ShardWriter::Reserve(const std::string& key, DType dtype, const Shape& shape, const Box& box,
                          const void* data) {
  if (impl_->compression.codec == Compression::Codec::kZstd) return;  // made one by one, with their data
  impl_->announced.push_back({key, h5::DatasetName(key, box.offsets, box == Box::Full(shape)), dtype, box.sizes,
                              static_cast<uint64_t>(box.NumElements()) * DTypeSize(dtype), data});
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
  const uint64_t at = s.offset + s.pos;
  s.digest->UpdateParallel(data, n, [&s, at](const unsigned char* p, std::size_t len, std::size_t pos) {
    WriteExact(s.shard->fd.get(), p, len, at + pos, s.shard->path);
    s.shard->Wrote(at + pos, len);
  });
  s.pos += n;
}

void ShardWriter::Stream::Copy(int fd, uint64_t offset, std::size_t n, const std::filesystem::path& path,
                               const ChunkMeta* expected, std::string_view what) {
  State& s = *state_;
  s.Reserve(n);
  // The range's own digest, when it is a whole stored chunk: v1 over its bytes, v2 in the
  // blocks that chunk was written with.
  std::optional<Digest> own;
  if (expected) own.emplace(DType::kUInt8, false, expected->block_bytes);
  // A whole chunk landing on a block boundary of this one, in blocks of the same size: its
  // own block digests (checked against its index below) are this chunk's too, so its bytes
  // are hashed once; only its last, partial block goes on into this chunk's next block.
  const uint64_t block = s.digest->block_bytes();
  const bool adopt = own && expected->block_bytes == block && s.digest->CanAdoptBlocks();
  const uint64_t tail_at = adopt ? n - n % block : n;  // bytes from here on are this digest's own
  std::vector<unsigned char> tail;
  // Each piece is hashed here as the FileHasher hands it over (a large range from the
  // page cache's own pages, a small one through a cache-sized buffer), then copied inside
  // the kernel by the shard's copier thread while the next piece is hashed. The copies
  // complete by ShardWriter::Finish.
  Copier& copier = s.shard->Copies();
  s.shard->Source(fd, path).Scan(offset, n, [&](const unsigned char* p, std::size_t len, uint64_t done) {
    // Both digests a cache-sized piece at a time: the second reads what the first brought
    // into the cache, not memory again.
    for (std::size_t at = 0; at < len; at += kDigestPiece) {
      const std::size_t k = std::min(kDigestPiece, len - at);
      if (own) own->Update(p + at, k);
      if (!adopt) s.digest->Update(p + at, k);
    }
    if (done + len > tail_at) {
      const uint64_t from = std::max<uint64_t>(done, tail_at);
      tail.insert(tail.end(), p + (from - done), p + len);
    }
    copier.Push({fd, offset + done, s.offset + s.pos + done, len, path});
  });
  s.pos += n;
  if (!own) return;
  CheckDigest(*own, *expected, n, what);
  if (adopt) {
    s.digest->AdoptBlocks(own->BlockDigests().data(), static_cast<std::size_t>(tail_at / block));
    s.digest->Update(tail.data(), tail.size());
  }
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
  // Closed now, not with the stream: an open dataset keeps HDF5's (weak) H5Fclose in
  // ShardWriter::Finish from closing the file, and the headers still in its cache from
  // reaching the file before the fsync.
  if (s.ds.Close() < 0) {
    throw Error(ErrorCode::kIO,
                s.shard->path.string() + ": closing dataset '" + s.meta.dataset + "'" + h5::ErrorStack());
  }
  return std::move(s.meta);
}

ChunkMeta ShardWriter::WriteBytes(const std::string& key, const void* data, std::size_t n) {
  ChunkMeta meta;
  meta.box = Box{{0}, {static_cast<int64_t>(n)}};
  meta.file = file_name_;
  meta.dataset = h5::EscapeKey(key);
  h5::Handle ds = impl_->CreateDataset(meta.dataset, DType::kUInt8, meta.box.sizes, false, key);
  Digest digest(DType::kUInt8, false, impl_->block_bytes);
  const uint64_t data_offset = impl_->StreamContiguous(n ? impl_->DataOffset(ds.get(), key) : 0, data, n, digest);
  meta.stored_bytes = n;
  impl_->RecordChunk(key, true, DType::kUInt8, {static_cast<int64_t>(n)}, meta, digest, data_offset);
  return meta;
}

namespace {
// How far from the end of a shard the index attribute's text is looked for, beyond its own
// length: HDF5 writes the attribute at the close, into the last object-header chunk or (a
// large one) the dense-attribute heap, both at the file's tail (measured: the text ended
// 4 B before the end for a 36 KB index, 25 KB before it for a 391 KB one).
constexpr uint64_t kIndexTailSlack = uint64_t{4} << 20;
}  // namespace

// The file offset of the last copy of `text` within the tail of the file, which HDF5 just
// wrote (in the page cache): an HDF5 string attribute's data is stored whole and as is,
// so a ranged reader can fetch the index by one read (FORMAT.md §3.1). Any copy of the
// text serves: the reader checks what it fetches against the digest of the text.
std::optional<uint64_t> ShardWriter::FindTail(const std::filesystem::path& path, uint64_t size,
                                              const std::string& text) {
  if (text.empty() || text.size() > size) return std::nullopt;
  // Read in windows from the end backwards (64 KiB of memory, not the whole tail): each
  // place where the text's first bytes appear is compared with the whole text.
  constexpr uint64_t kWindow = uint64_t{64} << 10;
  const std::string_view head(text.data(), std::min<std::size_t>(text.size(), 64));
  const uint64_t low = size - std::min<uint64_t>(size, text.size() + kIndexTailSlack);
  Fd fd = OpenFile(path, O_RDONLY);
  std::string window, piece;
  const auto whole_text_at = [&](uint64_t at) {
    for (uint64_t done = 0; done < text.size();) {
      const uint64_t n = std::min<uint64_t>(kWindow, text.size() - done);
      piece.resize(static_cast<std::size_t>(n));
      ReadExact(fd.get(), piece.data(), piece.size(), at + done, path);
      if (std::string_view(text).substr(static_cast<std::size_t>(done), piece.size()) != piece) return false;
      done += n;
    }
    return true;
  };
  for (uint64_t end = size; end > low;) {
    const uint64_t begin = end - std::min<uint64_t>(end - low, kWindow);
    // The window reaches head.size() - 1 bytes past `end`, so no match is split between two.
    const uint64_t stop = std::min<uint64_t>(size, end + head.size() - 1);
    window.resize(static_cast<std::size_t>(stop - begin));
    ReadExact(fd.get(), window.data(), window.size(), begin, path);
    for (std::size_t at = window.rfind(head); at != std::string::npos;) {
      const uint64_t offset = begin + at;
      if (offset + text.size() <= size && whole_text_at(offset)) return offset;
      at = at == 0 ? std::string::npos : window.rfind(head, at - 1);
    }
    end = begin;
  }
  return std::nullopt;
}

ShardWriter::Written ShardWriter::Finish() {
  if (impl_->copier) impl_->copier->Drain();
  impl_->FlushDeferred();
  if (impl_->pack.filled != 0 || !impl_->made.empty() || !impl_->announced.empty()) {
    throw Error(ErrorCode::kInternal, impl_->path.filename().string() + ": chunks reserved but not written");
  }
  Written out;
  const std::string index = impl_->index.Finish();
  out.index = IndexDigest(index);
  h5::WriteStringAttr(impl_->file.get(), names::kShardIndexAttr, index);
  if (impl_->file.Close() < 0) {
    throw Error(ErrorCode::kIO, impl_->path.string() + ": closing HDF5 file" + h5::ErrorStack());
  }
  if (!impl_->transient) {
    const auto fsync_start = std::chrono::steady_clock::now();
    FsyncFd(impl_->fd.get(), impl_->path);
    out.fsync_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - fsync_start).count();
  }
  out.bytes = FileSize(impl_->fd.get(), impl_->path);
  impl_->fd.Close(impl_->path);
  if (const auto at = FindTail(impl_->path, out.bytes, index)) {
    out.index_offset = *at;
    out.index_bytes = index.size();
  }
  return out;
}

}  // namespace ckpt::storage
