// ckpt/metadata.h: the in-memory form of metadata.json (schemas/FORMAT.md §3).
//
// Pure data plus (de)serialisation: no files, no HDF5. The tools and the library read
// and write checkpoints through this model.
//
// Threading: a Metadata is a plain value (copies carry their index along). No const
// member function modifies it, so any number of threads may read one Metadata at once
// while none modifies it.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ckpt/dtype.h"
#include "ckpt/tensor.h"

namespace ckpt {

// Writers write version 2 (schemas/FORMAT.md); readers read 1 and 2.
inline constexpr int kFormatVersion = 2;
inline constexpr int kOldestFormatVersion = 1;

enum class StateDictType { kFull, kSharded, kLocal };
CKPT_API std::string_view StateDictTypeName(StateDictType type);  // "FULL", "SHARDED", "LOCAL"
CKPT_API std::optional<StateDictType> StateDictTypeFromName(std::string_view name);

// Statistics of a floating chunk, recorded at save in the same pass as the checksum.
// min/max/mean/l2 ignore NaN and Inf elements.
struct ChunkStats {
  double min = 0, max = 0, mean = 0, l2 = 0;
  int64_t nan_count = 0, inf_count = 0;
  int64_t finite_count = 0;  // elements that min/max/mean/l2 cover
};

// The statistics of a whole made of parts, from theirs: counts, min and max exact, mean and
// l2 recombined from their sums. nullopt if `parts` is empty or any part is null.
CKPT_API std::optional<ChunkStats> CombineStats(const std::vector<const ChunkStats*>& parts);

// CombineStats one part at a time: Result() after Add(p1)..Add(pn) equals
// CombineStats({p1, .., pn}), bit for bit.
class CKPT_API StatsAccumulator {
 public:
  void Add(const ChunkStats* part);  // null: the result is nullopt
  std::optional<ChunkStats> Result() const;

  // The running state, for accumulators on several ranks to be reduced element-wise (sums
  // and counts added, min and max taken) and the result taken once from FromSums. The
  // reduced result equals CombineStats over all parts up to the order of the floating sums.
  struct Sums {
    double sum = 0, sumsq = 0;
    double min = std::numeric_limits<double>::infinity(), max = -std::numeric_limits<double>::infinity();
    int64_t nan_count = 0, inf_count = 0, finite_count = 0;
    int64_t parts = 0, missing = 0;  // parts added, and how many of them were null
  };
  Sums sums() const;
  static StatsAccumulator FromSums(const Sums& sums);

