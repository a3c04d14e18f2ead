// storage/zstd_filter.h: the zstd HDF5 filter under its registered id 32015
// (FORMAT.md §6), so files we compress are readable by any HDF5 with the zstd plugin
// and files others compress are readable by us.
//
// The filter's code calls nothing in libhdf5 (only its types and macros): libckpt
// registers it (h5::Init), and the HDF5 filter plugin libckpt_h5zstd.so (zstd_plugin.cc,
// for h5dump, h5py and other HDF5 programs) hands the same class to whichever HDF5 loads it.
#pragma once

#include <hdf5.h>

namespace ckpt::h5 {
// The filter class: id 32015, name "zstd". cd_values as the registered filter's (and the
// standard plugin's, e.g. Python's hdf5plugin): cd_values[0], optional, is the compression
// level (default 3); decompression needs none.
const H5Z_class2_t& ZstdFilterClass();
}  // namespace ckpt::h5
