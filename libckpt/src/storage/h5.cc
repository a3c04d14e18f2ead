// storage/h5.cc
#include "storage/h5.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
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
    // Registered whatever is there: asking H5Zfilter_avail first would search the plugin
    // directory, and no plugin may stand in for this filter.
    H5Zregister(&ZstdFilterClass());
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
  // From the caller's string itself (H5Awrite copies it): a shard index is about 270 bytes
  // a chunk, and a copy here was one more of them at the writer's peak (issue 32.6).
  static const char kNul = '\0';
  Check(H5Awrite(attr.get(), type.get(), value.empty() ? &kNul : value.data()),
        std::string("writing attribute ") + name);
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

void VisitRootLinks(hid_t file, const std::function<bool(const char*, const H5L_info_t&)>& visit) {
  // The links of a large root group are stored densely: a B-tree over the names' hashes,
  // visited in hash order, whose records point into a heap of link messages laid out in
  // creation order, so that each link read lands on a random heap block. With a small
  // metadata cache (ckpt's readers hold it at 1 MiB) nearly every one of them was a miss
  // that read and checksummed a whole heap block again (up to 64 KiB): a superlinear share
  // of a verify of 1,000,000 empty datasets (issue 32.6). For the pass the cache holds the
  // link index whole (about 30 bytes a link; the heap's blocks are each read once), and
  // then goes back to its size.
  H5G_info_t group{};
  H5AC_cache_config_t before{};
  before.version = H5AC__CURR_CACHE_CONFIG_VERSION;
  bool grown = false;
  if (H5Gget_info(file, &group) >= 0 && H5Fget_mdc_config(file, &before) >= 0) {
    constexpr std::size_t kPerLink = 48, kMaxBytes = std::size_t{1} << 30;
    const std::size_t want = std::min<std::size_t>(kMaxBytes, (std::size_t{1} << 20) + group.nlinks * kPerLink);
    if (want > before.max_size) {
      H5AC_cache_config_t wide = before;
      wide.set_initial_size = true;
      wide.initial_size = want;
      wide.max_size = want;
      wide.incr_mode = H5C_incr__off;
      wide.flash_incr_mode = H5C_flash_incr__off;
      wide.decr_mode = H5C_decr__off;
      grown = H5Fset_mdc_config(file, &wide) >= 0;
    }
  }
  ErrorStack();  // (cleared: without the wider cache the pass is only slower)
  H5Literate(
      file, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr,
      [](hid_t, const char* name, const H5L_info_t* info, void* data) -> herr_t {
        return (*static_cast<const std::function<bool(const char*, const H5L_info_t&)>*>(data))(name, *info) ? 0 : 1;
      },
      const_cast<std::function<bool(const char*, const H5L_info_t&)>*>(&visit));
  ErrorStack();
  if (grown) {
    before.set_initial_size = true;
    before.initial_size = std::min(before.max_size, std::max(before.min_size, before.initial_size));
    H5Fset_mdc_config(file, &before);
    ErrorStack();
  }
}

std::vector<std::pair<std::string, H5L_type_t>> ForeignLinks(hid_t file, std::size_t limit) {
  std::vector<std::pair<std::string, H5L_type_t>> links;
  if (limit == 0) return links;
  VisitRootLinks(file, [&](const char* name, const H5L_info_t& info) {
    if (info.type != H5L_TYPE_HARD) links.emplace_back(name, info.type);
    return links.size() < limit;
  });
  return links;
}

RawFile DescribeFile(hid_t file, int fd, uint64_t size) {
  RawFile raw;
  raw.fd = fd;
  raw.size = size;
  Handle fcpl = Plist(Check(H5Fget_create_plist(file), "H5Fget_create_plist"));
  std::size_t sizeof_addr = 0, sizeof_size = 0;
  hsize_t userblock = 0;
  Check(H5Pget_sizes(fcpl.get(), &sizeof_addr, &sizeof_size), "H5Pget_sizes");
  Check(H5Pget_userblock(fcpl.get(), &userblock), "H5Pget_userblock");
  raw.sizeof_addr = static_cast<unsigned>(sizeof_addr);
  raw.sizeof_size = static_cast<unsigned>(sizeof_size);
  raw.base = userblock;
  return raw;
}

namespace {

// Walks an object header (HDF5 file format specification, "Data Object Headers", versions
// 1 and 2) with ckpt's own bounds-checked reads. Only the message framing is parsed, and
// of the messages only the layout's version and class.
class HeaderWalk {
 public:
  explicit HeaderWalk(const RawFile& raw) : raw_(raw) {}

