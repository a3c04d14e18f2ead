// storage/zstd_plugin.cc: libckpt_h5zstd.so, an HDF5 filter plugin (HDF5's dynamic plugin
// interface, H5PLextern.h) for filter 32015 (zstd), so that HDF5 programs outside ckpt
// (h5dump, h5ls, h5py, h5repack) read and write zstd chunks: Debian's hdf5-filter-plugin has
// no zstd. The filter is libckpt's own (zstd_filter.cc, built into this library too); the
// plugin needs libzstd only, not libhdf5, so it serves whichever HDF5 loads it. ckpt's own
// readers never load plugins (h5::Init): they register the same filter themselves.
#include <H5PLextern.h>

#include "storage/zstd_filter.h"

extern "C" {

H5PL_type_t H5PLget_plugin_type(void) { return H5PL_TYPE_FILTER; }

const void* H5PLget_plugin_info(void) { return &ckpt::h5::ZstdFilterClass(); }

}  // extern "C"
