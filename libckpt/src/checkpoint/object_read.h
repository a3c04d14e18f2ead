// checkpoint/object_read.h: reading a checkpoint on S3-compatible object storage
// (s3://bucket/prefix/step) without HDF5 (issue 30 §3): one GET of metadata.json, one ranged
// GET of each shard index needed (files[i].index_offset / index_bytes, FORMAT.md §3.1),
// checked against files[i].index, then block-aligned ranged GETs of the bytes the wanted
// regions touch (adjacent ranges merged, run in parallel over the store's connections),
// every block checked against its digest (FORMAT.md §7) before a byte is handed out.
// Load and CheckpointReader take this path for an s3:// path (checkpoint/reader.h).
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/checkpoint.h"
#include "storage/object_store.h"

namespace ckpt::internal {

// The checkpoint's place on the store and its metadata, shared by the readers of one load.
struct ObjectSource {
  std::shared_ptr<storage::ObjectStore> store;
  std::string bucket;
  std::string prefix;  // the checkpoint's key prefix, no trailing '/' ("" at the bucket's root)
  std::string url;     // s3://bucket/prefix, for messages
  std::shared_ptr<const Metadata> metadata;
  uint64_t text_hash = 0;  // of metadata.json's text as opened
  std::unordered_map<std::string, const FileMeta*> files;  // by name

  // The object of `name`, a plain name inside the prefix (kCorrupt naming it otherwise).
  std::string Key(const std::string& name) const;
  // files[] by name; kCorrupt when metadata.json does not list it.
  const FileMeta& File(const std::string& name) const;
  // Called with the error of a read of an object metadata.json names (missing, shorter or
  // other than it says): when metadata.json is no longer the text this source opened, the
  // checkpoint was replaced or removed while reading (and the version read collected), and
  // this throws kChanged saying so; otherwise it returns and the caller rethrows.
  void ThrowIfChanged(const Error& e) const;
};

// Whether ranged GETs can read the whole checkpoint: version 2, every file's shard index
// placed (files[].index_offset), no compressed tensor. Load downloads the others.
bool ReadableByRanges(const Metadata& metadata);

// Opens the checkpoint at `url`: GETs and parses metadata.json (its digest checked), refusing
// a version-1 checkpoint (kUnsupported). `text_hash` as ReadMetadataAt's.
std::shared_ptr<const ObjectSource> OpenObjectSource(const std::string& url, const ObjectStoreOptions& options,
                                                     uint64_t* text_hash = nullptr);

// The shard index text of `file`, by one ranged GET, after checking the object's size (HEAD)
// against files[i].bytes; its digest is checked by the caller (ChunkCatalog). kUnsupported
// when files[i] records no index_offset (written before they were recorded).
std::string FetchIndexText(const ObjectSource& source, const FileMeta& file);

// Reads `region` of the stored chunk `chunk` of `key` into `dst` (a row-major buffer over
// `dst_box`), as ShardReader::Read does, from the object by ranged GETs of whole blocks; with
// `verify` every block fetched is checked against its digest (kCorrupt naming the object,
// the key, the chunk and the block). Returns the bytes fetched.
//
// `window` (optional, one per reader; used where its `spans` are set): a chunk of at most
// kWindowChunkBytes is served from a window of its object, fetched by one GET where the
// window does not hold it yet. The window covers the small chunks the load will read (its
// `spans`, by file) that follow this one with gaps under 256 KiB, up to kWindowBytes: small
// chunks (packed tensors, 0-D steps) lie back to back, so one GET serves many of them
// instead of one GET (a few ms of the server's CPU) each, and nothing else is fetched.
using ObjectSpans = std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>>;  // [begin, end), sorted
struct ObjectWindow {
  std::shared_ptr<const ObjectSpans> spans;
  std::string object;
  uint64_t begin = 0;  // the window's first byte in the object
  std::vector<unsigned char> bytes;
};
inline constexpr uint64_t kWindowChunkBytes = uint64_t{256} << 10;
inline constexpr uint64_t kWindowBytes = uint64_t{1} << 20;
uint64_t ReadObjectPart(const ObjectSource& source, const std::string& key, DType dtype, const ChunkMeta& chunk,
                        const Box& region, void* dst, const Box& dst_box, bool verify, ObjectWindow* window = nullptr);

// Tests: the store every s3:// read uses from now on instead of an S3Store made from the
// options (nullptr: back to that); returns the one set before.
std::shared_ptr<storage::ObjectStore> SetObjectStoreForTesting(std::shared_ptr<storage::ObjectStore> store);

}  // namespace ckpt::internal
