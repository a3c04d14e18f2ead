// format/chunk_record.cc
#include "format/chunk_record.h"

#include "format/compression.h"
#include "format/names.h"
#include "format/stats.h"

namespace ckpt::format {

void WriteChunkMembers(internal::JsonObjectText& j, const ChunkMeta& c, ChunkForm form, bool with_box) {
  namespace n = names;
  const bool shard = form == ChunkForm::kShardIndex;
  if (with_box) {
    j.Name(n::kOffsets);
    j.Integers(c.box.offsets);
    j.Name(n::kSizes);
    j.Integers(c.box.sizes);
  }
  if (!shard) {
    j.Name(n::kFile);
    j.String(c.file);
  }
  j.Name(n::kDataset);
  j.String(c.dataset);
  if (shard && c.offset) {
    j.Name(n::kOffset);
    j.Integer(*c.offset);
  }
  if (shard && c.pack_offset) {
    j.Name(n::kPackOffset);
    j.Integer(*c.pack_offset);
  }
  if (!shard) {
    j.Name(n::kChecksum);
    j.String(c.checksum);
  }
  j.Name(n::kStoredBytes);
  j.Integer(c.stored_bytes);
  WriteCompression(j, c.compression);
  if (shard) {
    j.Name(n::kChecksum);
    j.String(c.checksum);
    j.Name(n::kBlockBytes);
    j.Integer(c.block_bytes);
    j.Name(n::kBlocks);
    j.String(c.blocks);
  }
  if (c.stats) WriteStats(j, *c.stats);
}

}  // namespace ckpt::format
