// python/src/module.cc: ckpt._ckpt, the nanobind bindings of libckpt's public API.
//
// Thin on purpose: the Python package (python/ckpt/) turns state dicts into the flat entry
// lists taken here, so the C++ side only checks sizes and hands views of the caller's
// memory to libckpt. Arrays arrive as 1-D uint8 views of the caller's bytes (numpy through
// the buffer protocol, torch through DLPack) and are never copied; the GIL is released for
// the whole of a save, load or read. Built with ckpt::cuda (CKPT_PY_CUDA), save and load also
// take CUDA memory (DLPack's kDLCUDA): those chunks carry their device, and libckpt copies
// them through the CUDA backend, registered the first time one is met if none is.
//
// Entries (both directions), one tuple each:
//   ("tensor", key, dtype, shape, [(offsets, sizes, uint8 array), ...])
//   ("scalar", key, dtype, value)      value: int or float (load: the placeholder)
//   ("bytes",  key, data)              data: bytes (load: ignored)
//   ("json",   key, text)              text: JSON text (load: ignored)
// An s3:// path comes with `s3`: None, or the fields of ckpt.S3Options that are set, a dict
// of name -> str / int / bool (python/ckpt/_s3.py has checked their types): they fill
// ckpt::ObjectStoreOptions, the rest coming from the AWS environment as libckpt reads it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/ckpt.h"
#include "ckpt/device.h"
#if CKPT_PY_CUDA
#include "ckpt/cuda.h"
#endif

namespace nb = nanobind;

