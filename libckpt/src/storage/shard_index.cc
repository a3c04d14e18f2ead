// storage/shard_index.cc
#include "storage/shard_index.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "ckpt/error.h"

namespace ckpt::storage {

void ShardIndexBuilder::Add(const ShardIndexEntry& e) { Add(e.key, e.bytes, e.dtype, e.shape, e.chunk); }

void ShardIndexBuilder::Add(const std::string& key, bool bytes, DType dtype, const Shape& shape, const ChunkMeta& c) {
  if (any_) chunks_ += ',';
  any_ = true;
  format::AppendShardRecord(chunks_, key, bytes, dtype, shape, c);
  if (!spill_dir_.empty() && chunks_.size() >= kSpillBytes) Spill();
}

void ShardIndexBuilder::Spill() {
  const fs::path what = spill_dir_ / "(shard index spill)";
  if (!spill_) {
    const int fd = Fs().Open(spill_dir_, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
      const int err = errno;
      if (err == EOPNOTSUPP || err == EISDIR || err == EINVAL) {  // no unnamed files here: keep it in memory
        spill_dir_.clear();
        return;
      }
      throw Error(ErrorCode::kIO,
                  spill_dir_.string() + ": creating a temporary file for the shard index: " + std::strerror(err));
    }
    spill_ = Fd(fd);
  }
  WriteExact(spill_.get(), chunks_.data(), chunks_.size(), spilled_, what);
  spilled_ += chunks_.size();
  chunks_.clear();
}

std::string ShardIndexBuilder::Finish() {
  std::string text = format::ShardIndexHead();
  if (spilled_ > 0) {
    const std::size_t at = text.size();
    text.resize(at + static_cast<std::size_t>(spilled_));
    ReadExact(spill_.get(), text.data() + at, static_cast<std::size_t>(spilled_), 0,
              spill_dir_ / "(shard index spill)");
    spill_.Close(spill_dir_ / "(shard index spill)");
    spilled_ = 0;
  }
  text += chunks_;
  std::string().swap(chunks_);
  text += format::kShardIndexTail;
  return text;
}

}  // namespace ckpt::storage
