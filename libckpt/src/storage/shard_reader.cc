// storage/shard_reader.cc
#include "storage/shard_reader.h"

#include <sys/stat.h>

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "format/checked.h"
#include "format/names.h"
#include "layout/box.h"
#include "storage/file_hasher.h"
#include "storage/fs.h"
#include "storage/h5.h"
#include "storage/pool.h"
#include "storage/shard_index.h"

namespace ckpt::storage {
namespace {

constexpr std::size_t kDirectRunBytes = std::size_t{256} << 10;  // pread runs this big directly
constexpr std::size_t kBounceBytes = std::size_t{16} << 20;      // else through a bounce buffer
constexpr std::size_t kDigestBlock = std::size_t{8} << 20;
constexpr std::size_t kBoundedCacheBytes = std::size_t{1} << 20;  // the metadata cache of a one-visit reader
// Verified reads from a file: the interior of a large run is read in pieces of this size
// on a helper thread, each hashed here while the next one is read.
constexpr uint64_t kPipePiece = uint64_t{4} << 20;
// Small runs closer than this share one read.
constexpr uint64_t kGapBytes = uint64_t{256} << 10;
// A verified read's window over small runs (whole blocks, read once, hashed, then the runs
// copied out): small enough to stay in a core's L2 (1 MiB here) from the kernel's copy in
// through the hash to the copies out. 16 MiB windows went through memory three times: a load
// of column thirds (runs of a few KiB, so every block is read) cost 0.8-2.3 s of CPU against
// raw's 0.4-0.6 s; 256 KiB and 1 MiB windows cost 0.47-0.63 s, cold or warm.
constexpr uint64_t kWindowBytes = uint64_t{1} << 20;
// How far ahead of the block being read the kernel is asked to fetch, so the disk stays
// busy while a block is hashed and copied.
constexpr uint64_t kReadAhead = uint64_t{64} << 20;

std::string DimsString(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// A contiguous byte run of a region: `len` bytes at byte `src` of the chunk, to `to`.
struct ByteRun {
  uint64_t src;
  uint64_t len;
  unsigned char* to;
};

// Reads byte ranges of a v2 chunk and hands them out only after every block they touch
// hashed to its digest (FORMAT.md §7). Runs are taken in increasing order: small ones
// share windows of whole blocks (read once, however many runs meet them, but never a
// block no run touches); a large one is read straight into the destination, its
// interior blocks hashed there (the next piece read on a helper thread meanwhile), and only its partial
// first and last blocks go through the window. With direct I/O the interior's blocks are
// hashed as they are handed over, in the scratch buffer they are copied out of (in cache).
class BlockReader {
 public:
  // fetch(from, n, to): the chunk's raw bytes [from, from + n) into `to`. `pipelined`: a
  // fetch may run on a helper thread while this thread hashes. `bulk`, where given, reads
  // the interiors of large runs instead (direct I/O), handing every piece to its sink as
  // DirectReader::Read does; `fetch` still reads the windows.
  using Fetch = std::function<void(uint64_t, uint64_t, unsigned char*)>;
  using Bulk = std::function<void(uint64_t, uint64_t, unsigned char*, const DirectReader::Sink&)>;
  BlockReader(std::string what, const ChunkMeta& chunk, uint64_t n, Fetch fetch, bool pipelined,
              std::vector<unsigned char>& window, Bulk bulk = {})
      : what_(std::move(what)), chunk_(chunk), b_(chunk.block_bytes), n_(n), fetch_(std::move(fetch)),
        bulk_(std::move(bulk)), pipelined_(pipelined), window_(window) {}

  void Read(const std::vector<ByteRun>& runs) {
    for (std::size_t i = 0; i < runs.size();) {
      const ByteRun& r = runs[i];
      const uint64_t b0 = r.src / b_, b1 = (r.src + r.len - 1) / b_ + 1;
      if (InWindow(b0, b1)) {  // read and checked already
        std::memcpy(r.to, window_.data() + (r.src - wb_ * b_), r.len);
        ++i;
        continue;
      }
      if (r.len >= kDirectRunBytes && Interior(r).first < Interior(r).second) {
        Direct(r);
        ++i;
        continue;
      }
      // One window over this run and the following small ones, bounded, while the gap to
      // the next is small: one read instead of many (a cold disk serves it at once), the
      // blocks in gaps read but not hashed (nothing of them is handed out).
      uint64_t end = b1;
      std::size_t j = i + 1;
      for (; j < runs.size() && runs[j].len < kDirectRunBytes; ++j) {
        const uint64_t c0 = runs[j].src / b_, c1 = (runs[j].src + runs[j].len - 1) / b_ + 1;
        if ((c0 > end && (c0 - end) * b_ >= kGapBytes) || (std::max(end, c1) - b0) * b_ > kWindowBytes) break;
        end = std::max(end, c1);
      }
      Load(b0, end, &runs[i], &runs[0] + j);
      for (std::size_t k = i; k < j; ++k)
        std::memcpy(runs[k].to, window_.data() + (runs[k].src - wb_ * b_), runs[k].len);
      i = j;
    }
  }

  uint64_t bytes_read() const { return bytes_read_; }

 private:
  // The block-aligned interior [a, z) of a run: whole blocks (the chunk's last block counts
  // whole where the run ends with the chunk).
  std::pair<uint64_t, uint64_t> Interior(const ByteRun& r) const {
    const uint64_t e = r.src + r.len;
    const uint64_t a = (r.src + b_ - 1) / b_ * b_;
    const uint64_t z = e == n_ ? n_ : e / b_ * b_;
    return {a, std::max(a, z)};
  }

  void Check(uint64_t block, const unsigned char* p) const {
    const uint64_t len = std::min(b_, n_ - block * b_);
    const uint64_t got = HashBlock(p, static_cast<std::size_t>(len));
    const uint64_t want = BlockDigestAt(chunk_.blocks, static_cast<std::size_t>(block));
    if (got != want) throw BlockMismatch(what_, block, b_, n_, want, got);
  }

  bool InWindow(uint64_t b0, uint64_t b1) const {
    if (b0 < wb_ || b1 > we_) return false;
    for (uint64_t b = b0; b < b1; ++b)
      if (!ok_[b - wb_]) return false;
    return true;
  }

  // Reads blocks [b0, b1) into the window and checks those the runs [first, last) touch
  // (all of them when there are none).
  void Load(uint64_t b0, uint64_t b1, const ByteRun* first = nullptr, const ByteRun* last = nullptr) {
    const uint64_t from = b0 * b_, to = std::min(n_, b1 * b_);
    window_.resize(static_cast<std::size_t>(to - from));
    wb_ = we_ = 0;  // nothing valid while it is refilled
    fetch_(from, to - from, window_.data());
    bytes_read_ += to - from;
    ok_.assign(static_cast<std::size_t>(b1 - b0), first == last);
    for (uint64_t b = b0; first == last && b < b1; ++b) Check(b, window_.data() + (b - b0) * b_);
    for (const ByteRun* r = first; r != last; ++r)
      for (uint64_t b = r->src / b_; b <= (r->src + r->len - 1) / b_; ++b) {
        if (ok_[b - b0]) continue;
        Check(b, window_.data() + (b - b0) * b_);
        ok_[b - b0] = 1;
      }
    wb_ = b0;
    we_ = b1;
  }

  void FromWindow(uint64_t block, uint64_t from, uint64_t len, unsigned char* to) {
    if (!InWindow(block, block + 1)) Load(block, block + 1);
    std::memcpy(to, window_.data() + (from - wb_ * b_), static_cast<std::size_t>(len));
  }

  void Direct(const ByteRun& r) {
    const uint64_t e = r.src + r.len;
    // Plain variables, not a structured binding: lambdas below capture `a`, which clang 14
    // (the fuzz build's compiler) does not allow of a binding.
    const std::pair<uint64_t, uint64_t> interior = Interior(r);
    const uint64_t a = interior.first, z = interior.second;
    if (r.src < a) FromWindow(r.src / b_, r.src, a - r.src, r.to);
    // The interior, read straight into the destination a piece at a time and hashed there.
    // From a file, piece i + 1 is read on a helper thread while this one hashes piece i: one
    // sequential read in flight, as a raw read has, so the kernel's own read-ahead keeps the
    // disk busy (an explicit POSIX_FADV_WILLNEED blocks its caller while it queues the
    // reads, and two streams at once compete for the disk; both measured slower, cold).
    // Through HDF5, one piece at a time: each read selects and decompresses whole HDF5 chunks.
    unsigned char* out = r.to + (a - r.src);
    const uint64_t len = z - a;
    const uint64_t piece = std::max<uint64_t>(b_, (pipelined_ ? kPipePiece : kDigestBlock) / b_ * b_);
    auto check = [this, out, a](uint64_t pos, uint64_t k) {
      for (uint64_t b = 0; b < k; b += b_) Check((a + pos + b) / b_, out + pos + b);
    };
    if (bulk_) {
      // Each block is checked once its last byte is handed over: from the piece while it
      // is whole in it, else (a block split across pieces) from the destination.
      uint64_t unchecked = 0;  // of the interior: the first block not yet checked
      bulk_(a, len, out, [&](const unsigned char* piece_at, std::size_t k, std::size_t pos) {
        for (;;) {
          const uint64_t end = std::min(unchecked + b_, len);
          if (unchecked >= len || end > pos + k) break;
          Check((a + unchecked) / b_, unchecked >= pos ? piece_at + (unchecked - pos) : out + unchecked);
          unchecked = end;
        }
      });
      if (unchecked != len) throw std::logic_error("BlockReader: a direct read handed over too few bytes");
    } else if (pipelined_ && len > piece) {
      auto read = [this, out, a, len, piece](uint64_t pos) { fetch_(a + pos, std::min(piece, len - pos), out + pos); };
      std::future<void> reading = AsyncOrDeferred(read, 0);
      for (uint64_t pos = 0; pos < len; pos += piece) {
        reading.get();
        if (pos + piece < len) reading = AsyncOrDeferred(read, pos + piece);
        try {
          check(pos, std::min(piece, len - pos));
        } catch (...) {
          if (reading.valid()) reading.wait();  // the block named is the first bad one
          throw;
        }
      }
    } else {
      for (uint64_t pos = 0; pos < len; pos += piece) {
        const uint64_t k = std::min(piece, len - pos);
        fetch_(a + pos, k, out + pos);
        check(pos, k);
      }
    }
    bytes_read_ += len;
    if (z < e) FromWindow(z / b_, z, e - z, r.to + (z - r.src));
  }

  const std::string what_;
  const ChunkMeta& chunk_;
  const uint64_t b_, n_;
  const Fetch fetch_;
  const Bulk bulk_;
  const bool pipelined_;
  std::vector<unsigned char>& window_;
  uint64_t wb_ = 0, we_ = 0;  // blocks [wb_, we_) are in the window
  std::vector<char> ok_;      // which of them were checked
  uint64_t bytes_read_ = 0;
};

// Selects the elements [e0, e1) of a row-major `dims` box in `space` (at most two
// hyperslabs per dimension, in order), so HDF5 reads a linear range of a chunk.
void SelectLinear(hid_t space, const std::vector<hsize_t>& dims, hsize_t e0, hsize_t e1) {
  const std::size_t rank = dims.size();
  std::vector<hsize_t> inner(rank, 1);
  for (std::size_t d = rank - 1; d > 0; --d) inner[d - 1] = inner[d] * dims[d];
  bool first = true;
  std::vector<hsize_t> start(rank), count(rank);
  auto add = [&](std::size_t d, hsize_t from, hsize_t rows) {  // prefix start[0..d) fixed, count 1
    for (std::size_t k = 0; k < d; ++k) count[k] = 1;
    start[d] = from;
    count[d] = rows;
    for (std::size_t k = d + 1; k < rank; ++k) {
      start[k] = 0;
      count[k] = dims[k];
    }
    h5::Check(H5Sselect_hyperslab(space, first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                                  count.data(), nullptr),
              "H5Sselect_hyperslab");
    first = false;
  };
  // [lo, hi) within the sub-box of dims d.., under the fixed prefix start[0..d).
  std::function<void(std::size_t, hsize_t, hsize_t)> range = [&](std::size_t d, hsize_t lo, hsize_t hi) {
    if (lo >= hi) return;
    const hsize_t i0 = lo / inner[d], i1 = hi / inner[d];
    if (d + 1 == rank) return add(d, lo, hi - lo);
    if (i0 == i1) {
      start[d] = i0;
      return range(d + 1, lo - i0 * inner[d], hi - i0 * inner[d]);
    }
    hsize_t whole0 = i0;
    if (lo % inner[d]) {
      start[d] = i0;
      range(d + 1, lo % inner[d], inner[d]);
      ++whole0;
    }
    if (i1 > whole0) add(d, whole0, i1 - whole0);
    if (hi % inner[d]) {
      start[d] = i1;
      range(d + 1, 0, hi % inner[d]);
    }
  };
  range(0, e0, e1);
}

}  // namespace

struct ShardReader::Impl {
  std::filesystem::path path;
  bool text_read = false;     // index_text read (or index_error says why not)
  bool index_loaded = false;  // and parsed
  bool locate_by_index = true;  // chunks located through the index (else through HDF5)
  bool trusted_records = false; // chunks come from an index the caller checked (TrustRecords)
  int foreign_links = -1;       // whether the root holds links not its own (-1: not looked yet)
  std::string index_text;                // the attribute as stored
  ShardIndex parsed;                     // the shard index, when it parsed
  std::string index_error;               // why not, else
  ErrorCode index_error_code = ErrorCode::kCorrupt;
  std::unordered_map<std::string, const ShardIndexEntry*> index;    // by dataset, for the fast path
  Fd fd;
  uint64_t size = 0;
  h5::Handle file;
  h5::RawFile raw;  // for checking object headers before HDF5 opens a dataset
  std::vector<unsigned char> bounce;
  std::unique_ptr<FileHasher> hasher;  // over fd, made on first Hash
  std::optional<DirectReader::Policy> direct_policy;  // large reads direct, under this policy
  bool direct_opened = false;                          // tried to open `direct` (it may be null)
  std::unique_ptr<DirectReader> direct;

