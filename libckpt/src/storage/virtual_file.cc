// storage/virtual_file.cc: ckpt/virtual_file.h over HDF5.
#include "ckpt/virtual_file.h"

#include "ckpt/error.h"
#include "format/names.h"
#include "storage/h5.h"

namespace ckpt {

namespace {

std::vector<hsize_t> Dims(const std::vector<int64_t>& v) { return std::vector<hsize_t>(v.begin(), v.end()); }

// A packed chunk copied into a dataset of its own (in a tensor that also maps chunks).
constexpr const char* kChunkPrefix = ".ckpt_chunk.";

}  // namespace

struct VirtualFileWriter::Impl {
  h5::Handle file;
  std::filesystem::path path;
  std::string label;
  uint64_t copied = 0;  // packed chunks copied into datasets of their own
  using ReadChunk = VirtualFileWriter::ReadChunk;

  // Reads packed chunk `c` and writes it into its box of `dataset`, or (dataset < 0) into a
  // dataset of its own, whose name it returns.
  std::string CopyChunk(const std::string& key, DType dtype, const ChunkMeta& c, const ReadChunk& read_packed,
                        hid_t dataset) {
    std::vector<std::byte> bytes(static_cast<std::size_t>(c.box.NumElements()) * DTypeSize(dtype));
    read_packed(c, bytes.data());
    h5::Handle type = h5::FileType(dtype);
    h5::Handle mem = h5::MakeSpace(Dims(c.box.sizes));
    h5::Handle ds;
    std::string name;
    hid_t target = dataset;
    h5::Handle file_space;
    if (target < 0) {  // a dataset of its own, ".ckpt_chunk.<n>"
      name = kChunkPrefix + std::to_string(copied++);
      ds = h5::Dataset(h5::Check(H5Dcreate2(file.get(), name.c_str(), type.get(), mem.get(), H5P_DEFAULT,
                                            H5P_DEFAULT, H5P_DEFAULT),
                                 label + ": tensor '" + key + "': cannot create dataset " + name));
      target = ds.get();
      file_space = h5::Space(H5Scopy(mem.get()));
    } else {  // the chunk's box of the tensor's dataset
      file_space = h5::Space(H5Dget_space(target));
      const auto start = Dims(c.box.offsets), count = Dims(c.box.sizes);
      h5::Check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
                "H5Sselect_hyperslab");
    }
    h5::Check(H5Dwrite(target, type.get(), mem.get(), file_space.get(), H5P_DEFAULT, bytes.data()),
              label + ": tensor '" + key + "' chunk " + c.box.ToString() + ": cannot write its copy");
    return name;
  }
};

VirtualFileWriter::VirtualFileWriter(const std::filesystem::path& path, std::string label)
    : impl_(std::make_unique<Impl>()) {
  h5::Init();
  impl_->path = path;
  impl_->label = std::move(label);
  impl_->file = h5::File(h5::Check(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                             path.string() + ": cannot create"));
}

VirtualFileWriter::~VirtualFileWriter() = default;

void VirtualFileWriter::AddTensor(const std::string& key, DType dtype, const Shape& shape,
                                  const std::vector<ChunkMeta>& chunks, const std::filesystem::path& source_dir,
                                  const ReadChunk& read_packed) {
  h5::Handle type = h5::FileType(dtype);
  h5::Handle space = h5::MakeSpace(Dims(shape));
  const std::string name = h5::EscapeKey(key);
  bool mapped = false, packed = false;
  for (const auto& c : chunks) {
    if (c.box.NumElements() == 0) continue;
    (c.pack_offset ? packed : mapped) = true;
  }
  h5::Handle ds;
  if (packed && !mapped) {  // nothing to map: an ordinary dataset holding the copied chunks
    ds = h5::Dataset(h5::Check(
        H5Dcreate2(impl_->file.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
        impl_->label + ": tensor '" + key + "': cannot create dataset"));
    for (const auto& c : chunks)
      if (c.box.NumElements() > 0) impl_->CopyChunk(key, dtype, c, read_packed, ds.get());
  } else {
    h5::Handle dcpl = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
    for (const auto& c : chunks) {
      if (c.box.NumElements() == 0) continue;
      const auto start = Dims(c.box.offsets), count = Dims(c.box.sizes);
      h5::Handle vsel = h5::Space(H5Scopy(space.get()));
      h5::Check(H5Sselect_hyperslab(vsel.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
                "H5Sselect_hyperslab");
      h5::Handle srcspace = h5::MakeSpace(count);
      std::string src_file = (source_dir / c.file).string(), src_dataset = c.dataset;
      if (c.pack_offset) {  // its bytes are a slice of a uint8 pack, which a mapping cannot retype: copied
        src_dataset = impl_->CopyChunk(key, dtype, c, read_packed, -1);
        src_file = ".";  // this file (HDF5's name for it in a mapping)
      }
      h5::Check(H5Pset_virtual(dcpl.get(), vsel.get(), src_file.c_str(), src_dataset.c_str(), srcspace.get()),
                impl_->label + ": tensor '" + key + "': H5Pset_virtual");
    }
    ds = h5::Dataset(
        h5::Check(H5Dcreate2(impl_->file.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                  impl_->label + ": tensor '" + key + "': cannot create dataset"));
  }
  if (h5::NeedsDTypeAttr(dtype)) h5::WriteStringAttr(ds.get(), names::kDTypeAttr, std::string(DTypeName(dtype)));
}

void VirtualFileWriter::AddScalar(const std::string& key, DType dtype, const void* element) {
  h5::Handle type = h5::FileType(dtype);
  h5::Handle space = h5::MakeSpace({});
  const std::string name = h5::EscapeKey(key);
  h5::Handle ds = h5::Dataset(
      h5::Check(H5Dcreate2(impl_->file.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                impl_->label + ": tensor '" + key + "': cannot create dataset"));
  h5::Check(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, element), "H5Dwrite");
  if (h5::NeedsDTypeAttr(dtype)) h5::WriteStringAttr(ds.get(), names::kDTypeAttr, std::string(DTypeName(dtype)));
}

void VirtualFileWriter::Close() { h5::Check(impl_->file.Close(), impl_->path.string() + ": cannot close"); }

}  // namespace ckpt
