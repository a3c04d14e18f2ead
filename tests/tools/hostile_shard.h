// tests/tools/hostile_shard.h: turns one dataset of a ckpt shard into something the format
// does not allow, keeping its dtype, extent and values (so only the storage differs):
//   lz4       chunked with HDF5 filter 32004 (LZ4) applied: a stand-in filter of that id
//             is registered while writing and unregistered after, so a reader without it
//             would have to find a plugin
//   extlink   an external link to dataset "x" of `outside` (a new HDF5 file)
//   softlink  a soft link to the data moved to "/hidden"
//   vds       a virtual dataset whose source is dataset "x" of `outside`
//   external  a contiguous dataset whose bytes live in the raw file `outside`
// The shard index keeps its entry, without the data offset (the dataset has none), so
// readers locate it through HDF5; the caller records the index's new digest in metadata.json
// (ckpt_edit's RecordIndexDigest / record_index), so that readers get past the digest to the
// dataset itself. Test-only code over the HDF5 C API.
#pragma once

#include <hdf5.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace ckpt::testing {

namespace hostile_detail {

inline void Ok(long status, const char* what) {
  if (status < 0) throw std::runtime_error(std::string("hostile_shard: ") + what);
}

inline size_t PassThrough(unsigned, size_t, const unsigned[], size_t nbytes, size_t*, void**) { return nbytes; }

// Writes `data` as dataset "x" of a new HDF5 file `path`.
inline void WriteOutside(const std::string& path, hid_t type, hid_t space, const std::vector<unsigned char>& data) {
  const hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  Ok(f, "create outside file");
  const hid_t d = H5Dcreate2(f, "x", type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  Ok(d, "create outside dataset");
  Ok(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), "write outside dataset");
  H5Dclose(d);
  H5Fclose(f);
}

inline std::string ReadIndex(hid_t f) {
  const hid_t a = H5Aopen(f, "ckpt_shard_index", H5P_DEFAULT);
  Ok(a, "open ckpt_shard_index");
  const hid_t t = H5Aget_type(a);
  std::string text(H5Tget_size(t), '\0');
  Ok(H5Aread(a, t, text.data()), "read ckpt_shard_index");
  H5Tclose(t);
  H5Aclose(a);
  return text.substr(0, text.find('\0'));
}

inline void WriteIndex(hid_t f, const std::string& text) {
  Ok(H5Adelete(f, "ckpt_shard_index"), "delete ckpt_shard_index");
  const hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, text.size());
  const hid_t s = H5Screate(H5S_SCALAR);
  const hid_t a = H5Acreate2(f, "ckpt_shard_index", t, s, H5P_DEFAULT, H5P_DEFAULT);
  Ok(a, "create ckpt_shard_index");
  Ok(H5Awrite(a, t, text.data()), "write ckpt_shard_index");
  H5Aclose(a);
  H5Sclose(s);
  H5Tclose(t);
}

}  // namespace hostile_detail

inline void MakeHostileDataset(const std::string& shard, const std::string& name, const std::string& kind,
                               const std::string& outside) {
  using namespace hostile_detail;
  const hid_t f = H5Fopen(shard.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  Ok(f, "open shard");
  const hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  Ok(d, "open dataset");
  const hid_t type = H5Dget_type(d), space = H5Dget_space(d);
  std::vector<unsigned char> data(H5Tget_size(type) * static_cast<size_t>(H5Sget_simple_extent_npoints(space)) + 1);
  Ok(H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), "read dataset");
  H5Dclose(d);
  if (kind == "softlink") {
    Ok(H5Lmove(f, name.c_str(), f, "hidden", H5P_DEFAULT, H5P_DEFAULT), "move dataset");
    Ok(H5Lcreate_soft("/hidden", f, name.c_str(), H5P_DEFAULT, H5P_DEFAULT), "soft link");
  } else {
    Ok(H5Ldelete(f, name.c_str(), H5P_DEFAULT), "delete dataset");
  }
  const int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  bool write = true;
  const H5Z_class2_t lz4 = {H5Z_CLASS_T_VERS, 32004, 1, 1, "lz4 (test stand-in)", nullptr, nullptr, PassThrough};
  if (kind == "lz4") {
    Ok(H5Zregister(&lz4), "register stand-in filter");
    Ok(H5Pset_chunk(dcpl, rank, dims.data()), "set chunk");
    Ok(H5Pset_filter(dcpl, 32004, H5Z_FLAG_MANDATORY, 0, nullptr), "set filter");
  } else if (kind == "extlink") {
    WriteOutside(outside, type, space, data);
    Ok(H5Lcreate_external(outside.c_str(), "x", f, name.c_str(), H5P_DEFAULT, H5P_DEFAULT), "external link");
    write = false;
  } else if (kind == "vds") {
    WriteOutside(outside, type, space, data);
    const hid_t all = H5Scopy(space);
    H5Sselect_all(all);
    Ok(H5Pset_virtual(dcpl, all, outside.c_str(), "x", space), "set virtual");
    H5Sclose(all);
    write = false;
    const hid_t v = H5Dcreate2(f, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    Ok(v, "create virtual dataset");
    H5Dclose(v);
  } else if (kind == "external") {
    Ok(H5Pset_external(dcpl, outside.c_str(), 0, static_cast<hsize_t>(data.size() - 1)), "set external");
  } else if (kind != "softlink") {
    throw std::runtime_error("hostile_shard: unknown kind " + kind);
  }
  if (write && kind != "softlink") {
    const hid_t n = H5Dcreate2(f, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    Ok(n, "create dataset");
    Ok(H5Dwrite(n, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), "write dataset");
    H5Dclose(n);
  }
  // The index entry loses its data offset: the dataset has none in this file now.
  nlohmann::json index = nlohmann::json::parse(ReadIndex(f));
  for (auto& c : index["chunks"])
    if (c["dataset"] == name) c.erase("offset");
  WriteIndex(f, index.dump());
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Tclose(type);
  Ok(H5Fclose(f), "close shard");
  if (kind == "lz4") H5Zunregister(32004);
}

}  // namespace ckpt::testing