  // The direct reader, opened on first use; nullptr where reads stay buffered.
  DirectReader* Direct() {
    if (!direct_policy) return nullptr;
    if (!direct_opened) {
      direct_opened = true;
      direct = DirectReader::Open(fd.get(), path, *direct_policy);
    }
    return direct.get();
  }
  std::unordered_map<std::string, PackExtent> packs;  // pack datasets checked so far

  std::string Where(const std::string& key, const ChunkMeta& c) const {
    return path.filename().string() + ": tensor '" + key + "' chunk " + c.box.ToString() +
           " (dataset '" + c.dataset + "')";
  }
  // How a block error names the chunk (FORMAT.md §7).
  std::string Chunk(const std::string& key, const ChunkMeta& c) const {
    return path.filename().string() + ": tensor '" + key + "' chunk " + c.box.ToString();
  }
};

ShardReader::ShardReader(const Dir& dir, const std::string& file_name, bool use_index, bool evict_on_close)
    : ShardReader(OpenRegularFileAt(dir, file_name), dir.path() / file_name, use_index, evict_on_close, false,
                  &dir) {}

ShardReader::ShardReader(Fd fd, std::filesystem::path path, bool use_index, bool in_memory)
    : ShardReader(std::move(fd), std::move(path), use_index, false, in_memory, nullptr) {}

ShardReader::ShardReader(Fd fd, std::filesystem::path path, bool use_index, bool evict_on_close, bool in_memory,
                         const Dir* dir)
    : impl_(std::make_unique<Impl>()) {
  h5::Init();
  impl_->path = std::move(path);
  impl_->fd = std::move(fd);
  impl_->size = FileSize(impl_->fd.get(), impl_->path);
  // HDF5 opens the very file checked above, whatever happens to the paths meanwhile.
  const std::string proc = ProcPath(impl_->fd.get());
  std::string why;  // HDF5's error stack of a failed open (closing the fapl would clear it)
  // Not HDF5's own evict-on-close: in HDF5 1.10 each H5Dclose then flushes the dataset's
  // tagged entries through a pass over the whole metadata cache, whose share of a verify's
  // CPU grew with the dataset count (4%, 16%, 20% at 20k, 80k, 200k datasets; issue 32.6).
  // A small fixed cache evicts the least recently used headers as new ones come, at a
  // constant cost per dataset.
  auto open = [&](bool bounded) {
    h5::Handle fapl = h5::Plist(h5::Check(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"));
    if (bounded) h5::SetFixedMetadataCache(fapl.get(), kBoundedCacheBytes);
    // The core driver reads the file whole at open; HDF5's every later read is a copy.
    if (in_memory) h5::Check(H5Pset_fapl_core(fapl.get(), 1 << 16, /*backing_store=*/false), "H5Pset_fapl_core");
    // No HDF5 file lock: a committed shard is never written again (FORMAT.md §2), and a
    // reader racing an overwrite was refused ("unable to lock the file") by the lock of a
    // writer's HDF5 handle on the same file, an error that read as damage.
    h5::Check(H5Pset_file_locking(fapl.get(), false, true), "H5Pset_file_locking");
    const hid_t got = H5Fopen(proc.c_str(), H5F_ACC_RDONLY, fapl.get());
    if (got < 0) why = h5::ErrorStack();
    return got;
  };
  hid_t id = open(evict_on_close);
  if (id < 0 && evict_on_close && !in_memory) {  // as HDF5 would open it for any reader
    const std::string first = why;
    id = open(false);
    if (id < 0) why = first;
  }
  if (id < 0) {
    // HDF5 cannot open a file removed since it was opened here (it resolves the /proc
    // link's target, which is gone): the checkpoint was replaced meanwhile, no damage.
    struct stat st;
    if (dir && ::fstat(impl_->fd.get(), &st) == 0 && st.st_nlink == 0)
      dir->ThrowChanged(impl_->path.filename().string() + " was removed");
    throw Error(ErrorCode::kCorrupt, impl_->path.string() + ": not a readable HDF5 file" + why);
  }
  impl_->file = h5::File(id);
  try {
    impl_->raw = h5::DescribeFile(id, impl_->fd.get(), impl_->size);
  } catch (const Error& e) {
    throw Error(ErrorCode::kCorrupt, impl_->path.string() + ": " + e.what());
  }
  impl_->locate_by_index = use_index;
  if (use_index) LoadIndex();
}

void ShardReader::ReadIndexText() {
  Impl& m = *impl_;
  if (m.text_read) return;
  m.text_read = true;
  try {
    m.index_text = h5::ReadStringAttr(m.file.get(), names::kShardIndexAttr);
    if (m.index_text.empty()) {
      m.index_error = m.path.string() + ": HDF5 file without a " + names::kShardIndexAttr +
                      " attribute; not a ckpt shard";
    }
  } catch (const Error& e) {
    m.index_text.clear();
    m.index_error = e.what();
    m.index_error_code = e.code();
  }
}

void ShardReader::LoadIndex() {
  Impl& m = *impl_;
  if (m.index_loaded) return;
  m.index_loaded = true;
  ReadIndexText();
  if (!m.index_error.empty()) return;
  const std::string where = m.path.string() + ": " + names::kShardIndexAttr;
  try {
    m.parsed = ParseShardIndex(m.index_text, where);
  } catch (const Error& e) {
    // A damaged or foreign index only disables the fast path (FORMAT.md §5.5).
    m.index_error = e.what();
    m.index_error_code = e.code();
    m.parsed = {};
    return;
  }
  // The index is trusted only in a shard whose root holds nothing but its own datasets: a
  // soft or external link (which the index cannot show) sends every read through HDF5,
  // where the dataset it names is checked and refused.
  if (!m.locate_by_index || !h5::ForeignLinks(m.file.get(), 1).empty()) return;
  for (const auto& e : m.parsed.entries)
    if (e.chunk.offset && !e.chunk.pack_offset) m.index.emplace(e.chunk.dataset, &e);
}

const ShardIndex& ShardReader::Index() {
  LoadIndex();
  if (!impl_->index_error.empty()) throw Error(impl_->index_error_code, impl_->index_error);
  return impl_->parsed;
}

const std::string& ShardReader::IndexText() {
  ReadIndexText();
  return impl_->index_text;
}

std::vector<std::pair<std::string, std::string>> ShardReader::ForeignLinks(std::size_t limit) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, type] : h5::ForeignLinks(impl_->file.get(), limit))
    out.emplace_back(name, impl_->path.filename().string() + ": " + h5::ForeignLinkMessage(name, type));
  if (limit > 0) impl_->foreign_links = out.empty() ? 0 : 1;  // what Find would look up
  return out;
}

std::vector<std::pair<std::string, std::string>> ShardReader::ScanRoot(
    const std::function<void(const char*, uint64_t)>& hard, std::size_t limit) {
  std::vector<std::pair<std::string, std::string>> out;
  bool foreign = false;
  h5::VisitRootLinks(impl_->file.get(), [&](const char* name, const H5L_info_t& info) {
    if (info.type == H5L_TYPE_HARD) {
      hard(name, info.u.address);
    } else {
      foreign = true;
      if (out.size() < limit)
        out.emplace_back(name, impl_->path.filename().string() + ": " + h5::ForeignLinkMessage(name, info.type));
    }
    return true;
  });
  impl_->foreign_links = foreign ? 1 : 0;
  return out;
}

void ShardReader::TrustRecords() { impl_->trusted_records = true; }

ShardReader::~ShardReader() = default;

void ShardReader::UseDirectIo(std::optional<DirectReader::Policy> policy) {
  impl_->direct_policy = policy;
  impl_->direct_opened = false;
  impl_->direct.reset();
}

uint64_t ShardReader::bytes_read_direct() const { return impl_->direct ? impl_->direct->bytes() : 0; }
uint64_t ShardReader::file_size() const { return impl_->size; }
const std::filesystem::path& ShardReader::path() const { return impl_->path; }
int ShardReader::fd() const { return impl_->fd.get(); }

std::vector<std::string> ShardReader::UnnamedObjects(const std::function<bool(const std::string&)>& named,
                                                     std::size_t limit) {
  return h5::UnnamedHardLinks(impl_->file.get(), named, limit);
}

// Where a chunk's data lies: through the shard index when it describes the chunk exactly,
// else by opening its dataset and checking its type, shape and extent against `chunk`.
struct ShardReader::Located {
  uint64_t chunk_bytes = 0;
  bool contiguous = false;
  uint64_t base = 0;  // file offset of the data when contiguous
  h5::Handle ds;      // open only when located through HDF5
  h5::Handle type, space;
};

ShardReader::Located ShardReader::Find(const std::string& key, DType dtype, const ChunkMeta& chunk, bool by_header,
                                       const uint64_t* address) {
  Impl& m = *impl_;
  const std::size_t item = DTypeSize(dtype);
  Located at;
  // Called per chunk: messages (m.Where) are built only for an error.
  int64_t bytes = 0;
  const int64_t elements = chunk.box.NumElements();
  if (elements < 0 || __builtin_mul_overflow(elements, static_cast<int64_t>(item), &bytes))
    internal::CheckedMul(elements, static_cast<int64_t>(item), m.Where(key, chunk));  // throws
  at.chunk_bytes = static_cast<uint64_t>(bytes);
  if (!FindWithoutHeader(key, dtype, chunk, by_header, at)) FindThroughHeader(key, dtype, chunk, by_header, address, at);
  return at;
}

bool ShardReader::FindWithoutHeader(const std::string& key, DType dtype, const ChunkMeta& chunk, bool by_header,
                                    Located& at) {
  Impl& m = *impl_;
  // A v2 chunk located by its (digest-checked) index record: no dataset opened. (Only the
  // checkpoint reader fills `offset`, from an index it checked; a verifier clears it to
  // check the HDF5 header, and a lone shard's chunks never carry it.)
  // Not in a shard whose root holds soft or external links (FORMAT.md §5.6): there every
  // dataset goes through HDF5, where one that is such a link is refused.
  const bool by_record =
      !by_header && chunk.block_bytes && chunk.offset && chunk.compression.codec == Compression::Codec::kNone;
  if (m.foreign_links < 0 && (by_record || by_header))  // (one pass over the root's links)
    m.foreign_links = h5::ForeignLinks(m.file.get(), 1).empty() ? 0 : 1;
  if (by_record && m.foreign_links == 0) {
    if (chunk.pack_offset) {  // its pack's header checked too, once per pack
      Located packed = FindPacked(key, chunk, at.chunk_bytes);
      if (packed.base != *chunk.offset) {
        throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": the index places its data at byte " +
                                             std::to_string(*chunk.offset) + ", its pack's HDF5 header at byte " +
                                             std::to_string(packed.base));
      }
      at = std::move(packed);
      return true;
    }
    if (*chunk.offset > m.size || at.chunk_bytes > m.size - *chunk.offset) {
      throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": data at offset " + std::to_string(*chunk.offset) +
                                           " lies past the end of the file (" + std::to_string(m.size) +
                                           " bytes): truncated");
    }
    at.contiguous = true;
    at.base = *chunk.offset;
    return true;
  }
  // An empty v2 chunk (FORMAT.md §9.1: no bytes, no blocks, hence no offset) from a checked
  // index (TrustRecords) has nothing in the file to find: its dataset is not
  // opened (a walk of the root's link index and a header per empty tensor, issue 32.6).
  // ckpt-verify (by_header) still checks its header.
  if (!by_header && m.trusted_records && at.chunk_bytes == 0 && chunk.block_bytes && !chunk.pack_offset &&
      chunk.compression.codec == Compression::Codec::kNone) {
    if (m.foreign_links < 0) m.foreign_links = h5::ForeignLinks(m.file.get(), 1).empty() ? 0 : 1;
    if (m.foreign_links == 0) {
      at.contiguous = true;
      return true;
    }
  }
  if (chunk.pack_offset) {
    at = FindPacked(key, chunk, at.chunk_bytes);
    return true;
  }
  if (auto it = by_header ? m.index.end() : m.index.find(chunk.dataset);
      it != m.index.end() && chunk.compression.codec == Compression::Codec::kNone) {
    const ShardIndexEntry& d = *it->second;
    const bool same_type = d.bytes ? dtype == DType::kUInt8 : d.dtype == dtype;
    const uint64_t offset = *d.chunk.offset;
    if (same_type && d.chunk.box.sizes == chunk.box.sizes && at.chunk_bytes > 0 && offset <= m.size &&
        at.chunk_bytes <= m.size - offset) {
      at.contiguous = true;
      at.base = offset;
      return true;
    }
  }
  return false;
}

