// format/checksum.h: the checksum text "xxh3-64:<16 lowercase hex digits>" (FORMAT.md §7)
// and the block rule of v2 chunks.
#pragma once

#include <xxhash.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "ckpt/digest.h"
#include "format/names.h"

namespace ckpt::format {

inline bool IsLowerHex(std::string_view s) {
  for (const char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

inline bool IsChecksum(std::string_view s) {
  const std::string_view prefix = names::kChecksumPrefix;
  return s.size() == prefix.size() + 16 && s.substr(0, prefix.size()) == prefix && IsLowerHex(s.substr(prefix.size()));
}

// The checksum text of `hash`, and of XXH3-64 over `bytes` (a document's or index's digest).
inline std::string ChecksumText(uint64_t hash) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return std::string(names::kChecksumPrefix) + hex;
}
inline std::string DigestOf(std::string_view bytes) { return ChecksumText(XXH3_64bits(bytes.data(), bytes.size())); }

// §7: a v2 chunk's raw bytes are hashed in blocks of a power of two in [4 KiB, 64 MiB];
// the block count of a chunk of n bytes is ceil(n / block_bytes) (public: ckpt/digest.h).
using ckpt::BlockCount;
using ckpt::kMaxBlockBytes;
using ckpt::kMinBlockBytes;

}  // namespace ckpt::format