namespace {

using ReadOnlyBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using WritableBytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
// Save's and load's chunks: host memory or, with ckpt::cuda, CUDA memory.
using SaveBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig>;
using LoadBytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig>;

// Chunk::device of an array in DLPack device `type` / `id`.
int DeviceOf(const std::string& key, int32_t type, [[maybe_unused]] int32_t id) {
  if (type == nb::device::cpu::value) return ckpt::kHostDevice;
  if (type == nb::device::cuda::value) {
#if CKPT_PY_CUDA
    static std::mutex mu;
    std::lock_guard lock(mu);
    if (!ckpt::GetDeviceBackend()) ckpt::cuda::Register();
    return id;
#else
    throw ckpt::Error(ckpt::ErrorCode::kUnsupported,
                      "key '" + key + "': a CUDA tensor, and this build of ckpt has no CUDA backend (ckpt::cuda); "
                      "move it with .cpu()");
#endif
  }
  throw ckpt::Error(ckpt::ErrorCode::kUnsupported, "key '" + key + "': memory of DLPack device type " +
                                                       std::to_string(type) + "; ckpt reads and writes host memory" +
                                                       (CKPT_PY_CUDA ? " and CUDA memory" : ""));
}

ckpt::DType DTypeOf(const std::string& name) {
  auto d = ckpt::DTypeFromName(name);
  if (!d) throw ckpt::Error(ckpt::ErrorCode::kUnsupported, "dtype '" + name + "' is not one ckpt stores");
  return *d;
}

// A Comm over a Python object (ckpt.comm.ProcessGroupComm, or any object with the same
// methods): every collective calls back into Python with the GIL held. A Python exception
// becomes kComm, so libckpt's agreement protocol sees an ordinary failed collective.
class PyComm final : public ckpt::Comm {
 public:
  explicit PyComm(nb::object obj) : obj_(std::move(obj)) {
    nb::gil_scoped_acquire gil;
    rank_ = nb::cast<int>(obj_.attr("rank")());
    size_ = nb::cast<int>(obj_.attr("size")());
  }
  ~PyComm() override {
    nb::gil_scoped_acquire gil;
    obj_ = nb::object();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void Barrier() override {
    Call("barrier", [&] { obj_.attr("barrier")(); });
  }
  std::vector<ckpt::ByteBuffer> Gather(std::span<const uint8_t> mine, int root) override {
    std::vector<ckpt::ByteBuffer> out;
    Call("gather", [&] { out = Buffers(obj_.attr("gather")(ToBytes(mine), root)); });
    if (rank_ == root && out.size() != static_cast<std::size_t>(size_)) {
      throw ckpt::Error(ckpt::ErrorCode::kComm, "process group: gather returned " + std::to_string(out.size()) +
                                                    " buffers for " + std::to_string(size_) + " ranks");
    }
    return out;
  }
  void Broadcast(ckpt::ByteBuffer& buffer, int root) override {
    Call("broadcast", [&] {
      nb::object got = obj_.attr("broadcast")(ToBytes(buffer), root);
      buffer = ToBuffer(got);
    });
  }
  std::vector<ckpt::ByteBuffer> AllGather(std::span<const uint8_t> mine) override {
    std::vector<ckpt::ByteBuffer> out;
    Call("all_gather", [&] { out = Buffers(obj_.attr("all_gather")(ToBytes(mine))); });
    if (out.size() != static_cast<std::size_t>(size_)) {
      throw ckpt::Error(ckpt::ErrorCode::kComm, "process group: all_gather returned " +
                                                    std::to_string(out.size()) + " buffers");
    }
    return out;
  }
  std::unique_ptr<ckpt::Comm> Split(int color, int key) override {
    std::unique_ptr<ckpt::Comm> out;
    Call("split", [&] { out = std::make_unique<PyComm>(obj_.attr("split")(color, key)); });
    return out;
  }

 private:
  template <typename F>
  void Call(const char* what, F&& f) {
    nb::gil_scoped_acquire gil;
    try {
      f();
    } catch (nb::python_error& e) {
      throw ckpt::Error(ckpt::ErrorCode::kComm, std::string("process group ") + what + ": " + e.what());
    } catch (const nb::cast_error&) {
      throw ckpt::Error(ckpt::ErrorCode::kComm, std::string("process group ") + what + ": returned the wrong type");
    }
  }
  static nb::bytes ToBytes(std::span<const uint8_t> b) { return nb::bytes(b.data(), b.size()); }
  static ckpt::ByteBuffer ToBuffer(const nb::handle& h) {
    auto b = nb::cast<nb::bytes>(h);
    const auto* p = static_cast<const uint8_t*>(b.data());
    return ckpt::ByteBuffer(p, p + b.size());
  }
  static std::vector<ckpt::ByteBuffer> Buffers(const nb::object& list) {
    std::vector<ckpt::ByteBuffer> out;
    for (nb::handle h : list) out.push_back(ToBuffer(h));
    return out;
  }

  nb::object obj_;
  int rank_ = 0, size_ = 1;
};

// The Comm a call runs on: the Python object's, or a single process.
std::unique_ptr<ckpt::Comm> CommOf(const nb::object& comm) {
  if (comm.is_none()) return std::make_unique<ckpt::SingleComm>();
  return std::make_unique<PyComm>(comm);
}

ckpt::Compression CompressionOf(const std::optional<std::string>& codec, int level) {
  ckpt::Compression c;
  if (!codec || codec->empty() || *codec == "none") return c;
  if (*codec != "zstd") {
    throw ckpt::Error(ckpt::ErrorCode::kInvalidArgument, "compression '" + *codec + "': ckpt knows 'zstd' and 'none'");
  }
  c.codec = ckpt::Compression::Codec::kZstd;
  c.level = level;
  return c;
}

ckpt::StateDictType TypeOf(const std::string& name) {
  auto t = ckpt::StateDictTypeFromName(name);
  if (!t) throw ckpt::Error(ckpt::ErrorCode::kInvalidArgument, "state-dict type '" + name + "': FULL, SHARDED or LOCAL");
  return *t;
}

// ckpt::ObjectStoreOptions of ckpt.S3Options' fields that are set (None: none).
ckpt::ObjectStoreOptions S3Of(const nb::object& s3) {
  ckpt::ObjectStoreOptions o;
  if (s3.is_none()) return o;
  for (auto [k, v] : nb::cast<nb::dict>(s3)) {
    const auto name = nb::cast<std::string>(k);
    std::string* text = name == "endpoint"            ? &o.endpoint
                        : name == "region"            ? &o.region
                        : name == "profile"           ? &o.profile
                        : name == "access_key_id"     ? &o.access_key_id
                        : name == "secret_access_key" ? &o.secret_access_key
                        : name == "session_token"     ? &o.session_token
                        : name == "addressing"        ? &o.addressing
                        : name == "ca_bundle"         ? &o.ca_bundle
                                                      : nullptr;
    if (text) {
      *text = nb::cast<std::string>(v);
    } else if (name == "staging_dir") {
      o.staging_dir = nb::cast<std::string>(v);
    } else if (name == "part_bytes") {
      o.part_bytes = nb::cast<uint64_t>(v);
    } else if (name == "cache_max_bytes") {
      o.cache_max_bytes = nb::cast<uint64_t>(v);
    } else if (name == "leftover_grace_seconds") {
      o.leftover_grace_seconds = nb::cast<int64_t>(v);
    } else if (name == "upload_concurrency" || name == "max_attempts") {
      const auto n = nb::cast<int64_t>(v);
      if (n > 1 << 20) {
        throw ckpt::Error(ckpt::ErrorCode::kInvalidArgument, "ckpt.S3Options." + name + ": " + std::to_string(n) +
                                                                 " is more than 2^20");
      }
      (name == "max_attempts" ? o.max_attempts : o.upload_concurrency) = static_cast<int>(n);
    } else if (name == "single_writer") {
      o.single_writer = nb::cast<bool>(v);
    } else {
      throw ckpt::Error(ckpt::ErrorCode::kInvalidArgument, "ckpt.S3Options has no field '" + name + "'");
    }
  }
  return o;
}

// Bytes a chunk of `box` must hold; the array given must have exactly that many.
void CheckSize(const std::string& key, ckpt::DType dtype, const ckpt::Box& box, std::size_t nbytes) {
  const auto want = static_cast<uint64_t>(box.NumElements()) * ckpt::DTypeSize(dtype);
  if (want != nbytes) {
    throw ckpt::Error(ckpt::ErrorCode::kInvalidArgument,
                      "key '" + key + "': chunk " + box.ToString() + " of " + std::string(ckpt::DTypeName(dtype)) +
                          " needs " + std::to_string(want) + " bytes, the array has " + std::to_string(nbytes));
  }
}

ckpt::Scalar ScalarOf(ckpt::DType dtype, const nb::handle& value) {
  if (nb::isinstance<nb::float_>(value)) return ckpt::Scalar::Float(nb::cast<double>(value), dtype);
  return ckpt::Scalar::Int(nb::cast<int64_t>(value), dtype);
}

nb::object ScalarValue(const ckpt::Scalar& s) {
  if (std::holds_alternative<double>(s.value)) return nb::float_(std::get<double>(s.value));
  if (s.dtype == ckpt::DType::kBool) return nb::bool_(std::get<int64_t>(s.value) != 0);
  return nb::int_(std::get<int64_t>(s.value));
}

// Builds a StateDict over the arrays of `entries`. `Array` is the read-only view (save) or
// the writable one (load); the views are kept in `keep` so the memory stays alive.
template <typename Array>
ckpt::StateDict StateOf(const nb::list& entries, std::vector<Array>& keep) {
  ckpt::StateDict state;
  for (nb::handle item : entries) {
    auto t = nb::cast<nb::tuple>(item);
    const auto kind = nb::cast<std::string>(t[0]);
    auto key = nb::cast<std::string>(t[1]);
    if (kind == "tensor") {
      const ckpt::DType dtype = DTypeOf(nb::cast<std::string>(t[2]));
      auto shape = nb::cast<ckpt::Shape>(t[3]);
      std::vector<ckpt::Chunk> chunks;
      for (nb::handle c : nb::cast<nb::list>(t[4])) {
        auto ct = nb::cast<nb::tuple>(c);
        ckpt::Box box{nb::cast<ckpt::Shape>(ct[0]), nb::cast<ckpt::Shape>(ct[1])};
        auto array = nb::cast<Array>(ct[2], /*convert=*/false);
        CheckSize(key, dtype, box, array.nbytes());
        const int device = DeviceOf(key, array.device_type(), array.device_id());
        chunks.push_back(ckpt::Chunk{std::move(box), const_cast<uint8_t*>(array.data()), device});
        keep.push_back(std::move(array));
      }
      state.Add(std::move(key), ckpt::Tensor::Sharded(dtype, std::move(shape), std::move(chunks)));
    } else if (kind == "scalar") {
      state.Add(std::move(key), ScalarOf(DTypeOf(nb::cast<std::string>(t[2])), t[3]));
    } else if (kind == "bytes") {
      ckpt::Bytes b;
      if (!t[2].is_none()) {
        auto data = nb::cast<nb::bytes>(t[2]);
        const auto* p = static_cast<const uint8_t*>(data.data());
        b.data.assign(p, p + data.size());
      }
      state.Add(std::move(key), std::move(b));
    } else if (kind == "json") {
      state.Add(std::move(key), ckpt::Json{t[2].is_none() ? "null" : nb::cast<std::string>(t[2])});
    } else {
      throw ckpt::Error(ckpt::ErrorCode::kInternal, "entry kind '" + kind + "'");
    }
  }
  return state;
}

void Save(const std::string& path, const nb::list& entries, const nb::object& comm, const std::string& type,
          bool overwrite, bool check_replicas, const std::optional<std::string>& codec, int level,
          const std::string& user_metadata, const std::string& mesh, const nb::object& s3) {
  std::vector<SaveBytes> keep;
  ckpt::StateDict state = StateOf(entries, keep);
  ckpt::SaveOptions options;
  options.state_dict_type = TypeOf(type);
  options.overwrite = overwrite;
  options.check_replicas = check_replicas;
  options.compression = CompressionOf(codec, level);
  options.user_metadata = user_metadata;
  options.mesh = mesh;
  options.s3 = S3Of(s3);
  auto c = CommOf(comm);
  nb::gil_scoped_release release;
  ckpt::Save(path, state, *c, options);
}

ckpt::LoadOptions::DirectIo DirectIoOf(const std::string& mode) {
  if (mode == "off") return ckpt::LoadOptions::DirectIo::kOff;
  if (mode == "auto") return ckpt::LoadOptions::DirectIo::kAuto;
  if (mode == "on") return ckpt::LoadOptions::DirectIo::kOn;
  throw ckpt::Error(ckpt::ErrorCode::kInvalidArgument, "direct_io must be 'off', 'auto' or 'on', not '" + mode + "'");
}

// Returns (missing, unexpected, mismatched, bytes_read, bytes_read_direct, values): values
// maps each scalar, bytes and JSON key of `entries` to what the checkpoint holds.
nb::tuple Load(const std::string& path, const nb::list& entries, const nb::object& comm, const std::string& type,
               bool strict, bool verify, int io_threads, const std::string& direct_io, const nb::object& s3) {
  std::vector<LoadBytes> keep;
  ckpt::StateDict state = StateOf(entries, keep);
  ckpt::LoadOptions options;
  options.state_dict_type = TypeOf(type);
  options.strict = strict;
  options.verify_checksums = verify;
  if (io_threads > 0) options.io_threads = io_threads;  // 0: LoadOptions' default
  options.direct_io = DirectIoOf(direct_io);
  options.s3 = S3Of(s3);
  auto c = CommOf(comm);
  ckpt::LoadReport report;
  {
    nb::gil_scoped_release release;
    report = ckpt::Load(path, state, *c, options);
  }
  nb::dict values;
  for (const auto& [key, entry] : state) {
    if (const auto* s = std::get_if<ckpt::Scalar>(&entry)) {
      values[nb::str(key.c_str())] = ScalarValue(*s);
    } else if (const auto* b = std::get_if<ckpt::Bytes>(&entry)) {
      values[nb::str(key.c_str())] = nb::bytes(b->data.data(), b->data.size());
    } else if (const auto* j = std::get_if<ckpt::Json>(&entry)) {
      values[nb::str(key.c_str())] = nb::str(j->text.c_str(), j->text.size());
    }
  }
  return nb::make_tuple(report.missing_keys, report.unexpected_keys, report.mismatched, report.bytes_read,
                        report.bytes_read_direct, values);
}

nb::object StatsOf(const std::optional<ckpt::ChunkStats>& s) {
  if (!s) return nb::none();
  nb::dict d;
  d["min"] = s->min;
  d["max"] = s->max;
  d["mean"] = s->mean;
  d["l2"] = s->l2;
  d["nan_count"] = s->nan_count;
  d["inf_count"] = s->inf_count;
  d["finite_count"] = s->finite_count;
  return d;
}

const ckpt::EntryMeta& EntryOf(const ckpt::CheckpointReader& r, const std::string& key) {
  const ckpt::EntryMeta* e = r.metadata().Find(key);
  if (!e) throw ckpt::Error(ckpt::ErrorCode::kNotFound, r.dir().string() + ": no key '" + key + "'");
  return *e;
}

// ckpt.open's native half: one CheckpointReader.
class Reader {
 public:
  Reader(const std::string& path, bool resolve, const nb::object& s3) {
    const ckpt::ObjectStoreOptions options = S3Of(s3);
    nb::gil_scoped_release release;
    r_ = ckpt::CheckpointReader::Open(path, options, resolve);
  }
  std::string MetadataJson() const { return ckpt::SerializeMetadata(r_->metadata()); }
  // (key, kind, dtype, shape) of every entry, in save order.
  nb::list Entries() const {
    nb::list out;
    for (const auto& [key, e] : r_->metadata().entries) {
      out.append(nb::make_tuple(key, ckpt::EntryKindName(e.kind), ckpt::DTypeName(e.dtype), e.shape));
    }
    return out;
  }
  // (offsets, sizes, file) of every stored chunk of `key`.
  nb::list Chunks(const std::string& key) const {
    const auto& e = EntryOf(*r_, key);
    nb::list out;
    for (const auto& c : e.chunks) out.append(nb::make_tuple(c.box.offsets, c.box.sizes, c.file));
    return out;
  }
  nb::object Stats(const std::string& key) const { return StatsOf(EntryOf(*r_, key).stats); }
  nb::object ChunkStats(const std::string& key, std::size_t index) const {
    const auto& e = EntryOf(*r_, key);
    if (index >= e.chunks.size()) {
      throw ckpt::Error(ckpt::ErrorCode::kInvalidArgument, "key '" + key + "': no chunk " + std::to_string(index));
    }
    return StatsOf(e.chunks[index].stats);
  }
  nb::object Value(const std::string& key) const {
    const auto& e = EntryOf(*r_, key);
    if (e.kind != ckpt::EntryKind::kScalar && e.kind != ckpt::EntryKind::kJson) {
      throw ckpt::Error(ckpt::ErrorCode::kMismatch, "key '" + key + "' is a " +
                                                         std::string(ckpt::EntryKindName(e.kind)) +
                                                         ", not a scalar or JSON value");
    }
    return nb::str(e.value.c_str(), e.value.size());
  }
  void ReadRegion(const std::string& key, const ckpt::Shape& offsets, const ckpt::Shape& sizes, WritableBytes out,
                  bool verify) {
    const auto& e = EntryOf(*r_, key);
    ckpt::Box box{offsets, sizes};
    if (e.kind == ckpt::EntryKind::kTensor) CheckSize(key, e.dtype, box, out.nbytes());
    uint8_t* p = out.data();
    nb::gil_scoped_release release;
    r_->ReadRegion(key, box, p, verify);
  }
  nb::bytes ReadBytes(const std::string& key, bool verify) {
    std::vector<uint8_t> data;
    {
      nb::gil_scoped_release release;
      data = r_->ReadBytes(key, verify);
    }
    return nb::bytes(data.data(), data.size());
  }
  void VerifyChunk(const std::string& key, std::size_t index) {
    nb::gil_scoped_release release;
    r_->VerifyChunk(key, index);
  }
  uint64_t BytesRead() const { return r_->bytes_read(); }
  std::string Dir() const { return r_->dir().string(); }