void ShardReader::FindThroughHeader(const std::string& key, DType dtype, const ChunkMeta& chunk, bool by_header,
                                    const uint64_t* address, Located& at) {
  Impl& m = *impl_;
  std::string problem;
  at.ds = by_header && address ? h5::TryOpenOwnDatasetAt(m.file.get(), m.raw, chunk.dataset, *address, problem)
                                : h5::TryOpenOwnDataset(m.file.get(), m.raw, chunk.dataset, problem);
  if (!at.ds) throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": " + problem);
  const hid_t type = H5Dget_type(at.ds.get());
  at.type = h5::Type(type < 0 ? h5::Check(type, m.Where(key, chunk)) : type);
  if (!h5::TypeMatches(at.type.get(), dtype)) {
    throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": stored element type (" +
                                         std::to_string(H5Tget_size(at.type.get())) +
                                         " bytes) does not match dtype " + std::string(DTypeName(dtype)));
  }
  const hid_t space = H5Dget_space(at.ds.get());
  at.space = h5::Space(space < 0 ? h5::Check(space, m.Where(key, chunk)) : space);
  const int rank = H5Sget_simple_extent_ndims(at.space.get());
  std::vector<hsize_t> dims(rank > 0 ? rank : 0);
  if (rank > 0) H5Sget_simple_extent_dims(at.space.get(), dims.data(), nullptr);
  const std::vector<hsize_t> expected(chunk.box.sizes.begin(), chunk.box.sizes.end());
  if (dims != expected) {
    throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": dataset has shape " + DimsString(dims) +
                                         ", metadata says " + DimsString(expected));
  }
  // Only contiguous storage in the file has one data address, and HDF5 filters only
  // chunked storage: a dataset with an address is contiguous, unfiltered and its own, no
  // need to copy its creation properties (a tenth of the cost of checking a dataset) to
  // ask. Any other is checked for what the format does not allow (virtual, external
  // storage, a filter other than shuffle and zstd) before its data is read.
  const haddr_t base = H5Dget_offset(at.ds.get());
  if (base != HADDR_UNDEF) {
    at.contiguous = true;
  } else {
    h5::Handle dcpl = h5::Plist(h5::Check(H5Dget_create_plist(at.ds.get()), m.Where(key, chunk)));
    h5::CheckStorage(dcpl.get(), m.Where(key, chunk));
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    at.contiguous = layout == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl.get()) == 0;
    // An HDF5 chunk is never larger than its dataset in a shard (a writer's chunk dims are
    // clamped to the extent), and HDF5 allocates a whole chunk to read any of it.
    if (layout == H5D_CHUNKED) {
      std::vector<hsize_t> cdims(dims.size() + 1, 0);
      const int crank = H5Pget_chunk(dcpl.get(), static_cast<int>(cdims.size()), cdims.data());
      bool ok = crank == static_cast<int>(dims.size());
      for (std::size_t d = 0; ok && d < dims.size(); ++d) ok = cdims[d] >= 1 && cdims[d] <= std::max<hsize_t>(dims[d], 1);
      if (!ok) {
        h5::ErrorStack();  // cleared
        cdims.resize(static_cast<std::size_t>(std::clamp<int>(crank, 0, static_cast<int>(cdims.size()))));
        throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": HDF5 chunk dimensions " + DimsString(cdims) +
                                             " do not fit the dataset's shape " + DimsString(dims));
      }
      // HDF5 reads a stored chunk whole into a buffer of the size its index records: chunks
      // that claim more bytes than the file holds are refused before any is read (the
      // fuzzer's: one of 242 MB in a 13 KB file, 20 s an input).
      const hsize_t stored = H5Dget_storage_size(at.ds.get());
      if (stored > m.size) {
        throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": its HDF5 chunks claim " + std::to_string(stored) +
                                             " bytes, more than the file's " + std::to_string(m.size));
      }
    }
  }
  if (at.chunk_bytes == 0 || !at.contiguous) return;
  if (base == HADDR_UNDEF || base > m.size || at.chunk_bytes > m.size - base) {
    throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": data lies past the end of the file (" +
                                         std::to_string(m.size) + " bytes): truncated");
  }
  at.base = base;
}


