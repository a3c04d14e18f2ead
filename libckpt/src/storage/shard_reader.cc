// storage/shard_reader.cc
#include "storage/shard_reader.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <unordered_map>
#include <vector>

#include "format/checked.h"
#include "format/names.h"
#include "layout/box.h"
#include "storage/file_hasher.h"
#include "storage/fs.h"
#include "storage/h5.h"
#include "storage/shard_index.h"

namespace ckpt::storage {
namespace {

constexpr std::size_t kDirectRunBytes = std::size_t{256} << 10;  // pread runs this big directly
constexpr std::size_t kBounceBytes = std::size_t{16} << 20;      // else through a bounce buffer
constexpr std::size_t kDigestBlock = std::size_t{8} << 20;
// How far ahead of the block being read the kernel is asked to fetch, so the disk stays
// busy while a block is hashed and copied.
constexpr uint64_t kReadAhead = uint64_t{64} << 20;

std::string DimsString(const std::vector<hsize_t>& d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace

struct ShardReader::Impl {
  std::filesystem::path path;
  bool index_loaded = false;
  bool locate_by_index = true;  // chunks located through the index (else through HDF5)
  std::vector<ShardIndexEntry> entries;  // the shard index, when it parsed
  std::string index_error;               // why not, else
  ErrorCode index_error_code = ErrorCode::kCorrupt;
  std::unordered_map<std::string, const ShardIndexEntry*> index;  // by dataset, for the fast path
  Fd fd;
  uint64_t size = 0;
  h5::Handle file;
  std::vector<unsigned char> bounce;
  std::unique_ptr<FileHasher> hasher;  // over fd, made on first Hash

  std::string Where(const std::string& key, const ChunkMeta& c) const {
    return path.filename().string() + ": tensor '" + key + "' chunk " + c.box.ToString() +
           " (dataset '" + c.dataset + "')";
  }
};

ShardReader::ShardReader(const Dir& dir, const std::string& file_name, bool use_index)
    : impl_(std::make_unique<Impl>()) {
  h5::Init();
  impl_->path = dir.path() / file_name;
  impl_->fd = OpenRegularFileAt(dir, file_name);
  impl_->size = FileSize(impl_->fd.get(), impl_->path);
  // HDF5 opens the very file checked above, whatever happens to the paths meanwhile.
  const hid_t id = H5Fopen(ProcPath(impl_->fd.get()).c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) {
    throw Error(ErrorCode::kCorrupt, impl_->path.string() + ": not a readable HDF5 file" + h5::ErrorStack());
  }
  impl_->file = h5::File(id);
  impl_->locate_by_index = use_index;
  if (use_index) LoadIndex();
}

void ShardReader::LoadIndex() {
  Impl& m = *impl_;
  if (m.index_loaded) return;
  m.index_loaded = true;
  const std::string where = m.path.string() + ": " + names::kShardIndexAttr;
  try {
    const std::string text = h5::ReadStringAttr(m.file.get(), names::kShardIndexAttr);
    if (text.empty()) {
      m.index_error = m.path.string() + ": HDF5 file without a " + names::kShardIndexAttr +
                      " attribute; not a ckpt shard";
      return;
    }
    m.entries = ParseShardIndex(text, where);
  } catch (const Error& e) {
    // A damaged or foreign index only disables the fast path (FORMAT.md §5.5).
    m.index_error = e.what();
    m.index_error_code = e.code();
    m.entries.clear();
    return;
  }
  // The index is trusted only in a shard whose root holds nothing but its own datasets: a
  // soft or external link (which the index cannot show) sends every read through HDF5,
  // where the dataset it names is checked and refused.
  if (!m.locate_by_index || !h5::ForeignLinks(m.file.get(), 1).empty()) return;
  for (const auto& e : m.entries)
    if (e.offset) m.index.emplace(e.dataset, &e);
}

const std::vector<ShardIndexEntry>& ShardReader::Index() {
  LoadIndex();
  if (!impl_->index_error.empty()) throw Error(impl_->index_error_code, impl_->index_error);
  return impl_->entries;
}

std::vector<std::pair<std::string, std::string>> ShardReader::ForeignLinks(std::size_t limit) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, type] : h5::ForeignLinks(impl_->file.get(), limit))
    out.emplace_back(name, impl_->path.filename().string() + ": " + h5::ForeignLinkMessage(name, type));
  return out;
}