 private:
  std::unique_ptr<ckpt::CheckpointReader> r_;
};

// The Writer's native half: one CheckpointWriter.
class Writer {
 public:
  Writer(const std::string& path, const std::string& type, int world_size, int num_files, bool overwrite,
         const std::optional<std::string>& codec, int level, const std::string& user_metadata,
         const std::string& mesh, const nb::object& s3) {
    ckpt::CheckpointWriter::Options o;
    o.state_dict_type = TypeOf(type);
    o.world_size = world_size;
    o.num_files = num_files;
    o.overwrite = overwrite;
    o.compression = CompressionOf(codec, level);
    o.user_metadata = user_metadata;
    o.mesh = mesh;
    o.s3 = S3Of(s3);
    w_ = ckpt::CheckpointWriter::Create(path, o);
  }
  void WriteChunk(const std::string& key, const std::string& dtype, const ckpt::Shape& shape,
                  const ckpt::Shape& offsets, const ckpt::Shape& sizes, ReadOnlyBytes data, int file_index) {
    const ckpt::DType d = DTypeOf(dtype);
    ckpt::Box box{offsets, sizes};
    CheckSize(key, d, box, data.nbytes());
    const uint8_t* p = data.data();
    nb::gil_scoped_release release;
    Live().WriteChunk(key, d, shape, box, p, file_index);
  }
  void WriteScalar(const std::string& key, const std::string& dtype, const nb::object& value) {
    Live().WriteScalar(key, ScalarOf(DTypeOf(dtype), value));
  }
  void WriteBytes(const std::string& key, const nb::bytes& data, int file_index) {
    Live().WriteBytes(key, std::span<const uint8_t>(static_cast<const uint8_t*>(data.data()), data.size()),
                      file_index);
  }
  void WriteJson(const std::string& key, const std::string& text) { Live().WriteJson(key, text); }
  // A failed commit drops the checkpoint too: the writer is done either way.
  std::string Commit() {
    ckpt::Metadata m;
    try {
      nb::gil_scoped_release release;
      m = Live().Commit();
    } catch (...) {
      w_.reset();
      throw;
    }
    w_.reset();
    return ckpt::SerializeMetadata(m);
  }
  // Drops an uncommitted checkpoint (its temporary directory is removed).
  void Abort() { w_.reset(); }
  bool Open() const { return w_ != nullptr; }