// A packed chunk (FORMAT.md §5.7) through its pack's HDF5 header: a 1-D uint8 contiguous
// dataset whose extent holds the chunk's bytes from `pack_offset` on, inside the file.
ShardReader::Located ShardReader::FindPacked(const std::string& key, const ChunkMeta& chunk, uint64_t chunk_bytes) {
  Impl& m = *impl_;
  Located at;
  at.chunk_bytes = chunk_bytes;
  const std::string where = m.Where(key, chunk);
  if (chunk.compression.codec != Compression::Codec::kNone) {
    throw Error(ErrorCode::kCorrupt, where + ": a packed chunk cannot be compressed");
  }
  const PackExtent pack = Pack(chunk.dataset, where);
  if (*chunk.pack_offset > pack.bytes || at.chunk_bytes > pack.bytes - *chunk.pack_offset) {
    throw Error(ErrorCode::kCorrupt, where + ": its " + std::to_string(at.chunk_bytes) + " bytes at byte " +
                                         std::to_string(*chunk.pack_offset) + " of the pack lie outside the pack's " +
                                         std::to_string(pack.bytes) + " bytes");
  }
  at.contiguous = true;
  at.base = pack.base + *chunk.pack_offset;
  return at;
}

ShardReader::PackExtent ShardReader::Pack(const std::string& dataset, const std::string& where) {
  Impl& m = *impl_;
  if (auto it = m.packs.find(dataset); it != m.packs.end()) return it->second;
  if (dataset.rfind(names::kPackPrefix, 0) != 0) {
    throw Error(ErrorCode::kCorrupt, where + ": a packed chunk names '" + dataset + "', not a pack dataset (" +
                                         names::kPackPrefix + "<n>)");
  }
  h5::Handle ds = h5::OpenOwnDataset(m.file.get(), m.raw, dataset, where);
  h5::Handle type = h5::Type(h5::Check(H5Dget_type(ds.get()), where));
  h5::Handle space = h5::Space(h5::Check(H5Dget_space(ds.get()), where));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  hsize_t dims[1] = {0};
  if (!h5::TypeMatches(type.get(), DType::kUInt8) || rank != 1) {
    throw Error(ErrorCode::kCorrupt, where + ": pack '" + dataset + "' is not a 1-D uint8 dataset");
  }
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  PackExtent pack{0, dims[0]};
  if (pack.bytes > 0) {
    const haddr_t base = H5Dget_offset(ds.get());
    if (base == HADDR_UNDEF) {  // virtual, external or filtered: refused for what it is (FORMAT.md §5.6)
      h5::Handle dcpl = h5::Plist(h5::Check(H5Dget_create_plist(ds.get()), where));
      h5::CheckStorage(dcpl.get(), where);
      throw Error(ErrorCode::kCorrupt, where + ": pack '" + dataset + "' is not contiguous in the file");
    }
    if (base > m.size || pack.bytes > m.size - base) {
      throw Error(ErrorCode::kCorrupt, where + ": pack '" + dataset + "' lies past the end of the file (" +
                                           std::to_string(m.size) + " bytes): truncated");
    }
    pack.base = base;
  }
  m.packs.emplace(dataset, pack);
  return pack;
}

