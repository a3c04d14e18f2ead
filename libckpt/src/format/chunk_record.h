// format/chunk_record.h: the chunk record, one chunk's description (FORMAT.md §3.2, §5.5),
// in the two places it stands: a version 1 metadata.json's chunk object (a tensor's chunks,
// a bytes entry's own members) and a shard index's record. One writer for both; the
// readers (format/metadata_reader.cc, format/shard_index.cc) share its members' codecs.
#pragma once

#include "ckpt/metadata.h"
#include "format/json_text.h"

namespace ckpt::format {

enum class ChunkForm {
  kMetadata,    // [offsets, sizes,] file, dataset, checksum, stored_bytes, compression, stats
  kShardIndex,  // [offsets, sizes,] dataset, offset, pack_offset, stored_bytes, compression,
                // checksum, block_bytes, blocks, stats
};

// Writes the chunk's members into `j` in the form's order; the box when `with_box`.
void WriteChunkMembers(internal::JsonObjectText& j, const ChunkMeta& c, ChunkForm form, bool with_box);

}  // namespace ckpt::format
