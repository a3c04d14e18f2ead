// format/names.h: every on-disk name and JSON key, spelled once (schemas/FORMAT.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::names {

// §2 directory layout
inline constexpr const char* kMetadataFile = "metadata.json";
inline constexpr const char* kTempInfix = ".ckpt-tmp-";
inline constexpr const char* kAsideInfix = ".ckpt-aside-";

// §3 metadata.json
inline constexpr const char* kFormat = "format";
inline constexpr const char* kFormatName = "ckpt";
inline constexpr const char* kFormatVersion = "format_version";
inline constexpr const char* kStateDictType = "state_dict_type";
inline constexpr const char* kWorldSize = "world_size";
inline constexpr const char* kLibraryVersion = "library_version";
inline constexpr const char* kCreated = "created";
inline constexpr const char* kMesh = "mesh";
inline constexpr const char* kUser = "user";
inline constexpr const char* kSaveTimings = "save_timings";  // §3.8
inline constexpr const char* kMode = "mode";
inline constexpr const char* kSync = "sync";    // the values of "mode"
inline constexpr const char* kAsync = "async";
inline constexpr const char* kSlowestRank = "slowest_rank";
inline constexpr const char* kFiles = "files";
inline constexpr const char* kName = "name";
inline constexpr const char* kRank = "rank";
inline constexpr const char* kBytes = "bytes";
inline constexpr const char* kEntries = "entries";
inline constexpr const char* kType = "type";
inline constexpr const char* kDType = "dtype";
inline constexpr const char* kShape = "shape";
inline constexpr const char* kChunks = "chunks";
inline constexpr const char* kOffsets = "offsets";
inline constexpr const char* kSizes = "sizes";
inline constexpr const char* kFile = "file";
inline constexpr const char* kDataset = "dataset";
inline constexpr const char* kChecksum = "checksum";
inline constexpr const char* kStoredBytes = "stored_bytes";
inline constexpr const char* kCompression = "compression";
inline constexpr const char* kCodec = "codec";
inline constexpr const char* kLevel = "level";
inline constexpr const char* kShuffle = "shuffle";
inline constexpr const char* kStats = "stats";
inline constexpr const char* kValue = "value";
inline constexpr const char* kSize = "size";
// §7.3 statistics
inline constexpr const char* kMin = "min";
inline constexpr const char* kMax = "max";
inline constexpr const char* kMean = "mean";
inline constexpr const char* kL2 = "l2";
inline constexpr const char* kNanCount = "nan_count";
inline constexpr const char* kInfCount = "inf_count";
inline constexpr const char* kFiniteCount = "finite_count";
// §3.8 save timings: each phase's figures
inline constexpr const char* kMedian = "median";
// §3 v2: layouts, shard-index digests, the document's own digest
inline constexpr const char* kLayout = "layout";
inline constexpr const char* kGrid = "grid";
inline constexpr const char* kStep = "step";
inline constexpr const char* kBase = "base";
inline constexpr const char* kStrides = "strides";
inline constexpr const char* kIndex = "index";
inline constexpr const char* kIndexOffset = "index_offset";  // §3.1 files[i]: the index text's place
inline constexpr const char* kIndexBytes = "index_bytes";
inline constexpr const char* kDigest = "digest";
// §7 v2: blocked checksums
inline constexpr const char* kBlockBytes = "block_bytes";
inline constexpr const char* kBlocks = "blocks";

// §5 HDF5 layout
inline constexpr const char* kShardIndexAttr = "ckpt_shard_index";
inline constexpr char kOffsetsSeparator = '@';  // §5.2: "<escaped key>@<o0>,<o1>,..."

// §5.2 The escaped key: `%` -> %25, `/` -> %2F, `@` -> %40, a leading `.` -> %2E. The
// escape character is escaped itself and the result never holds `@`, so a dataset name
// decodes to exactly one (key, offsets) pair: two keys never share a dataset (§9.6).
inline std::string EscapeKey(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (std::size_t i = 0; i < key.size(); ++i) {
    const char c = key[i];
    if (c == '%') out += "%25";
    else if (c == '/') out += "%2F";
    else if (c == kOffsetsSeparator) out += "%40";
    else if (c == '.' && i == 0) out += "%2E";
    else out += c;
  }
  return out;
}

// §5.2 The dataset of a chunk: the escaped key, plus "@o0,o1,..." unless the chunk is
// the whole tensor.
inline std::string DatasetName(std::string_view key, const std::vector<int64_t>& offsets, bool whole) {
  std::string name = EscapeKey(key);
  if (!whole) {
    name += kOffsetsSeparator;
    for (std::size_t d = 0; d < offsets.size(); ++d) {
      if (d) name += ',';
      name += std::to_string(offsets[d]);
    }
  }
  return name;
}
inline constexpr const char* kShardIndexFormat = "ckpt-shard";
// §5.5 a shard index record's own members
inline constexpr const char* kKey = "key";
inline constexpr const char* kOffset = "offset";       // the data's byte offset in the file
inline constexpr const char* kBytesDType = "bytes";    // the dtype of a bytes entry's record
// §5.7 packs: small chunks stored back to back in 1-D uint8 datasets ".ckpt_pack.<n>" (a
// name no escaped key can take: a key's leading `.` is escaped), each record naming its
// pack in `dataset` and its first byte in it in `pack_offset`.
inline constexpr const char* kPackPrefix = ".ckpt_pack.";
inline constexpr const char* kPackOffset = "pack_offset";
// A pack's name: kPackPrefix and a decimal number without leading zeros (FORMAT.md §5.7).
inline bool IsPackName(std::string_view name) {
  const std::string_view prefix = kPackPrefix;
  if (name.substr(0, prefix.size()) != prefix) return false;
  const std::string_view n = name.substr(prefix.size());
  if (n.empty() || n.size() > 20 || (n.size() > 1 && n[0] == '0')) return false;
  for (const char c : n)
    if (c < '0' || c > '9') return false;
  return true;
}
inline constexpr const char* kDTypeAttr = "dtype";

// §6 compression
inline constexpr unsigned kZstdFilterId = 32015;
inline constexpr const char* kZstd = "zstd";

// §7 checksums
inline constexpr const char* kChecksumPrefix = "xxh3-64:";

}  // namespace ckpt::names