std::optional<uint64_t> ShardReader::Locate(const std::string& key, DType dtype, const ChunkMeta& chunk,
                                            bool by_header, const uint64_t* address) {
  const Located at = Find(key, dtype, chunk, by_header, address);
  if (!at.contiguous) return std::nullopt;
  return at.base;
}

uint64_t ShardReader::Read(const std::string& key, DType dtype, const ChunkMeta& chunk, const Box& region,
                           void* dst, const Box& dst_box, bool verify) {
  Impl& m = *impl_;
  const Located at = Find(key, dtype, chunk);
  const bool whole = region == chunk.box;
  if (!verify) return ReadRaw(at, key, dtype, chunk, region, dst, dst_box, nullptr);
  if (chunk.block_bytes) {
    if (chunk.blocks.size() != BlockCount(at.chunk_bytes, chunk.block_bytes) * 16) {
      throw Error(ErrorCode::kCorrupt, m.Chunk(key, chunk) + ": the index lists " +
                                           std::to_string(chunk.blocks.size() / 16) + " block digests for its " +
                                           std::to_string(at.chunk_bytes) + " bytes in blocks of " +
                                           std::to_string(chunk.block_bytes));
    }
    if (whole && ChecksumOfBlocks(chunk.blocks) != chunk.checksum) {
      throw Error(ErrorCode::kCorrupt, m.Chunk(key, chunk) + ": checksum mismatch: metadata says " +
                                           chunk.checksum + ", the block digests hash to " +
                                           ChecksumOfBlocks(chunk.blocks));
    }
    if (at.chunk_bytes == 0 || region.NumElements() == 0) return 0;
    return ReadBlocks(at, key, dtype, chunk, region, dst, dst_box);
  }
  // v1: the chunk's checksum covers its bytes only as a whole, so a part is read whole.
  Digest digest(dtype, false);
  if (whole) {
    const uint64_t n = ReadRaw(at, key, dtype, chunk, region, dst, dst_box, &digest);
    CheckDigest(digest, chunk, at.chunk_bytes, m.Where(key, chunk));
    return n;
  }
  if (at.chunk_bytes == 0 || region.NumElements() == 0) return 0;
  const std::size_t item = DTypeSize(dtype);
  std::vector<unsigned char> tmp(static_cast<std::size_t>(at.chunk_bytes));
  const uint64_t n = ReadRaw(at, key, dtype, chunk, chunk.box, tmp.data(), chunk.box, &digest);
  CheckDigest(digest, chunk, at.chunk_bytes, m.Where(key, chunk));
  layout::ForEachRun(chunk.box, dst_box, region, [&](const layout::Run& run) {
    std::memcpy(static_cast<unsigned char*>(dst) + run.dst * item, tmp.data() + run.src * item,
                static_cast<std::size_t>(run.count) * item);
  });
  return n;
}

