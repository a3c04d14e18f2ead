// storage/h5.cc
#include "storage/h5.h"

#include <mutex>
#include <vector>

#include "format/names.h"
#include "storage/zstd_filter.h"

namespace ckpt::h5 {

void Init() {
  static std::once_flag once;
  std::call_once(once, [] {
    H5open();
    RegisterZstdFilter();
  });
  // The thread-safe HDF5 keeps the error-printing switch per thread: silence every
  // thread that calls in (errors are captured into messages by ErrorStack()).
  thread_local bool silenced = false;
  if (!silenced) {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    silenced = true;
  }
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
    case DType::kBool:
    case DType::kUInt8: return Type(H5Tcopy(H5T_STD_U8LE));
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
         dtype == DType::kBool;
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

std::string EscapeKey(const std::string& key) { return names::EscapeKey(key); }

std::string DatasetName(const std::string& key, const std::vector<int64_t>& offsets, bool whole) {
  return names::DatasetName(key, offsets, whole);
}

}  // namespace ckpt::h5
