// format/names.h: every on-disk name and JSON key, spelled once (schemas/FORMAT.md).
#pragma once

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

// §5 HDF5 layout
inline constexpr const char* kShardIndexAttr = "ckpt_shard_index";
inline constexpr const char* kShardIndexFormat = "ckpt-shard";
inline constexpr const char* kDTypeAttr = "dtype";

// §6 compression
inline constexpr unsigned kZstdFilterId = 32015;
inline constexpr const char* kZstd = "zstd";

// §7 checksums
inline constexpr const char* kChecksumPrefix = "xxh3-64:";

}  // namespace ckpt::names
