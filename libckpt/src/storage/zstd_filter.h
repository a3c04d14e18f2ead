// storage/zstd_filter.h: the zstd HDF5 filter under its registered id 32015
// (FORMAT.md §6), so files we compress are readable by any HDF5 with the zstd plugin
// and files others compress are readable by us.
#pragma once

namespace ckpt::h5 {
void RegisterZstdFilter();
}