uint64_t ShardReader::Verify(const std::string& key, DType dtype, const ChunkMeta& chunk) {
  Impl& m = *impl_;
  const Located at = Find(key, dtype, chunk);
  const uint64_t n = at.chunk_bytes;
  Digest digest(dtype, false, chunk.block_bytes);
  uint64_t read = 0;
  if (n > 0 && at.contiguous) {
    if (!m.hasher) m.hasher = std::make_unique<FileHasher>(m.fd.get(), m.path);
    m.hasher->Hash(at.base, n, digest, {}, m.Where(key, chunk));
    read = n;
  } else if (n > 0) {  // compressed: decompressed whole
    std::vector<unsigned char> tmp(static_cast<std::size_t>(n));
    read = ReadRaw(at, key, dtype, chunk, chunk.box, tmp.data(), chunk.box, &digest);
  }
  CheckDigest(digest, chunk, n, chunk.block_bytes ? m.Chunk(key, chunk) : m.Where(key, chunk));
  return read;
}

uint64_t ShardReader::ReadRaw(const Located& at, const std::string& key, DType dtype, const ChunkMeta& chunk,
                              const Box& region, void* dst, const Box& dst_box, Digest* digest) {
  Impl& m = *impl_;
  const std::size_t item = DTypeSize(dtype);
  if (at.chunk_bytes == 0 || region.NumElements() == 0) return 0;
  if (at.contiguous) return ReadContiguous(chunk, at.base, at.chunk_bytes, item, region, dst, dst_box, digest);

  // Chunked / filtered: HDF5 selects and decompresses.
  auto* out = static_cast<unsigned char*>(dst);
  const int r = static_cast<int>(region.sizes.size());
  h5::Handle fspace = h5::Space(H5Scopy(at.space.get()));
  std::vector<hsize_t> count(region.sizes.begin(), region.sizes.end());
  std::vector<hsize_t> fstart(r), mstart(r);
  for (int d = 0; d < r; ++d) {
    fstart[d] = static_cast<hsize_t>(region.offsets[d] - chunk.box.offsets[d]);
    mstart[d] = static_cast<hsize_t>(region.offsets[d] - dst_box.offsets[d]);
  }
  h5::Handle mspace = h5::MakeSpace(std::vector<hsize_t>(dst_box.sizes.begin(), dst_box.sizes.end()));
  if (r > 0) {
    h5::Check(H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, fstart.data(), nullptr, count.data(), nullptr),
              "H5Sselect_hyperslab");
    h5::Check(H5Sselect_hyperslab(mspace.get(), H5S_SELECT_SET, mstart.data(), nullptr, count.data(), nullptr),
              "H5Sselect_hyperslab");
  }
  if (H5Dread(at.ds.get(), at.type.get(), mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0) {
    throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": cannot read data" + h5::ErrorStack());
  }
  if (digest) {
    layout::ForEachRun(chunk.box, dst_box, region, [&](const layout::Run& run) {
      digest->Update(out + run.dst * item, static_cast<std::size_t>(run.count) * item);
    });
  }
  return H5Dget_storage_size(at.ds.get());
}

