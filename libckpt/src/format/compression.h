// format/compression.h: a chunk's or tensor's compression member (FORMAT.md §6), one writer
// and one reader: absent or null for none, else {"codec": "zstd", "level": integer,
// "shuffle": true}.
#pragma once

#include "ckpt/metadata.h"
#include "format/json_text.h"
#include "format/json_value.h"
#include "format/names.h"

#include <algorithm>

namespace ckpt::format {

// Writes the member, if `c` is compressed.
void WriteCompression(internal::JsonObjectText& parent, const Compression& c);

// zstd's levels (FORMAT.md §6).
inline constexpr int kMinZstdLevel = -131072, kMaxZstdLevel = 22;

enum class CompressionFault {
  kNotObject,     // the member is not an object (nor null)
  kNoCodec,       // no "codec"
  kCodecType,     // "codec" is not a string
  kUnknownCodec,  // "codec" names no codec this library has
  kLevel,         // "level" is out of range (or, kStrict, not an integer)
};
// How "level" is read: kStrict, an integer in range; kInRange, an integer is checked and
// anything else ignored (the default level); kClamped, an integer is clamped into range.
enum class LevelRule { kStrict, kInRange, kClamped };

// Reads the member's value (`v`: not null). `fail(fault, value)` is called on the first
// problem, with the value at fault, and must throw.
template <class Fail>
Compression ReadCompression(const Json& v, LevelRule rule, Fail&& fail) {
  if (!v.is_object()) fail(CompressionFault::kNotObject, v);
  const auto codec = v.find(names::kCodec);
  if (codec == v.end()) fail(CompressionFault::kNoCodec, v);
  if (!codec->is_string()) fail(CompressionFault::kCodecType, *codec);
  if (codec->get_ref<const std::string&>() != names::kZstd) fail(CompressionFault::kUnknownCodec, *codec);
  Compression c;
  c.codec = Compression::Codec::kZstd;
  const auto level = v.find(names::kLevel);
  if (level == v.end()) return c;
  if (!level->is_number_integer()) {
    if (rule == LevelRule::kStrict) fail(CompressionFault::kLevel, *level);
    return c;
  }
  const double l = level->get<double>();  // compared as a double: no wrap-around
  if (rule == LevelRule::kClamped) {
    c.level = static_cast<int>(std::clamp<double>(l, kMinZstdLevel, kMaxZstdLevel));
  } else if (l < kMinZstdLevel || l > kMaxZstdLevel) {
    fail(CompressionFault::kLevel, *level);
  } else {
    c.level = static_cast<int>(l);
  }
  return c;
}

}  // namespace ckpt::format
