// checkpoint/object_read.cc
#include "checkpoint/object_read.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/object_save.h"
#include "ckpt/config.h"
#include "format/names.h"
#include "layout/box.h"
#include "storage/digest.h"
#include "storage/pool.h"
#include "storage/shard_index.h"
#if CKPT_HAVE_S3
#include "storage/s3_config.h"
#include "storage/s3_store.h"
#endif

namespace ckpt::internal {
namespace {

// A shard index larger than this is refused before it is fetched (an HDF5 string attribute
// of ckpt's is bounded likewise when read locally).
constexpr uint64_t kMaxIndexBytes = uint64_t{1} << 30;
// Ranges of blocks closer than this are fetched as one request (the blocks between are
// fetched and checked too): per request costs ~4 ms here, tens on a real S3.
constexpr uint64_t kMergeGapBytes = uint64_t{256} << 10;
// One request fetches at most this much; a chunk's pieces are fetched this many at a time.
constexpr uint64_t kPieceBytes = uint64_t{8} << 20;
constexpr std::size_t kParallel = 8;

std::mutex g_store_mu;
std::shared_ptr<storage::ObjectStore> g_store;  // SetObjectStoreForTesting

std::shared_ptr<storage::ObjectStore> MakeStore(const ObjectStoreOptions& o, const std::string& url) {
  {
    std::lock_guard lock(g_store_mu);
    if (g_store) return g_store;
  }
#if CKPT_HAVE_S3
  return OpenObjectStore(o, url);
#else
  (void)o;
  (void)url;
  throw Error(ErrorCode::kUnsupported, "this libckpt was built without the S3 client (CKPT_WITH_S3=OFF)");
#endif
}

struct ByteRun {
  uint64_t src;  // byte of the chunk
  uint64_t len;
  unsigned char* to;
};

}  // namespace

std::shared_ptr<storage::ObjectStore> SetObjectStoreForTesting(std::shared_ptr<storage::ObjectStore> store) {
  std::lock_guard lock(g_store_mu);
  std::swap(g_store, store);
  return store;
}

bool ReadableByRanges(const Metadata& m) {
  if (m.format_version < 2) return false;
  for (const FileMeta& f : m.files) {
    if (f.index_bytes == 0) return false;
  }
  for (const auto& [key, e] : m.entries) {
    if (e.compression.codec != Compression::Codec::kNone) return false;
  }
  return true;
}

std::string ObjectSource::Key(const std::string& name) const {
  // metadata.json's parser refuses such names already (FORMAT.md §3.4); checked again here,
  // where a name becomes a key: nothing a checkpoint names lies outside its prefix.
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\\') != std::string::npos) {
    throw Error(ErrorCode::kCorrupt, url + "/" + names::kMetadataFile + ": files[] names '" + name +
                                         "', an object outside the checkpoint's prefix " + url + "/");
  }
  return prefix.empty() ? name : prefix + "/" + name;
}

void ObjectSource::ThrowIfChanged(const Error& e) const {
  ThrowIfCommitChanged(*store, bucket, prefix.empty() ? names::kMetadataFile : prefix + "/" + names::kMetadataFile, url,
                       text_hash, e);
}

const FileMeta& ObjectSource::File(const std::string& name) const {
  const auto it = files.find(name);
  if (it == files.end()) {
    throw Error(ErrorCode::kCorrupt, url + ": a chunk names the file '" + name + "', which files[] does not list");
  }
  return *it->second;
}