 private:
  ChunkStats out_;
  double sum_ = 0, sumsq_ = 0;
  int64_t parts_ = 0, missing_ = 0;
};

// Per-chunk storage filter chain. Empty means a contiguous, uncompressed dataset.
struct Compression {
  enum class Codec { kNone, kZstd } codec = Codec::kNone;
  int level = 3;
  friend bool operator==(const Compression&, const Compression&) = default;
};

// One stored piece of a tensor, or the blob of a bytes entry.
struct ChunkMeta {
  Box box;                 // global offsets and sizes (empty for bytes)
  std::string file;        // plain file name inside the checkpoint directory
  std::string dataset;     // HDF5 path of the dataset in that file
  std::string checksum;    // "xxh3-64:<16 hex digits>" over the raw little-endian bytes
  Compression compression;
  uint64_t stored_bytes = 0;  // bytes on disk (compressed size when compressed)
  std::optional<ChunkStats> stats;
  // Format v2 (FORMAT.md §7): the raw bytes are hashed in blocks of `block_bytes`; `blocks`
  // holds each block's XXH3-64 as 16 lowercase hex digits, in order, and `checksum` is the
  // XXH3-64 of those digests (8 bytes little-endian each). 0: a v1 chunk, whose checksum is
  // over the bytes themselves and which has no block digests.
  uint64_t block_bytes = 0;
  std::string blocks;
  std::optional<uint64_t> offset;  // v2: file offset of contiguous data (its shard index)
  // v2, a packed chunk (FORMAT.md §5.7): `dataset` names the shard's pack dataset that
  // holds the chunk's bytes, from byte `pack_offset` of it on (`offset` is then that byte's
  // file offset). Absent: the chunk is a dataset of its own.
  std::optional<uint64_t> pack_offset;
};

// How a tensor is cut into chunks and which file holds each (FORMAT.md §3.3): a grid
// described by its rule, so metadata grows with keys and files, not with chunks; or, for
// what is not a grid, the explicit list. A bytes entry is one explicit piece [0, size).
struct DimSplit {
  int64_t step = 0;            // parts of `step` elements, the last one shorter (sizes empty)
  std::vector<int64_t> sizes;  // else: explicit part sizes, summing to the extent
  friend bool operator==(const DimSplit&, const DimSplit&) = default;
};

struct TensorLayout {
  enum class Kind { kGrid, kChunks } kind = Kind::kChunks;
  // kGrid: one split per dimension; cells numbered row-major over the parts. Cell c is in
  // file `cell_files[c]` if cell_files is not empty, else file_base + sum(idx_d * file_strides[d]).
  std::vector<DimSplit> grid;
  int64_t file_base = 0;
  std::vector<int64_t> file_strides;
  std::vector<int32_t> cell_files;
  // kChunks: every chunk's box and file.
  struct Piece {
    Box box;
    int32_t file = 0;  // position in Metadata::files
    friend bool operator==(const Piece&, const Piece&) = default;
  };
  std::vector<Piece> pieces;
  friend bool operator==(const TensorLayout&, const TensorLayout&) = default;
};

struct CKPT_API EntryMeta {
  EntryKind kind = EntryKind::kTensor;
  DType dtype = DType::kFloat32;  // tensor, scalar
  Shape shape;                    // tensor
  // tensor: its chunks; bytes: exactly one. Always filled for a v1 checkpoint; for v2 filled
  // from the shard indexes when the metadata is resolved (Metadata::resolved), else empty.
  std::vector<ChunkMeta> chunks;
  TensorLayout layout;             // tensor, bytes: always set (v1: derived from chunks)
  std::optional<ChunkStats> stats;  // floating tensor: the aggregate over its chunks
  uint64_t stored_bytes = 0;        // tensor, bytes: the sum over its chunks
  Compression compression;          // tensor: that of its chunks (the first compressed one)
  uint64_t size = 0;              // bytes: blob length
  std::string value;              // scalar, json: the value as JSON text