uint64_t ShardReader::ReadBlocks(const Located& at, const std::string& key, DType dtype, const ChunkMeta& chunk,
                                 const Box& region, void* dst, const Box& dst_box) {
  Impl& m = *impl_;
  const std::size_t item = DTypeSize(dtype);
  const uint64_t n = at.chunk_bytes;
  auto* out = static_cast<unsigned char*>(dst);
  std::vector<ByteRun> runs;
  runs.reserve(static_cast<std::size_t>(std::min<int64_t>(layout::CountRuns(chunk.box, dst_box, region), 1 << 20)));
  layout::ForEachRun(chunk.box, dst_box, region, [&](const layout::Run& run) {
    runs.push_back({static_cast<uint64_t>(run.src) * item, static_cast<uint64_t>(run.count) * item, out + run.dst * item});
  });
  BlockReader::Fetch fetch;
  BlockReader::Bulk bulk;
  if (at.contiguous) {
    fetch = [&m, base = at.base](uint64_t from, uint64_t len, unsigned char* to) {
      ReadExact(m.fd.get(), to, static_cast<std::size_t>(len), base + from, m.path);
    };
    if (DirectReader* direct = m.Direct()) {
      bulk = [direct, base = at.base](uint64_t from, uint64_t len, unsigned char* to,
                                      const DirectReader::Sink& sink) {
        direct->Read(to, static_cast<std::size_t>(len), base + from, sink);
      };
    }
  } else {
    // Through HDF5: exactly the elements of the byte range (blocks end on elements: a block
    // is a power of two of at least 4 KiB, an element 1..8 bytes).
    const std::vector<hsize_t> dims(chunk.box.sizes.begin(), chunk.box.sizes.end());
    fetch = [&, dims](uint64_t from, uint64_t len, unsigned char* to) {
      h5::Handle fspace = h5::Space(H5Scopy(at.space.get()));
      SelectLinear(fspace.get(), dims, from / item, (from + len) / item);
      h5::Handle mspace = h5::MakeSpace({static_cast<hsize_t>(len / item)});
      if (H5Dread(at.ds.get(), at.type.get(), mspace.get(), fspace.get(), H5P_DEFAULT, to) < 0)
        throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": cannot read data" + h5::ErrorStack());
    };
  }
  BlockReader reader(m.Chunk(key, chunk), chunk, n, fetch, at.contiguous, m.bounce, bulk);
  reader.Read(runs);
  if (m.bounce.capacity() > kBounceBytes * 2) std::vector<unsigned char>().swap(m.bounce);
  return reader.bytes_read();
}