std::shared_ptr<const ObjectSource> OpenObjectSource(const std::string& url_in, const ObjectStoreOptions& options,
                                                     uint64_t* text_hash) {
#if CKPT_HAVE_S3
  const storage::s3::S3Url parsed = storage::s3::ParseS3Url(url_in);
#else
  (void)url_in;
  (void)text_hash;
  MakeStore(options, url_in);  // throws: no S3 client
  return nullptr;
#endif
#if CKPT_HAVE_S3
  auto src = std::make_shared<ObjectSource>();
  src->store = MakeStore(options, url_in);
  src->bucket = parsed.bucket;
  src->prefix = parsed.prefix;
  while (!src->prefix.empty() && src->prefix.back() == '/') src->prefix.pop_back();
  src->url = "s3://" + src->bucket + (src->prefix.empty() ? "" : "/" + src->prefix);
  const ParseLimits limits;
  const std::string meta_key = src->prefix.empty() ? names::kMetadataFile : src->prefix + "/" + names::kMetadataFile;
  std::vector<std::byte> body;
  try {
    body = src->store->Get(src->bucket, meta_key, limits.max_bytes);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kNotFound) throw;
    throw Error(ErrorCode::kNotFound,
                src->url + ": not a checkpoint (no metadata.json; an interrupted save never commits one)");
  }
  const std::string text(reinterpret_cast<const char*>(body.data()), body.size());
  body = {};
  src->text_hash = std::hash<std::string>{}(text);
  if (text_hash) *text_hash = src->text_hash;
  auto m = std::make_shared<Metadata>(ParseMetadata(text, src->url + "/" + names::kMetadataFile, limits));
  if (m->format_version < 2) {
    throw Error(ErrorCode::kUnsupported, src->url + ": a version " + std::to_string(m->format_version) +
                                             " checkpoint: reading one from object storage is not supported "
                                             "(its chunks have no block digests or offsets); download it and load "
                                             "the local copy");
  }
  src->metadata = m;
  for (const FileMeta& f : m->files) {
    src->Key(f.name);  // inside the prefix
    src->files.emplace(f.name, &f);
  }
  return src;
#endif
}

std::string FetchIndexText(const ObjectSource& s, const FileMeta& f) {
  const std::string key = s.Key(f.name);
  const std::string where = s.url + "/" + f.name;
  if (f.index_bytes == 0) {
    throw Error(ErrorCode::kUnsupported,
                where + ": metadata.json records no index_offset / index_bytes for it (saved before they were "
                        "recorded): reading its shard index from object storage needs them; download the "
                        "checkpoint and load the local copy, or save it again");
  }
  if (f.index_offset > f.bytes || f.index_bytes > f.bytes - f.index_offset) {
    throw Error(ErrorCode::kCorrupt, where + ": metadata.json places its index at byte " +
                                         std::to_string(f.index_offset) + ", " + std::to_string(f.index_bytes) +
                                         " bytes long, outside its " + std::to_string(f.bytes) + " bytes");
  }
  if (f.index_bytes > kMaxIndexBytes) {
    throw Error(ErrorCode::kCorrupt, where + ": index_bytes " + std::to_string(f.index_bytes) + " is more than " +
                                         std::to_string(kMaxIndexBytes) + " (refused before fetching)");
  }
  std::string text;
  try {
    const auto info = s.store->Head(s.bucket, key);
    if (!info) throw Error(ErrorCode::kCorrupt, where + ": the object metadata.json names is missing (" + key + ")");
    if (info->size != f.bytes) {
      throw Error(ErrorCode::kCorrupt, where + ": the object holds " + std::to_string(info->size) +
                                           " bytes, metadata.json says " + std::to_string(f.bytes));
    }
    text.assign(static_cast<std::size_t>(f.index_bytes), '\0');
    s.store->GetRange(s.bucket, key, f.index_offset,
                      std::span<std::byte>(reinterpret_cast<std::byte*>(text.data()), text.size()));
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kCorrupt || e.code() == ErrorCode::kNotFound) s.ThrowIfChanged(e);
    throw;
  }
  return text;
}