  std::string Run(haddr_t addr) {
    if (raw_.sizeof_addr < 2 || raw_.sizeof_addr > 8 || raw_.sizeof_size < 2 || raw_.sizeof_size > 8)
      return "unreadable object header (address size " + std::to_string(raw_.sizeof_addr) + ")";
    std::vector<unsigned char> prefix;
    if (!Fetch(addr, 16, prefix)) return problem_;
    if (prefix[0] == 1) {  // version 1: 16-byte prefix, messages 8-byte framed
      version_ = 1;
      const uint64_t len = Le(&prefix[8], 4);
      Queue(addr + 16, len);
    } else if (std::memcmp(prefix.data(), "OHDR", 4) == 0 && prefix[4] == 2) {
      version_ = 2;
      const unsigned flags = prefix[5];
      if (flags & ~0x3fu) return "unreadable object header (unknown flags)";
      order_ = (flags & 0x04) != 0;
      uint64_t at = 6 + ((flags & 0x20) ? 16 : 0) + ((flags & 0x10) ? 4 : 0);
      const unsigned width = 1u << (flags & 3);
      std::vector<unsigned char> size;
      if (!Fetch(addr + at, width, size)) return problem_;
      at += width;
      Queue(addr + at, Le(size.data(), width));  // its checksum follows the chunk
    } else {
      return "unreadable object header (neither version 1 nor 2)";
    }
    for (std::size_t i = 0; i < chunks_.size() && problem_.empty(); ++i) Walk(chunks_[i]);
    if (!problem_.empty()) return problem_;
    if (!layout_) return "unreadable object header (no layout message)";
    return "";
  }

 private:
  struct Span {
    uint64_t addr, len, trailer, skip;
  };
  static constexpr std::size_t kMaxChunks = 64;
  static constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 20;

  static uint64_t Le(const unsigned char* p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
    return v;
  }

  bool Fail(std::string why) {
    if (problem_.empty()) problem_ = "unreadable object header (" + std::move(why) + ")";
    return false;
  }

  // `n` bytes at HDF5 address `addr` (relative to the base), inside the file.
  bool Fetch(uint64_t addr, uint64_t n, std::vector<unsigned char>& out) {
    if (addr > raw_.size || raw_.base > raw_.size - addr || n > raw_.size - raw_.base - addr)
      return Fail("it lies past the end of the file");
    out.resize(static_cast<std::size_t>(n));
    const uint64_t at = raw_.base + addr;
    for (std::size_t got = 0; got < out.size();) {
      const ssize_t r = ::pread(raw_.fd, out.data() + got, out.size() - got, static_cast<off_t>(at + got));
      if (r <= 0) return Fail("cannot read it");
      got += static_cast<std::size_t>(r);
    }
    return true;
  }

  void Queue(uint64_t addr, uint64_t len, uint64_t trailer = 0, uint64_t skip = 0) {
    if (chunks_.size() >= kMaxChunks) {
      Fail("more than " + std::to_string(kMaxChunks) + " chunks");
      return;
    }
    if (len > kMaxChunkBytes || len < trailer + skip) {
      Fail("a chunk of " + std::to_string(len) + " bytes");
      return;
    }
    for (const Span& c : chunks_)
      if (c.addr == addr) return;  // a continuation loop: walked once
    chunks_.push_back({addr, len, trailer, skip});
  }

  void Walk(const Span& c) {
    std::vector<unsigned char> b;
    if (!Fetch(c.addr, c.len, b)) return;
    if (c.skip && std::memcmp(b.data(), "OCHK", 4) != 0) {
      Fail("a continuation chunk without its signature");
      return;
    }
    const std::size_t end = static_cast<std::size_t>(c.len - c.trailer);
    const std::size_t head = version_ == 1 ? 8 : (order_ ? 6 : 4);
    for (std::size_t pos = static_cast<std::size_t>(c.skip); pos + head <= end;) {
      unsigned type, flags;
      std::size_t size;
      if (version_ == 1) {
        type = static_cast<unsigned>(Le(&b[pos], 2));
        size = static_cast<std::size_t>(Le(&b[pos + 2], 2));
        flags = b[pos + 4];
      } else {
        type = b[pos];
        size = static_cast<std::size_t>(Le(&b[pos + 1], 2));
        flags = b[pos + 3];
      }
      const std::size_t data = pos + head;
      if (size > end - data) {
        Fail("a message runs past its chunk");
        return;
      }
      if (!Message(type, flags, &b[data], size)) return;
      pos = data + size;
    }
  }

