// format/tensor.cc: state-dict values.
#include "ckpt/tensor.h"

#include "ckpt/error.h"
#include "format/checked.h"

namespace ckpt {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t extent : shape) {
    if (extent < 0) {
      throw Error(ErrorCode::kInvalidArgument, "negative extent " + std::to_string(extent) + " in shape");
    }
    n = internal::CheckedMul(n, extent, "shape");
  }
  return n;
}

std::string Box::ToString() const {
  std::string s = "[";
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (d) s += ", ";
    const int64_t begin = d < offsets.size() ? offsets[d] : 0;
    s += std::to_string(begin) + ":" + std::to_string(begin + sizes[d]);
  }
  return s + "]";
}

Tensor Tensor::Full(DType dtype, Shape shape, void* data) {
  Tensor t{dtype, shape, {}};
  t.chunks.push_back(Chunk{Box::Full(shape), data});
  return t;
}

Tensor Tensor::Sharded(DType dtype, Shape shape, std::vector<Chunk> chunks) {
  return Tensor{dtype, std::move(shape), std::move(chunks)};
}

Tensor Tensor::Slice(DType dtype, Shape shape, int dim, int64_t begin, int64_t count, void* data) {
  if (dim < 0 || static_cast<std::size_t>(dim) >= shape.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                "Tensor::Slice: dim " + std::to_string(dim) + " out of range for a " +
                    std::to_string(shape.size()) + "-D tensor");
  }
  Box box = Box::Full(shape);
  box.offsets[dim] = begin;
  box.sizes[dim] = count;
  return Tensor{dtype, shape, {Chunk{std::move(box), data}}};
}

int64_t Scalar::AsInt() const {
  if (const auto* i = std::get_if<int64_t>(&value)) return *i;
  return static_cast<int64_t>(std::get<double>(value));
}

double Scalar::AsDouble() const {
  if (const auto* d = std::get_if<double>(&value)) return *d;
  return static_cast<double>(std::get<int64_t>(value));
}

EntryKind KindOf(const Entry& entry) { return static_cast<EntryKind>(entry.index()); }

std::string_view EntryKindName(EntryKind kind) {
  switch (kind) {
    case EntryKind::kTensor: return "tensor";
    case EntryKind::kScalar: return "scalar";
    case EntryKind::kBytes: return "bytes";
    case EntryKind::kJson: return "json";
  }
  return "?";
}

Entry& StateDict::Add(std::string key, Entry entry) {
  if (key.empty()) throw Error(ErrorCode::kInvalidArgument, "StateDict: empty key");
  if (index_.count(key)) {
    throw Error(ErrorCode::kInvalidArgument, "StateDict: duplicate key '" + key + "'");
  }
  index_.emplace(key, items_.size());
  items_.emplace_back(std::move(key), std::move(entry));
  return items_.back().second;
}

Entry* StateDict::Find(std::string_view key) {
  auto it = index_.find(std::string(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

const Entry* StateDict::Find(std::string_view key) const {
  return const_cast<StateDict*>(this)->Find(key);
}

Entry& StateDict::At(std::string_view key) {
  Entry* e = Find(key);
  if (!e) throw Error(ErrorCode::kNotFound, "StateDict: no key '" + std::string(key) + "'");
  return *e;
}

const Entry& StateDict::At(std::string_view key) const { return const_cast<StateDict*>(this)->At(key); }

}  // namespace ckpt