ShardReader::~ShardReader() = default;
uint64_t ShardReader::file_size() const { return impl_->size; }
const std::filesystem::path& ShardReader::path() const { return impl_->path; }

// Where a chunk's data lies: through the shard index when it describes the chunk exactly,
// else by opening its dataset and checking its type, shape and extent against `chunk`.
struct ShardReader::Located {
  uint64_t chunk_bytes = 0;
  bool contiguous = false;
  uint64_t base = 0;  // file offset of the data when contiguous
  h5::Handle ds;      // open only when located through HDF5
  h5::Handle type, space;
};

ShardReader::Located ShardReader::Find(const std::string& key, DType dtype, const ChunkMeta& chunk) {
  Impl& m = *impl_;
  const std::size_t item = DTypeSize(dtype);
  Located at;
  at.chunk_bytes = static_cast<uint64_t>(
      internal::CheckedMul(chunk.box.NumElements(), static_cast<int64_t>(item), m.Where(key, chunk)));
  if (auto it = m.index.find(chunk.dataset); it != m.index.end() && chunk.compression.codec == Compression::Codec::kNone) {
    const ShardIndexEntry& d = *it->second;
    const bool same_type = d.bytes ? dtype == DType::kUInt8 : d.dtype == dtype;
    if (same_type && d.box.sizes == chunk.box.sizes && at.chunk_bytes > 0 && *d.offset <= m.size &&
        at.chunk_bytes <= m.size - *d.offset) {
      at.contiguous = true;
      at.base = *d.offset;
      return at;
    }
  }
  at.ds = h5::OpenOwnDataset(m.file.get(), chunk.dataset, m.Where(key, chunk));
  at.type = h5::Type(h5::Check(H5Dget_type(at.ds.get()), m.Where(key, chunk)));
  if (!h5::TypeMatches(at.type.get(), dtype)) {
    throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": stored element type (" +
                                         std::to_string(H5Tget_size(at.type.get())) +
                                         " bytes) does not match dtype " + std::string(DTypeName(dtype)));
  }
  at.space = h5::Space(h5::Check(H5Dget_space(at.ds.get()), m.Where(key, chunk)));
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
    at.contiguous = H5Pget_layout(dcpl.get()) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl.get()) == 0;
  }
  if (at.chunk_bytes == 0 || !at.contiguous) return at;
  if (base == HADDR_UNDEF || base > m.size || at.chunk_bytes > m.size - base) {
    throw Error(ErrorCode::kCorrupt, m.Where(key, chunk) + ": data lies past the end of the file (" +
                                         std::to_string(m.size) + " bytes): truncated");
  }
  at.base = base;
  return at;
}

std::optional<uint64_t> ShardReader::Locate(const std::string& key, DType dtype, const ChunkMeta& chunk) {
  const Located at = Find(key, dtype, chunk);
  if (!at.contiguous) return std::nullopt;
  return at.base;
}

void ShardReader::Hash(uint64_t offset, uint64_t n, Digest& digest) {
  Impl& m = *impl_;
  if (offset > m.size || n > m.size - offset) {
    throw Error(ErrorCode::kCorrupt, m.path.string() + ": " + std::to_string(n) + " bytes at offset " +
                                         std::to_string(offset) + " lie past the end of the file (" +
                                         std::to_string(m.size) + " bytes): truncated");
  }
  if (!m.hasher) m.hasher = std::make_unique<FileHasher>(m.fd.get(), m.path);
  m.hasher->Hash(offset, n, digest);
}

uint64_t ShardReader::Read(const std::string& key, DType dtype, const ChunkMeta& chunk, const Box& region,
                           void* dst, const Box& dst_box, Digest* digest) {
  Impl& m = *impl_;
  const std::size_t item = DTypeSize(dtype);
  const Located at = Find(key, dtype, chunk);
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
      std::future<void> reading = std::async(std::launch::async, read_block, 0);
      for (std::size_t pos = 0; pos < len; pos += kDigestBlock) {
        const std::size_t n = std::min(kDigestBlock, len - pos);
        if (advised < std::min<uint64_t>(len, pos + kReadAhead)) {
          const uint64_t until = std::min<uint64_t>(len, pos + 2 * kReadAhead);
          ::posix_fadvise(m.fd.get(), static_cast<off_t>(base + src + advised), static_cast<off_t>(until - advised),
                          POSIX_FADV_WILLNEED);
          advised = until;
        }
        reading.get();
        if (pos + n < len) reading = std::async(std::launch::async, read_block, pos + n);
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