namespace {

struct Piece {
  uint64_t b0, b1;  // blocks [b0, b1) of a chunk, fetched by one request
};

// Refuses a chunk record that cannot be read by ranges, or that does not fit its object,
// before a byte of it is fetched. `n` is the chunk's bytes; `whole`, whether all of it is read.
void CheckRangedChunk(const FileMeta& f, const ChunkMeta& c, uint64_t n, bool whole, bool verify,
                      const std::string& what) {
  if (c.compression.codec != Compression::Codec::kNone) {
    throw Error(ErrorCode::kUnsupported, what + ": a compressed chunk; reading compressed chunks from object "
                                                "storage is not supported yet (save for s3:// without compression, "
                                                "or download the checkpoint)");
  }
  if (!c.offset || c.block_bytes == 0) {
    throw Error(ErrorCode::kCorrupt, what + ": its record gives no file offset or block digests");
  }
  const uint64_t b = c.block_bytes, at = *c.offset;
  if (at > f.bytes || n > f.bytes - at) {
    throw Error(ErrorCode::kCorrupt, what + ": its " + std::to_string(n) + " bytes at byte " + std::to_string(at) +
                                         " lie outside the object's " + std::to_string(f.bytes) + " bytes");
  }
  if (c.blocks.size() != storage::BlockCount(n, b) * 16) {
    throw Error(ErrorCode::kCorrupt, what + ": the index lists " + std::to_string(c.blocks.size() / 16) +
                                         " block digests for its " + std::to_string(n) + " bytes in blocks of " +
                                         std::to_string(b));
  }
  if (verify && whole && storage::ChecksumOfBlocks(c.blocks) != c.checksum) {
    throw Error(ErrorCode::kCorrupt, what + ": checksum mismatch: the index says " + c.checksum +
                                         ", the block digests hash to " + storage::ChecksumOfBlocks(c.blocks));
  }
}

// The whole blocks of size `b` that `runs` (sorted by their byte in the chunk) touch, ranges
// closer than kMergeGapBytes merged, cut into pieces of at most kPieceBytes.
std::vector<Piece> PiecesOf(const std::vector<ByteRun>& runs, uint64_t b) {
  std::vector<Piece> ranges;
  const uint64_t gap_blocks = kMergeGapBytes / b;
  for (const ByteRun& r : runs) {
    const uint64_t b0 = r.src / b, b1 = (r.src + r.len - 1) / b + 1;
    if (!ranges.empty() && b0 <= ranges.back().b1 + gap_blocks) {
      ranges.back().b1 = std::max(ranges.back().b1, b1);
    } else {
      ranges.push_back({b0, b1});
    }
  }
  const uint64_t per_piece = std::max<uint64_t>(1, kPieceBytes / b);
  std::vector<Piece> pieces;
  for (const Piece& r : ranges)
    for (uint64_t p = r.b0; p < r.b1; p += per_piece) pieces.push_back({p, std::min(r.b1, p + per_piece)});
  return pieces;
}

// One chunk's part being read from its object: where it lies, and what is copied out.
struct RangedChunk {
  const ObjectSource& s;
  const FileMeta& f;
  const ChunkMeta& c;
  std::string object;  // the object's key
  std::string what;    // names the chunk in errors
  uint64_t n = 0;      // the chunk's bytes
  uint64_t b = 0;      // its block size
  uint64_t at = 0;     // its first byte in the object
  bool verify = true;
  std::vector<ByteRun> runs;  // the region's byte runs, sorted by their byte in the chunk

  // The piece's bytes [from, to) of the chunk, at `data`: checked block by block, then the
  // runs' bytes among them copied out.
  void Consume(const Piece& piece, uint64_t from, uint64_t to, const unsigned char* data) const {
    if (verify) {
      for (uint64_t k = piece.b0; k < piece.b1; ++k) {
        const uint64_t len = std::min(b, n - k * b);
        const uint64_t got = storage::HashBlock(data + (k * b - from), static_cast<std::size_t>(len));
        const uint64_t want = storage::BlockDigestAt(c.blocks, static_cast<std::size_t>(k));
        if (got != want) {
          throw storage::BlockMismatch(what + " (object key '" + object + "', the chunk at byte " +
                                           std::to_string(at) + "):",
                                       k, b, n, want, got);
        }
      }
    }
    auto it = std::upper_bound(runs.begin(), runs.end(), from,
                               [](uint64_t v, const ByteRun& r) { return v < r.src + r.len; });
    for (; it != runs.end() && it->src < to; ++it) {
      const uint64_t lo = std::max(from, it->src), hi = std::min(to, it->src + it->len);
      std::memcpy(it->to + (lo - it->src), data + (lo - from), static_cast<std::size_t>(hi - lo));
    }
  }