 private:
  ckpt::CheckpointWriter& Live() {
    if (!w_) throw ckpt::Error(ckpt::ErrorCode::kInvalidArgument, "writer: already committed or aborted");
    return *w_;
  }
  std::unique_ptr<ckpt::CheckpointWriter> w_;
};

// ckpt::Error -> ckpt.Error (python/ckpt/errors.py builds it: code name, file and key).
void TranslateError(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const ckpt::Error& e) {
    nb::object make = nb::module_::import_("ckpt.errors").attr("_from_native");
    nb::object exc = make(std::string(ckpt::ErrorCodeName(e.code())), std::string(e.what()));
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  }
}

}  // namespace

NB_MODULE(_ckpt, m) {
  m.doc() = "libckpt bindings (use the ckpt package, not this module)";
  nb::register_exception_translator(TranslateError);
  m.attr("version") = CKPT_VERSION_STRING;
  m.attr("format_version") = ckpt::kFormatVersion;
  m.attr("have_cuda") = static_cast<bool>(CKPT_PY_CUDA);
  m.attr("have_s3") = static_cast<bool>(CKPT_HAVE_S3);

  nb::list dtypes;
  for (ckpt::DType d : ckpt::kAllDTypes) dtypes.append(nb::make_tuple(ckpt::DTypeName(d), ckpt::DTypeSize(d)));
  m.attr("dtypes") = dtypes;

  m.def("save", &Save, nb::arg("path"), nb::arg("entries"), nb::arg("comm").none(), nb::arg("state_dict_type"),
        nb::arg("overwrite"), nb::arg("check_replicas"), nb::arg("compression").none(), nb::arg("level"),
        nb::arg("user_metadata"), nb::arg("mesh"), nb::arg("s3").none() = nb::none());
  m.def("load", &Load, nb::arg("path"), nb::arg("entries"), nb::arg("comm").none(), nb::arg("state_dict_type"),
        nb::arg("strict"), nb::arg("verify"), nb::arg("io_threads"), nb::arg("direct_io"),
        nb::arg("s3").none() = nb::none());
  m.def("read_metadata", [](const std::string& path, bool resolve, const nb::object& s3) {
    const ckpt::ObjectStoreOptions options = S3Of(s3);
    ckpt::Metadata md;
    {
      nb::gil_scoped_release release;
      // ReadMetadata reads a directory; an s3:// checkpoint's through a reader (one GET).
      md = path.rfind("s3://", 0) == 0 ? ckpt::CheckpointReader::Open(path, options, resolve)->metadata()
                                       : ckpt::ReadMetadata(path, resolve);
    }
    return ckpt::SerializeMetadata(md);
  }, nb::arg("path"), nb::arg("resolve") = false, nb::arg("s3").none() = nb::none());

  nb::class_<Reader>(m, "Reader")
      .def(nb::init<const std::string&, bool, const nb::object&>(), nb::arg("path"), nb::arg("resolve"),
           nb::arg("s3").none() = nb::none())
      .def("metadata_json", &Reader::MetadataJson)
      .def("entries", &Reader::Entries)
      .def("chunks", &Reader::Chunks, nb::arg("key"))
      .def("stats", &Reader::Stats, nb::arg("key"))
      .def("chunk_stats", &Reader::ChunkStats, nb::arg("key"), nb::arg("index"))
      .def("value", &Reader::Value, nb::arg("key"))
      .def("read_region", &Reader::ReadRegion, nb::arg("key"), nb::arg("offsets"), nb::arg("sizes"),
           nb::arg("out").noconvert(), nb::arg("verify"))
      .def("read_bytes", &Reader::ReadBytes, nb::arg("key"), nb::arg("verify"))
      .def("verify_chunk", &Reader::VerifyChunk, nb::arg("key"), nb::arg("index"))
      .def("bytes_read", &Reader::BytesRead)
      .def("dir", &Reader::Dir);

  nb::class_<Writer>(m, "Writer")
      .def(nb::init<const std::string&, const std::string&, int, int, bool, const std::optional<std::string>&,
                    int, const std::string&, const std::string&, const nb::object&>(),
           nb::arg("path"), nb::arg("state_dict_type"), nb::arg("world_size"), nb::arg("num_files"),
           nb::arg("overwrite"), nb::arg("compression").none(), nb::arg("level"), nb::arg("user_metadata"),
           nb::arg("mesh"), nb::arg("s3").none() = nb::none())
      .def("write_chunk", &Writer::WriteChunk, nb::arg("key"), nb::arg("dtype"), nb::arg("shape"),
           nb::arg("offsets"), nb::arg("sizes"), nb::arg("data").noconvert(), nb::arg("file_index"))
      .def("write_scalar", &Writer::WriteScalar, nb::arg("key"), nb::arg("dtype"), nb::arg("value"))
      .def("write_bytes", &Writer::WriteBytes, nb::arg("key"), nb::arg("data"), nb::arg("file_index"))
      .def("write_json", &Writer::WriteJson, nb::arg("key"), nb::arg("text"))
      .def("commit", &Writer::Commit)
      .def("abort", &Writer::Abort)
      .def("is_open", &Writer::Open);
}