uint64_t ShardReader::ReadContiguous(const ChunkMeta& chunk, uint64_t base,
                                     uint64_t chunk_bytes, std::size_t item, const Box& region, void* dst,
                                     const Box& dst_box, Digest* digest) {
  Impl& m = *impl_;
  auto* out = static_cast<unsigned char*>(dst);
  uint64_t bytes_read = 0;
  // Bounce window over the chunk's bytes, for runs too small to pread one by one.
  uint64_t win_begin = 0, win_end = 0;
  const uint64_t chunk_end = chunk_bytes;
  layout::ForEachRun(chunk.box, dst_box, region, [&](const layout::Run& run) {
    const uint64_t src = static_cast<uint64_t>(run.src) * item;
    const std::size_t len = static_cast<std::size_t>(run.count) * item;
    unsigned char* to = out + run.dst * item;
    if (len >= kDirectRunBytes && m.Direct()) {  // direct: hashed as it is handed over
      DirectReader::Sink sink;
      if (digest) sink = [digest](const unsigned char* p, std::size_t k, std::size_t) { digest->Update(p, k); };
      m.Direct()->Read(to, len, base + src, sink);
      bytes_read += len;
      return;
    }
    if (len >= kDirectRunBytes && len <= kDigestBlock) {  // one block: read, then hash
      ReadExact(m.fd.get(), to, len, base + src, m.path);
      if (digest) digest->Update(to, len);
      bytes_read += len;
      return;
    }
    if (len > kDigestBlock) {
      // Block i+1 is read on a helper thread while block i is hashed here; the kernel is
      // asked to fetch further ahead so the disk never waits for either.
      uint64_t advised = 0;
      auto read_block = [&m, to, base, src, len](std::size_t pos) {
        ReadExact(m.fd.get(), to + pos, std::min(kDigestBlock, len - pos), base + src + pos, m.path);
      };
      std::future<void> reading = AsyncOrDeferred(read_block, 0);
      for (std::size_t pos = 0; pos < len; pos += kDigestBlock) {
        const std::size_t n = std::min(kDigestBlock, len - pos);
        if (advised < std::min<uint64_t>(len, pos + kReadAhead)) {
          const uint64_t until = std::min<uint64_t>(len, pos + 2 * kReadAhead);
          ::posix_fadvise(m.fd.get(), static_cast<off_t>(base + src + advised), static_cast<off_t>(until - advised),
                          POSIX_FADV_WILLNEED);
          advised = until;
        }
        reading.get();
        if (pos + n < len) reading = AsyncOrDeferred(read_block, pos + n);
        if (digest) digest->Update(to + pos, n);
      }
      bytes_read += len;
      return;
    }
    if (src < win_begin || src + len > win_end) {
      win_begin = src;
      win_end = std::min<uint64_t>(chunk_end, src + std::max(kBounceBytes, len));
      m.bounce.resize(static_cast<std::size_t>(win_end - win_begin));
      ReadExact(m.fd.get(), m.bounce.data(), m.bounce.size(), base + win_begin, m.path);
      bytes_read += m.bounce.size();
    }
    std::memcpy(to, m.bounce.data() + (src - win_begin), len);
    if (digest) digest->Update(to, len);
  });
  if (m.bounce.capacity() > kBounceBytes * 2) std::vector<unsigned char>().swap(m.bounce);
  return bytes_read;
}

}  // namespace ckpt::storage