  // A small chunk's one piece, served from `window`: refilled when it does not hold the
  // piece, from its first byte over the small chunks that follow (gaps under
  // kMergeGapBytes), up to kWindowBytes, never past the object's end. Returns bytes fetched.
  uint64_t ThroughWindow(const Piece& piece, ObjectWindow& window) const {
    const uint64_t from = piece.b0 * b, to = std::min(n, piece.b1 * b);
    uint64_t got = 0;
    if (window.object != object || at + from < window.begin || at + to > window.begin + window.bytes.size()) {
      const uint64_t start = at + from;
      uint64_t end = at + to;
      if (const auto it = window.spans->find(f.name); it != window.spans->end()) {
        const auto& spans = it->second;
        auto sp = std::upper_bound(spans.begin(), spans.end(), start,
                                   [](uint64_t v, const std::pair<uint64_t, uint64_t>& r) { return v < r.second; });
        for (; sp != spans.end() && sp->first <= end + kMergeGapBytes && sp->second <= f.bytes &&
               sp->second - start <= kWindowBytes;
             ++sp) {
          end = std::max(end, sp->second);
        }
      }
      window.object.clear();
      window.begin = start;
      window.bytes.resize(static_cast<std::size_t>(end - start));
      s.store->GetRange(s.bucket, object, window.begin,
                        std::span<std::byte>(reinterpret_cast<std::byte*>(window.bytes.data()), window.bytes.size()));
      window.object = object;
      got = window.bytes.size();
    }
    Consume(piece, from, to, window.bytes.data() + (at + from - window.begin));
    return got;
  }

  // Every piece by its own ranged GET, kParallel at a time. Returns bytes fetched.
  uint64_t Fetch(const std::vector<Piece>& pieces) const {
    std::atomic<uint64_t> fetched{0};
    std::atomic<std::size_t> next{0};
    std::atomic<bool> failed{false};
    std::mutex mu;
    std::exception_ptr first;
    auto work = [&] {
      std::vector<unsigned char> buf;
      try {
        for (std::size_t i; !failed && (i = next.fetch_add(1)) < pieces.size();) {
          const uint64_t from = pieces[i].b0 * b, to = std::min(n, pieces[i].b1 * b);
          buf.resize(static_cast<std::size_t>(to - from));
          s.store->GetRange(s.bucket, object, at + from,
                            std::span<std::byte>(reinterpret_cast<std::byte*>(buf.data()), buf.size()));
          fetched += to - from;
          Consume(pieces[i], from, to, buf.data());
        }
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
        failed = true;
      }
    };
    const std::size_t threads = std::min(kParallel, pieces.size());
    {
      auto helpers = storage::SpawnThreads(threads > 0 ? threads - 1 : 0, [&](std::size_t) { work(); });
      work();
    }
    if (first) {
      try {
        std::rethrow_exception(first);
      } catch (const Error& e) {  // the object gone (404) or other than indexed: replaced meanwhile?
        if (e.code() == ErrorCode::kCorrupt || e.code() == ErrorCode::kNotFound) s.ThrowIfChanged(e);
        throw;
      }
    }
    return fetched;
  }
};

}  // namespace

uint64_t ReadObjectPart(const ObjectSource& s, const std::string& key, DType dtype, const ChunkMeta& c,
                        const Box& region, void* dst, const Box& dst_box, bool verify, ObjectWindow* window) {
  const FileMeta& f = s.File(c.file);
  std::string what = s.url + "/" + f.name + ": tensor '" + key + "' chunk " + c.box.ToString();
  const std::size_t item = DTypeSize(dtype);
  const uint64_t n = static_cast<uint64_t>(c.box.NumElements()) * item;
  if (n == 0 || region.NumElements() == 0) return 0;
  CheckRangedChunk(f, c, n, region == c.box, verify, what);
  RangedChunk r{s, f, c, s.Key(f.name), std::move(what), n, c.block_bytes, *c.offset, verify, {}};
  auto* out = static_cast<unsigned char*>(dst);
  layout::ForEachRun(c.box, dst_box, region, [&](const layout::Run& run) {
    r.runs.push_back({static_cast<uint64_t>(run.src) * item, static_cast<uint64_t>(run.count) * item, out + run.dst * item});
  });
  std::sort(r.runs.begin(), r.runs.end(), [](const ByteRun& x, const ByteRun& y) { return x.src < y.src; });
  const std::vector<Piece> pieces = PiecesOf(r.runs, r.b);
  if (window && window->spans && r.n <= kWindowChunkBytes && pieces.size() == 1) return r.ThroughWindow(pieces[0], *window);
  return r.Fetch(pieces);
}

}  // namespace ckpt::internal