  uint64_t TensorBytes() const;   // logical bytes of a tensor (shape x itemsize)
  // The number of chunks the layout holds, whether or not `chunks` is filled: a grid's
  // cells of non-zero volume; 1 for a tensor of zero volume.
  int64_t ChunkCount() const;
};

struct FileMeta {
  std::string name;
  int rank = 0;
  uint64_t bytes = 0;
  std::string index;  // v2: "xxh3-64:<hex>" of the shard's ckpt_shard_index text; v1: empty
  // Where that text lies in the file (FORMAT.md §3.1, OPTIONAL): its first byte and its
  // length; index_bytes 0: not recorded (a reader then reads the HDF5 attribute).
  uint64_t index_offset = 0;
  uint64_t index_bytes = 0;
};

// How long a save took, per phase, over its ranks (FORMAT.md §3.8). Seconds of wall time
// each rank measured; the ranks' values summarised as min, median (the mean of the two
// middle values for an even count) and max, with the rank that had the max.
struct PhaseTiming {
  double min = 0, median = 0, max = 0;
  int slowest_rank = 0;
  friend bool operator==(const PhaseTiming&, const PhaseTiming&) = default;
};

struct SaveTimings {
  bool async = false;  // SaveAsync (the write ran in the background) or Save
  // snapshot: copying the state into staging (SaveAsync; 0 for Save). plan: describing,
  // planning, checking replicas and distributing the plan. write: streaming the chunks
  // (hashing included). fsync: the shard's fsync. commit: from the end of the write until
  // the rank's timings are gathered (agreement, results gathered; rank 0: until the metadata
  // is assembled); the write and rename of metadata.json come after and are not in it.
  // blocked: how long the caller waited: SaveAsync's own time (a wait for a free slot, the
  // snapshot); for Save, the whole save up to where its commit phase ends.
  PhaseTiming snapshot, plan, write, fsync, commit, blocked;
  friend bool operator==(const SaveTimings&, const SaveTimings&) = default;
};

// The phases in the order metadata.json lists them, with their names there.
inline constexpr const char* kSavePhaseNames[] = {"snapshot", "plan", "write", "fsync", "commit", "blocked"};
inline PhaseTiming& SavePhase(SaveTimings& t, std::size_t i) {
  PhaseTiming* all[] = {&t.snapshot, &t.plan, &t.write, &t.fsync, &t.commit, &t.blocked};
  return *all[i];
}
inline const PhaseTiming& SavePhase(const SaveTimings& t, std::size_t i) {
  return SavePhase(const_cast<SaveTimings&>(t), i);
}

struct CKPT_API Metadata {
  int format_version = kFormatVersion;
  StateDictType state_dict_type = StateDictType::kSharded;
  int world_size = 1;
  std::string library_version;
  std::string created;     // ISO 8601 UTC
  std::string mesh;        // JSON text: device mesh and placements, "null" if none
  std::string user;        // JSON text: user metadata object
  std::vector<FileMeta> files;
  std::vector<std::pair<std::string, EntryMeta>> entries;  // in save order
  // Written by Save and SaveAsync (version 2); absent in older files and in what the
  // single-process writer and the tools write.
  std::optional<SaveTimings> save_timings;
  // Every entry's `chunks` filled (v1 always; v2 once the shard indexes were read).
  bool resolved = true;

  // The first entry named `key`, or nullptr. Looks the key up in the index over the
  // entries as they were at the last BuildIndex (ParseMetadata builds it), and searches
  // entries appended since then one by one.
  const EntryMeta* Find(std::string_view key) const;
  // Rebuilds the index over `entries`. REQUIRES: called after renaming or reordering
  // entries (Find could miss a key); after appending or removing, it makes Find fast again.
  void BuildIndex();

 private:
  // Hash index of `entries` by key: (hash, position + 1) slots, open addressing (metadata.cc).
  std::vector<std::pair<std::size_t, std::size_t>> index_;
  std::size_t indexed_ = 0;  // entries.size() when index_ was built
};

struct ParseLimits {
  std::size_t max_bytes = std::size_t{1} << 31;  // 2 GiB of JSON
  int max_depth = 64;
  int max_rank = 32;  // dimensions of a tensor
};

// Parses and validates metadata.json text. `source` names the file in errors.
// Rejects: invalid JSON, duplicate object keys, nesting deeper than limits, unknown
// format, a newer format_version, unknown dtypes, unsafe file names, negative or
// overflowing shapes, chunks outside their tensor, a chunk whose file is not listed.
// Throws kCorrupt / kUnsupported with `source` and the key in the message.
CKPT_API Metadata ParseMetadata(std::string_view text, std::string_view source = "metadata.json",
                       const ParseLimits& limits = {});
CKPT_API std::string SerializeMetadata(const Metadata& metadata);

// True if `name` is a plain file name: no separator, not "." or "..", no NUL, not empty.
CKPT_API bool IsSafeFileName(std::string_view name);

// Problems in how a tensor's chunks tile its shape: gaps, overlaps, out-of-bounds chunks.
// Empty when the chunks tile the shape exactly. Each message names the key and boxes.
CKPT_API std::vector<std::string> CheckTiling(std::string_view key, const EntryMeta& entry);

}  // namespace ckpt
