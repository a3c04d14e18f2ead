// storage/zstd_filter.cc
#include "storage/zstd_filter.h"

#include <hdf5.h>
#include <zstd.h>

#include <cstdlib>

#include "format/names.h"

namespace ckpt::h5 {
namespace {

// HDF5 filter callback: compresses on write, decompresses on read (H5Z_FLAG_REVERSE).
// Returns the new size, or 0 on failure (HDF5's convention).
size_t ZstdFilter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[], size_t nbytes,
                  size_t* buf_size, void** buf) {
  if (flags & H5Z_FLAG_REVERSE) {
    const unsigned long long content = ZSTD_getFrameContentSize(*buf, nbytes);
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN ||
        content > (1ull << 40)) {
      return 0;
    }
    void* out = std::malloc(content ? content : 1);
    if (!out) return 0;
    const size_t got = ZSTD_decompress(out, content, *buf, nbytes);
    if (ZSTD_isError(got) || got != content) {
      std::free(out);
      return 0;
    }
    std::free(*buf);
    *buf = out;
    *buf_size = content ? content : 1;
    return got;
  }
  const int level = cd_nelmts > 0 ? static_cast<int>(cd_values[0]) : 3;
  const size_t bound = ZSTD_compressBound(nbytes);
  void* out = std::malloc(bound);
  if (!out) return 0;
  const size_t got = ZSTD_compress(out, bound, *buf, nbytes, level);
  if (ZSTD_isError(got)) {
    std::free(out);
    return 0;
  }
  std::free(*buf);
  *buf = out;
  *buf_size = bound;
  return got;
}

}  // namespace

const H5Z_class2_t& ZstdFilterClass() {
  static const H5Z_class2_t kClass = {
      H5Z_CLASS_T_VERS, static_cast<H5Z_filter_t>(names::kZstdFilterId), 1, 1, "zstd", nullptr,
      nullptr, ZstdFilter};
  return kClass;
}

}  // namespace ckpt::h5
