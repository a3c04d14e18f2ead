// storage/h5.cc
#include "storage/h5.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "format/names.h"
#include "storage/zstd_filter.h"

namespace ckpt::h5 {

namespace {

// Set when closing a file failed: HDF5 1.10 then holds a half-closed file that its own
// termination would close again and crash on (SIGSEGV at exit).
std::atomic<bool> close_failed{false};

}  // namespace

void Init() {
  static std::once_flag once;
  std::call_once(once, [] {
    // HDF5 terminates through Shutdown, not through its own exit handler (which would
    // crash on a file whose close failed). Must precede the first HDF5 call.
    H5dont_atexit();
    H5open();
    // No filter or VFD plugin is ever loaded from the machine's plugin directory: the
    // format names its filters (shuffle, zstd) and ckpt registers them itself.
    H5PLset_loading_state(0);
    RegisterZstdFilter();
    std::atexit(Shutdown);
  });
  // The thread-safe HDF5 keeps the error-printing switch per thread: silence every
  // thread that calls in (errors are captured into messages by ErrorStack()).
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
}

void Shutdown() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!close_failed.load()) H5close();
  });
}

std::mutex& BatchMutex() {
  static std::mutex mu;
  return mu;
}

void SetFixedMetadataCache(hid_t fapl, std::size_t bytes) {
  H5AC_cache_config_t mdc{};
  mdc.version = H5AC__CURR_CACHE_CONFIG_VERSION;
  Check(H5Pget_mdc_config(fapl, &mdc), "H5Pget_mdc_config");
  mdc.set_initial_size = true;
  mdc.initial_size = bytes;
  mdc.max_size = bytes;
  mdc.min_size = std::min<std::size_t>(mdc.min_size, bytes);
  mdc.incr_mode = H5C_incr__off;
  mdc.flash_incr_mode = H5C_flash_incr__off;
  mdc.decr_mode = H5C_decr__off;
  Check(H5Pset_mdc_config(fapl, &mdc), "H5Pset_mdc_config");
}

herr_t CloseFile(hid_t id) {
  const herr_t r = H5Fclose(id);
  if (r < 0) close_failed = true;
  return r;
}

std::string ErrorStack() {
  std::string messages;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
        auto* out = static_cast<std::string*>(data);
        if (n < 3 && err->desc && *err->desc) *out += std::string(n ? "; " : ": ") + err->desc;
        return 0;
      },
      &messages);
  H5Eclear2(H5E_DEFAULT);
  return messages;
}

Handle FileType(DType dtype) {
  switch (dtype) {
    case DType::kFloat64: return Type(H5Tcopy(H5T_IEEE_F64LE));
    case DType::kFloat32: return Type(H5Tcopy(H5T_IEEE_F32LE));
    case DType::kFloat16: {
      // The 2-byte IEEE half that h5py and numpy recognise as float16.
      Handle t = Type(H5Tcopy(H5T_IEEE_F32LE));
      Check(H5Tset_fields(t.get(), 15, 10, 5, 0, 10), "H5Tset_fields");
      Check(H5Tset_size(t.get(), 2), "H5Tset_size");
      Check(H5Tset_ebias(t.get(), 15), "H5Tset_ebias");
      return t;
    }
    case DType::kBFloat16: return Type(H5Tcopy(H5T_STD_U16LE));
    case DType::kFloat8E4M3FN:
    case DType::kFloat8E5M2:
    case DType::kFloat8E8M0FNU:
    case DType::kFloat4E2M1FNx2:
    case DType::kBool:
    case DType::kUInt8: return Type(H5Tcopy(H5T_STD_U8LE));
    case DType::kUInt16: return Type(H5Tcopy(H5T_STD_U16LE));
    case DType::kUInt32: return Type(H5Tcopy(H5T_STD_U32LE));
    case DType::kUInt64: return Type(H5Tcopy(H5T_STD_U64LE));
    case DType::kInt8: return Type(H5Tcopy(H5T_STD_I8LE));
    case DType::kInt16: return Type(H5Tcopy(H5T_STD_I16LE));
    case DType::kInt32: return Type(H5Tcopy(H5T_STD_I32LE));
    case DType::kInt64: return Type(H5Tcopy(H5T_STD_I64LE));
  }
  throw Error(ErrorCode::kInternal, "unknown dtype");
}

hid_t SharedFileType(DType dtype) {
  static const std::vector<hid_t> types = [] {
    Init();
    std::vector<hid_t> t;
    for (DType d : kAllDTypes) {
      Handle h = FileType(d);
      t.push_back(H5Tcopy(h.get()));
    }
    return t;
  }();
  return types[static_cast<std::size_t>(dtype)];
}

bool NeedsDTypeAttr(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat8E4M3FN || dtype == DType::kFloat8E5M2 ||
         dtype == DType::kFloat8E8M0FNU || dtype == DType::kFloat4E2M1FNx2 || dtype == DType::kBool;
}

bool TypeMatches(hid_t type, DType dtype) { return H5Tequal(type, SharedFileType(dtype)) > 0; }

Handle MakeSpace(const std::vector<hsize_t>& dims) {
  if (dims.empty()) return Space(Check(H5Screate(H5S_SCALAR), "H5Screate"));
  return Space(Check(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     "H5Screate_simple"));
}

void WriteStringAttr(hid_t obj, const char* name, const std::string& value) {
  Handle type = Type(H5Tcopy(H5T_C_S1));
  Check(H5Tset_size(type.get(), value.empty() ? 1 : value.size()), "H5Tset_size");
  Check(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "H5Tset_strpad");
  Handle space = Space(H5Screate(H5S_SCALAR));
  Handle attr = Attr(Check(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                           std::string("creating attribute ") + name));
  std::string buf = value.empty() ? std::string(1, '\0') : value;
  Check(H5Awrite(attr.get(), type.get(), buf.data()), std::string("writing attribute ") + name);
}

