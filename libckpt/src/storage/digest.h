// storage/digest.h: the checksum (XXH3-64) and statistics of a chunk, computed in one
// streaming pass over its bytes (FORMAT.md §7).
//
// Threading: a Digest is used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "ckpt/dtype.h"
#include "ckpt/metadata.h"

namespace ckpt::storage {

class Digest {
 public:
  // Statistics are gathered for floating dtypes when `with_stats`.
  Digest(DType dtype, bool with_stats);
  ~Digest();
  Digest(const Digest&) = delete;
  Digest& operator=(const Digest&) = delete;

  // Feeds bytes in order. Pieces may split elements; statistics handle that.
  void Update(const void* data, std::size_t n);
  // "xxh3-64:<16 hex>".
  std::string Checksum() const;
  std::optional<ChunkStats> Stats() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// One-shot checksum of a buffer.
std::string ChecksumOf(const void* data, std::size_t n);

}  // namespace ckpt::storage
