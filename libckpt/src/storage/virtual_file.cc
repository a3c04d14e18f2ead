// storage/virtual_file.cc
#include "storage/virtual_file.h"

#include "ckpt/error.h"
#include "format/names.h"
#include "storage/h5.h"

namespace ckpt::storage {

struct VirtualFileWriter::Impl {
  h5::Handle file;
  std::filesystem::path path;
  std::string label;
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
                                  const std::vector<ChunkMeta>& chunks, const std::filesystem::path& source_dir) {
  h5::Handle type = h5::FileType(dtype);
  h5::Handle space = h5::MakeSpace(std::vector<hsize_t>(shape.begin(), shape.end()));
  h5::Handle dcpl = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
  for (const auto& c : chunks) {
    if (c.box.NumElements() == 0) continue;
    if (c.pack_offset) {  // its bytes are a slice of a uint8 pack, which a mapping cannot retype
      throw Error(ErrorCode::kUnsupported,
                  impl_->label + ": tensor '" + key + "' chunk " + c.box.ToString() + " is packed in " + c.file +
                      " (FORMAT.md §5.7): a virtual dataset cannot map it; merge without virtual datasets, or "
                      "save with SaveOptions::pack_bytes = 0");
    }
    std::vector<hsize_t> start(c.box.offsets.begin(), c.box.offsets.end());
    std::vector<hsize_t> count(c.box.sizes.begin(), c.box.sizes.end());
    h5::Handle vsel = h5::Space(H5Scopy(space.get()));
    h5::Check(H5Sselect_hyperslab(vsel.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
              "H5Sselect_hyperslab");
    h5::Handle srcspace = h5::MakeSpace(count);
    h5::Check(H5Pset_virtual(dcpl.get(), vsel.get(), (source_dir / c.file).c_str(), c.dataset.c_str(), srcspace.get()),
              impl_->label + ": tensor '" + key + "': H5Pset_virtual");
  }
  const std::string name = h5::EscapeKey(key);
  h5::Handle ds = h5::Dataset(
      h5::Check(H5Dcreate2(impl_->file.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                impl_->label + ": tensor '" + key + "': cannot create dataset"));
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

}  // namespace ckpt::storage