  bool Message(unsigned type, unsigned flags, const unsigned char* p, std::size_t size) {
    switch (type) {
      case 0x07:  // external data files list
        problem_ = "its data is stored in external files; refused";
        return false;
      case 0x08: {  // data layout
        if (flags & 0x02) return Fail("a shared layout message");
        if (size < 3) return Fail("a short layout message");
        const unsigned version = p[0];
        if (version < 1 || version > 4) return Fail("layout message version " + std::to_string(version));
        const unsigned cls = version <= 2 ? p[2] : p[1];
        if (cls == 3) {
          problem_ = "a virtual dataset (its data would be read from other files); refused";
          return false;
        }
        if (cls > 2) return Fail("layout class " + std::to_string(cls));
        layout_ = true;
        return true;
      }
      case 0x10: {  // object header continuation
        if (size < raw_.sizeof_addr + raw_.sizeof_size) return Fail("a short continuation message");
        const uint64_t addr = Le(p, raw_.sizeof_addr);
        const uint64_t len = Le(p + raw_.sizeof_addr, raw_.sizeof_size);
        if (version_ == 1) Queue(addr, len);
        else Queue(addr, len, /*trailer=*/4, /*skip=*/4);
        return problem_.empty();
      }
      default: return true;
    }
  }

  const RawFile& raw_;
  int version_ = 0;
  bool order_ = false;  // v2: messages carry a creation order
  bool layout_ = false;
  std::vector<Span> chunks_;
  std::string problem_;
};

}  // namespace

std::string CheckObjectHeader(const RawFile& raw, haddr_t addr) {
  if (addr == HADDR_UNDEF) return "unreadable object header (no address)";
  return HeaderWalk(raw).Run(addr);
}

// Why refuse rather than isolate (issue 27): H5Dopen2 decodes the dataset's whole header
// (layout, datatype, dataspace, fill value, filter pipeline, external file list), and HDF5
// 1.10 has crashed there on a mutated virtual-dataset layout (tests/fuzz/corpus/shard/
// regress-virtual-layout-global-heap.h5). The format allows none of virtual layouts and
// external storage, so a header naming either is refused before HDF5 reads it, from ckpt's
// own bounds-checked walk of the message framing. This keeps each check in-process and
// cheap (a few hundred bytes read per dataset, no fork: ckpt-verify opens thousands of
// datasets, from several threads, and the fuzzers replay in-process) and names the file
// and dataset in an ordinary kCorrupt error. Reading untrusted shards through the shard
// index only would leave lone shards (no digest) and ckpt-verify's header checks
// unprotected; a child process per shard would cost a fork per file in multi-threaded
// callers, where a fork copies locks other threads hold.
Handle TryOpenOwnDataset(hid_t file, const RawFile& raw, const std::string& name, std::string& problem) {
  // One link name: a path would be resolved through links of its own.
  if (name.empty() || name == "." || name.find('/') != std::string::npos) {
    problem = "'" + name + "' is not a dataset name of the root group";
    return Handle();
  }
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
  return TryOpenOwnDatasetAt(file, raw, name, info.u.address, problem);
}

// By the address its hard link gave: a second lookup of the name (a walk of the root's
// link index, a miss in a small metadata cache when the root holds many links) is not made.
Handle TryOpenOwnDatasetAt(hid_t file, const RawFile& raw, const std::string& name, haddr_t addr,
                           std::string& problem) {
  if (std::string why = CheckObjectHeader(raw, addr); !why.empty()) {
    problem = "'" + name + "': " + why;
    return Handle();
  }
  const hid_t id = H5Oopen_by_addr(file, addr);
  if (id < 0 || H5Iget_type(id) != H5I_DATASET) {
    if (id >= 0) H5Oclose(id);
    ErrorStack();
    problem = "'" + name + "' is not a readable dataset";
    return Handle();
  }
  return Dataset(id);
}

Handle OpenOwnDataset(hid_t file, const RawFile& raw, const std::string& name, const std::string& where) {
  std::string problem;
  Handle ds = TryOpenOwnDataset(file, raw, name, problem);
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

std::vector<std::string> UnnamedHardLinks(hid_t file, const std::function<bool(const std::string&)>& named,
                                          std::size_t limit) {
  std::vector<std::string> names;
  if (limit == 0) return names;
  VisitRootLinks(file, [&](const char* name, const H5L_info_t& info) {
    if (info.type == H5L_TYPE_HARD && !named(name)) names.emplace_back(name);
    return names.size() < limit;
  });
  return names;
}

std::string EscapeKey(const std::string& key) { return names::EscapeKey(key); }

std::string DatasetName(const std::string& key, const std::vector<int64_t>& offsets, bool whole) {
  return names::DatasetName(key, offsets, whole);
}

}  // namespace ckpt::h5
