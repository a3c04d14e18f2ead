// format/compression.cc
#include "format/compression.h"

#include "format/names.h"

namespace ckpt::format {

void WriteCompression(internal::JsonObjectText& parent, const Compression& c) {
  if (c.codec != Compression::Codec::kZstd) return;
  parent.Name(names::kCompression);
  internal::JsonObjectText z = parent.Child();
  z.Name(names::kCodec);
  z.String(names::kZstd);
  z.Name(names::kLevel);
  z.Integer(c.level);
  z.Name(names::kShuffle);
  z.Raw("true");
  z.Close();
}

}  // namespace ckpt::format