std::string ReadStringAttr(hid_t obj, const char* name) {
  if (H5Aexists(obj, name) <= 0) return {};
  Handle attr = Attr(Check(H5Aopen(obj, name, H5P_DEFAULT), std::string("opening attribute ") + name));
  Handle type = Type(Check(H5Aget_type(attr.get()), "H5Aget_type"));
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0) return {};
  const std::size_t size = H5Tget_size(type.get());
  if (size == 0 || size > (std::size_t{1} << 30)) return {};
  std::string buf(size, '\0');
  Check(H5Aread(attr.get(), type.get(), buf.data()), std::string("reading attribute ") + name);
  buf.resize(buf.find('\0') == std::string::npos ? buf.size() : buf.find('\0'));
  return buf;
}

std::string ForeignLinkMessage(const std::string& name, H5L_type_t type) {
  const char* kind = type == H5L_TYPE_SOFT       ? "a soft link"
                     : type == H5L_TYPE_EXTERNAL ? "an external link (to another file)"
                                                 : "a user-defined link";
  return "'" + name + "' is " + kind + ", not a dataset of its own; refused (a shard holds only its own datasets)";
}

std::vector<std::pair<std::string, H5L_type_t>> ForeignLinks(hid_t file, std::size_t limit) {
  struct Found {
    std::vector<std::pair<std::string, H5L_type_t>> links;
    std::size_t limit;
  } found{{}, limit};
  H5Literate(
      file, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr,
      [](hid_t, const char* name, const H5L_info_t* info, void* data) -> herr_t {
        auto* f = static_cast<Found*>(data);
        if (info->type != H5L_TYPE_HARD) f->links.emplace_back(name, info->type);
        return f->links.size() >= f->limit ? 1 : 0;
      },
      &found);
  ErrorStack();
  return std::move(found.links);
}

Handle TryOpenOwnDataset(hid_t file, const std::string& name, bool all_hard, std::string& problem) {
  // One link name: a path would be resolved through links of its own.
  if (name.empty() || name == "." || name.find('/') != std::string::npos) {
    problem = "'" + name + "' is not a dataset name of the root group";
    return Handle();
  }
  if (!all_hard) {
    H5L_info_t info;
    if (H5Lget_info(file, name.c_str(), &info, H5P_DEFAULT) < 0) {
      ErrorStack();
      problem = "dataset not found in the file";
      return Handle();
    }
    if (info.type != H5L_TYPE_HARD) {
      problem = ForeignLinkMessage(name, info.type);
      return Handle();
    }
  }
  const hid_t id = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (id < 0) {
    ErrorStack();
    const bool exists = !all_hard || H5Lexists(file, name.c_str(), H5P_DEFAULT) > 0;
    ErrorStack();
    problem = exists ? "'" + name + "' is not a readable dataset" : "dataset not found in the file";
    return Handle();
  }
  return Dataset(id);
}

Handle OpenOwnDataset(hid_t file, const std::string& name, const std::string& where) {
  std::string problem;
  Handle ds = TryOpenOwnDataset(file, name, /*all_hard=*/false, problem);
  if (!ds) throw Error(ErrorCode::kCorrupt, where + ": " + problem);
  return ds;
}

namespace {

// Names of filters a shard may be found with, for messages.
const char* FilterName(H5Z_filter_t id) {
  switch (id) {
    case H5Z_FILTER_DEFLATE: return "deflate";
    case H5Z_FILTER_SHUFFLE: return "shuffle";
    case H5Z_FILTER_FLETCHER32: return "fletcher32";
    case H5Z_FILTER_SZIP: return "szip";
    case H5Z_FILTER_NBIT: return "nbit";
    case H5Z_FILTER_SCALEOFFSET: return "scaleoffset";
    case 307: return "bzip2";
    case 32000: return "LZF";
    case 32001: return "Blosc";
    case 32004: return "LZ4";
    case 32008: return "bitshuffle";
    case 32013: return "ZFP";
    case 32015: return "zstd";
    default: return "unknown";
  }
}

}  // namespace

void CheckStorage(hid_t dcpl, const std::string& where) {
  const H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_VIRTUAL) {
    throw Error(ErrorCode::kCorrupt,
                where + ": a virtual dataset (its data would be read from other files); refused");
  }
  const int external = H5Pget_external_count(dcpl);
  if (external != 0) {
    throw Error(ErrorCode::kCorrupt,
                where + ": its data is stored in external files (" + std::to_string(external) + "); refused");
  }
  const int filters = H5Pget_nfilters(dcpl);
  if (filters < 0) throw Error(ErrorCode::kCorrupt, where + ": unreadable filter pipeline" + ErrorStack());
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    std::size_t nvalues = 0;
    const H5Z_filter_t id =
        H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nvalues, nullptr, 0, nullptr, &config);
    if (id == H5Z_FILTER_SHUFFLE || id == static_cast<H5Z_filter_t>(names::kZstdFilterId)) continue;
    throw Error(ErrorCode::kUnsupported, where + ": HDF5 filter " + std::to_string(id) + " (" + FilterName(id) +
                                         ") is not one the format allows (shuffle 2, zstd " +
                                         std::to_string(names::kZstdFilterId) + "); refused");
  }
}

std::string EscapeKey(const std::string& key) { return names::EscapeKey(key); }

std::string DatasetName(const std::string& key, const std::vector<int64_t>& offsets, bool whole) {
  return names::DatasetName(key, offsets, whole);
}

}  // namespace ckpt::h5
