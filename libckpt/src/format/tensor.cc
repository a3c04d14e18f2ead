// format/tensor.cc: state-dict values.
#include "ckpt/tensor.h"

#include <cstdio>

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

namespace {

// Offset of the first byte that is not part of valid UTF-8, or npos.
std::size_t InvalidUtf8At(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    // Length of the sequence this byte starts, and the smallest code point it may encode.
    const int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    bool ok = len > 0 && i + static_cast<std::size_t>(len) <= s.size();
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      ok = (cc >> 6) == 0x2;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    ok = ok && cp >= kMin[len] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    if (!ok) return i;
    i += static_cast<std::size_t>(len);
  }
  return std::string_view::npos;
}

}  // namespace

std::string KeyProblem(std::string_view key) {
  if (key.empty()) return "empty key";
  if (key.find('\0') != std::string_view::npos) return "key '" + PrintableKey(key) + "' contains a NUL byte";
  if (const std::size_t at = InvalidUtf8At(key); at != std::string_view::npos) {
    return "key '" + PrintableKey(key) + "' is not valid UTF-8 (byte " + std::to_string(at) + ")";
  }
  return "";
}

std::string PrintableKey(std::string_view key) {
  // Valid UTF-8 prints as text; control bytes, and every non-ASCII byte of an invalid key,
  // as \xNN (so the message itself stays valid UTF-8).
  const bool utf8 = InvalidUtf8At(key) == std::string_view::npos;
  std::string out;
  for (char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 0x20 && c < 0x7f) || (c >= 0x80 && utf8)) {
      out += ch;
    } else {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

Entry& StateDict::Add(std::string key, Entry entry) {
  if (std::string why = KeyProblem(key); !why.empty()) throw Error(ErrorCode::kInvalidArgument, "StateDict: " + why);
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
