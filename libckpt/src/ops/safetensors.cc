// ops/safetensors.cc: see ckpt/ops/safetensors.h. nlohmann::json stays in this file.
#include "ckpt/ops/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "ckpt/digest.h"
#include "ckpt/error.h"
#include "ckpt/files.h"
#include "ckpt/metadata.h"
#include "ops/util.h"

namespace ckpt::ops {
namespace {

using detail::FormatShape;
using nlohmann::json;

struct NameMap {
  const char* st;
  DType dtype;
};
constexpr NameMap kNames[] = {
    {"F64", DType::kFloat64},       {"F32", DType::kFloat32},         {"F16", DType::kFloat16},
    {"BF16", DType::kBFloat16},     {"F8_E4M3", DType::kFloat8E4M3FN}, {"F8_E5M2", DType::kFloat8E5M2},
    {"I8", DType::kInt8},           {"I16", DType::kInt16},           {"I32", DType::kInt32},
    {"I64", DType::kInt64},         {"U8", DType::kUInt8},            {"BOOL", DType::kBool},
    {"U16", DType::kUInt16},        {"U32", DType::kUInt32},          {"U64", DType::kUInt64},
    {"F8_E8M0", DType::kFloat8E8M0FNU}, {"F4", DType::kFloat4E2M1FNx2},
};

[[noreturn]] void Corrupt(const std::filesystem::path& path, const std::string& msg) {
  throw Error(ErrorCode::kCorrupt, path.string() + ": " + msg);
}

// A SAX pass that finds the first duplicate member name in any object. (nlohmann keeps
// the last of duplicates silently, and its parser-callback route is quadratic in the
// number of members, so duplicates are found here, in linear time, before parsing.)
struct DuplicateFinder {
  std::vector<std::set<std::string>> open;
  std::string duplicate;
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_object(std::size_t) {
    open.emplace_back();
    return true;
  }
  bool key(std::string& k) {
    if (!open.back().insert(k).second) {
      duplicate = k;
      return false;
    }
    return true;
  }
  bool end_object() {
    open.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
};

// Parses JSON, rejecting duplicate keys in any object.
json ParseStrict(const std::string& text, const std::filesystem::path& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    Corrupt(path, std::string("header is not valid JSON: ") + e.what());
  }
  DuplicateFinder dups;
  json::sax_parse(text, &dups);
  if (!dups.duplicate.empty()) Corrupt(path, "header has duplicate key '" + dups.duplicate + "'");
  return j;
}

// "xxh3-64:<hex>" of `header` without its "ckpt.digest", as nlohmann dumps it (compact,
// object keys sorted): what "ckpt.digest" holds. `header` is left as it was.
std::string HeaderDigest(json& header) {
  json& meta = header["__metadata__"];
  json saved;
  const auto it = meta.find(kSafetensorsDigestKey);
  if (it != meta.end()) {
    saved = std::move(*it);
    meta.erase(it);
  }
  const std::string text = header.dump();
  if (!saved.is_null()) meta[std::string(kSafetensorsDigestKey)] = std::move(saved);
  return FormatChecksum(HashBlock(text.data(), text.size()));
}

// ckpt's digest keys of a file's header (IsSafetensorsDigestKey): checks "ckpt.digest"
// against the header and gives each tensor of `tensors` its blocks; returns the block size.
uint64_t ReadDigests(json& header, const std::vector<std::pair<std::string, std::string>>& metadata,
                     std::vector<SafetensorsTensor>& tensors, const std::filesystem::path& path) {
  const std::string* digest = nullptr;
  const std::string* block_bytes = nullptr;
  std::unordered_map<std::string_view, const std::string*> blocks;
  for (const auto& [k, v] : metadata) {
    if (k == kSafetensorsDigestKey) digest = &v;
    else if (k == kSafetensorsBlockBytesKey) block_bytes = &v;
    else if (k.starts_with(kSafetensorsBlocksPrefix)) blocks.emplace(std::string_view(k).substr(kSafetensorsBlocksPrefix.size()), &v);
  }
  if (!digest || !block_bytes)
    Corrupt(path, std::string("__metadata__ holds ckpt's digest keys but no '") +
                      std::string(digest ? kSafetensorsBlockBytesKey : kSafetensorsDigestKey) + "'");
  const std::string got = HeaderDigest(header);
  if (got != *digest)
    Corrupt(path, "header digest mismatch: __metadata__['ckpt.digest'] is " + *digest + ", the header hashes to " +
                      got + " (the tensor list or the metadata changed after the file was written)");
  uint64_t b = 0;
  const bool digits = !block_bytes->empty() && block_bytes->size() <= 9 &&
                      std::all_of(block_bytes->begin(), block_bytes->end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  if (digits) b = std::stoull(*block_bytes);
  if (!digits || b < kMinBlockBytes || b > kMaxBlockBytes || (b & (b - 1)) != 0)
    Corrupt(path, "__metadata__['ckpt.block_bytes'] = '" + *block_bytes +
                      "' is not a power of two from 4096 to 67108864");
  for (auto& t : tensors) {
    const auto it = blocks.find(t.name);
    if (it == blocks.end()) Corrupt(path, "tensor '" + t.name + "': no ckpt.blocks entry in __metadata__");
    const std::string& hex = *it->second;
    const uint64_t n = t.end - t.begin;
    if (hex.size() != 16 * BlockCount(n, b) ||
        !std::all_of(hex.begin(), hex.end(), [](char ch) { return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'); }))
      Corrupt(path, "tensor '" + t.name + "': ckpt.blocks holds " + std::to_string(hex.size()) +
                        " characters, not the 16 lowercase hex digits of each of its " +
                        std::to_string(BlockCount(n, b)) + " blocks of " + std::to_string(b) + " bytes");
    t.blocks = hex;
    blocks.erase(it);
  }
  if (!blocks.empty())
    Corrupt(path, "__metadata__['ckpt.blocks." + std::string(blocks.begin()->first) + "'] names no tensor");
  return b;
}

}  // namespace

bool IsSafetensorsDigestKey(std::string_view key) {
  return key == kSafetensorsDigestKey || key == kSafetensorsBlockBytesKey || key.starts_with(kSafetensorsBlocksPrefix);
}

std::optional<DType> DTypeFromSafetensors(std::string_view name) {
  for (const auto& n : kNames)
    if (name == n.st) return n.dtype;
  return std::nullopt;
}

std::string_view SafetensorsDTypeName(DType dtype) {
  for (const auto& n : kNames)
    if (n.dtype == dtype) return n.st;
  return "?";
}

SafetensorsReader::~SafetensorsReader() = default;

namespace {

using NamePairs = std::vector<std::pair<std::string, std::string>>;

// The header's JSON text: its 8-byte little-endian length first, checked against the limit
// and the file's size before any of it is read.
std::string ReadHeaderText(const files::File& file, uint64_t file_size, const std::filesystem::path& path) {
  if (file_size < 8)
    Corrupt(path, "file is " + std::to_string(file_size) + " bytes, too short for the 8-byte header length");
  uint8_t len_bytes[8];
  file.ReadAt(len_bytes, 8, 0);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kSafetensorsMaxHeaderBytes)
    Corrupt(path, "header length " + std::to_string(n) + " exceeds the limit of " +
                      std::to_string(kSafetensorsMaxHeaderBytes) + " bytes");
  if (n > file_size - 8)
    Corrupt(path, "header length " + std::to_string(n) + " runs past the end of the file (" +
                      std::to_string(file_size) + " bytes)");
  std::string text(n, '\0');
  file.ReadAt(text.data(), n, 8);
  return text;
}

// The byte extent of a tensor kept as bytes (an unsupported dtype, skipped later).
Shape BytesShape(const json& v, const std::string& where, const std::filesystem::path& path) {
  const auto b = v["data_offsets"][0].get<uint64_t>(), e = v["data_offsets"][1].get<uint64_t>();
  if (e < b) Corrupt(path, where + ": data_offsets end before they begin");
  return {static_cast<int64_t>(std::min<uint64_t>(e - b, uint64_t{1} << 62))};
}

// The members of a tensor's entry: dtype, shape and data_offsets of the right types, nothing else.
void CheckTensorFields(const json& v, const std::string& where, const std::filesystem::path& path) {
  if (!v.is_object()) Corrupt(path, where + ": entry is not an object");
  for (auto f = v.begin(); f != v.end(); ++f)
    if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
      Corrupt(path, where + ": unknown field '" + f.key() + "'");
  if (!v.contains("dtype") || !v["dtype"].is_string()) Corrupt(path, where + ": missing or non-string dtype");
  if (!v.contains("shape") || !v["shape"].is_array()) Corrupt(path, where + ": missing or non-array shape");
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2 ||
      !v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned())
    Corrupt(path, where + ": data_offsets must be two non-negative integers");
}

// Tensor `name` of the header (`v`, its entry) as ckpt sees it: its dtype, shape and
// byte range inside the data buffer of `buffer_len` bytes, all checked. A dtype ckpt does
// not have (or an F4 shape it cannot pack) is kUnsupported, unless `skip_unsupported`:
// then the tensor is listed in `skipped` and kept as bytes until the coverage is checked.
SafetensorsTensor ParseTensor(const std::string& name, const json& v, uint64_t buffer_len, bool skip_unsupported,
                              NamePairs& skipped, const std::filesystem::path& path) {
  const std::string where = "tensor '" + name + "'";
  if (name.empty()) Corrupt(path, "a tensor has an empty name");
  CheckTensorFields(v, where, path);
  SafetensorsTensor t;
  t.name = name;
  const std::string dt = v["dtype"].get<std::string>();
  auto dtype = DTypeFromSafetensors(dt);
  if (!dtype && !skip_unsupported)
    throw Error(ErrorCode::kUnsupported, path.string() + ": " + where + ": unknown or unsupported dtype '" + dt + "'");
  const bool skip = !dtype;
  if (skip) {  // kept as bytes until the offsets are checked, then left out
    skipped.emplace_back(name, dt);
    dtype = DType::kUInt8;
    t.shape = BytesShape(v, where, path);
  }
  t.dtype = *dtype;
  if (v["shape"].size() > static_cast<std::size_t>(kSafetensorsMaxRank))
    Corrupt(path, where + ": shape has " + std::to_string(v["shape"].size()) +
                      " dimensions, more than the limit of " + std::to_string(kSafetensorsMaxRank));
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t{1} << 62)
      Corrupt(path, where + ": shape must hold non-negative integers, found " + v["shape"].dump());
    if (!skip) t.shape.push_back(d.get<int64_t>());
  }
  if (!skip && t.dtype == DType::kFloat4E2M1FNx2) {  // header counts values; ckpt bytes of two
    if (t.shape.empty() || t.shape.back() % 2 != 0) {
      const std::string why = where + ": F4 shape " + v["shape"].dump() +
                              " has no float4_e2m1fn_x2 shape (ckpt packs two values per byte along the "
                              "last dimension, which must be even)";
      if (!skip_unsupported) throw Error(ErrorCode::kUnsupported, path.string() + ": " + why);
      skipped.emplace_back(name, dt);
      t.dtype = DType::kUInt8;
      t.shape = BytesShape(v, where, path);
    } else {
      t.shape.back() /= 2;
    }
  }
  t.begin = v["data_offsets"][0].get<uint64_t>();
  t.end = v["data_offsets"][1].get<uint64_t>();
  const uint64_t expect = detail::TensorBytes(t.shape, DTypeSize(t.dtype), path.string() + ": " + where);
  if (t.end < t.begin)
    Corrupt(path, where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                      "] end before they begin");
  if (t.end > buffer_len)
    Corrupt(path, where + ": data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                      "] run past the data buffer (" + std::to_string(buffer_len) + " bytes)");
  if (t.end - t.begin != expect)
    Corrupt(path, where + ": shape " + FormatShape(t.shape) + " x " + std::to_string(DTypeSize(t.dtype)) +
                      " bytes = " + std::to_string(expect) + " bytes, but data_offsets span " +
                      std::to_string(t.end - t.begin));
  return t;
}

// The tensors, in buffer order, must cover the data buffer exactly, back to back (as
// upstream requires).
void CheckCoverage(const std::vector<SafetensorsTensor>& tensors, uint64_t buffer_len,
                   const std::filesystem::path& path) {
  uint64_t pos = 0;
  const SafetensorsTensor* prev = nullptr;
  for (const auto& t : tensors) {
    if (t.begin < pos)
      Corrupt(path, "tensor '" + t.name + "' data_offsets [" + std::to_string(t.begin) + ", " +
                        std::to_string(t.end) + "] overlap tensor '" + prev->name + "'");
    if (t.begin > pos)
      Corrupt(path, "tensor '" + t.name + "' starts at byte " + std::to_string(t.begin) +
                        " of the data buffer, leaving a gap after byte " + std::to_string(pos));
    pos = t.end;
    prev = &t;
  }
  if (pos != buffer_len)
    Corrupt(path, "tensors cover " + std::to_string(pos) + " bytes of the data buffer, which has " +
                      std::to_string(buffer_len));
}

}  // namespace

std::unique_ptr<SafetensorsReader> SafetensorsReader::Open(const std::filesystem::path& path,
                                                           bool skip_unsupported) {
  std::unique_ptr<SafetensorsReader> r(new SafetensorsReader());
  r->path_ = path;
  // A path the user named: a symlink is followed; a FIFO or device is refused, without blocking.
  r->file_ = files::File::OpenForRead(path, /*follow_symlinks=*/true);
  r->file_size_ = r->file_.Size();
  const std::string text = ReadHeaderText(r->file_, r->file_size_, path);
  r->data_start_ = 8 + text.size();
  const uint64_t buffer_len = r->file_size_ - r->data_start_;

  json header = ParseStrict(text, path);
  if (!header.is_object()) Corrupt(path, "header is not a JSON object");
  for (auto it = header.begin(); it != header.end(); ++it) {
    const json& v = it.value();
    if (it.key() != "__metadata__") {
      r->tensors_.push_back(ParseTensor(it.key(), v, buffer_len, skip_unsupported, r->skipped_, path));
      continue;
    }
    if (!v.is_object()) Corrupt(path, "__metadata__ is not an object");
    for (auto m = v.begin(); m != v.end(); ++m) {
      if (!m.value().is_string()) Corrupt(path, "__metadata__ value '" + m.key() + "' is not a string");
      r->metadata_.emplace_back(m.key(), m.value().get<std::string>());
    }
  }
  std::stable_sort(r->tensors_.begin(), r->tensors_.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  CheckCoverage(r->tensors_, buffer_len, path);
  if (std::any_of(r->metadata_.begin(), r->metadata_.end(), [](const auto& m) { return IsSafetensorsDigestKey(m.first); }))
    r->block_bytes_ = ReadDigests(header, r->metadata_, r->tensors_, path);
  if (!r->skipped_.empty()) {
    std::unordered_set<std::string_view> skipped;
    for (const auto& s : r->skipped_) skipped.insert(s.first);
    std::erase_if(r->tensors_, [&](const SafetensorsTensor& t) { return skipped.count(t.name) > 0; });
  }
  r->by_name_.resize(r->tensors_.size());
  for (std::size_t i = 0; i < r->by_name_.size(); ++i) r->by_name_[i] = i;
  std::sort(r->by_name_.begin(), r->by_name_.end(),
            [&](std::size_t a, std::size_t b) { return r->tensors_[a].name < r->tensors_[b].name; });
  return r;
}

const SafetensorsTensor* SafetensorsReader::Find(std::string_view name) const {
  const auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                                   [&](std::size_t i, std::string_view n) { return tensors_[i].name < n; });
  return it != by_name_.end() && tensors_[*it].name == name ? &tensors_[*it] : nullptr;
}

void SafetensorsReader::ReadRange(const SafetensorsTensor& t, uint64_t offset, uint64_t length,
                                  void* out) const {
  if (offset > t.end - t.begin || length > t.end - t.begin - offset)
    throw Error(ErrorCode::kInvalidArgument, path_.string() + ": tensor '" + t.name +
                                                 "': read outside its bytes");
  file_.ReadAt(out, length, data_start_ + t.begin + offset);
}

void SafetensorsReader::ScanTensor(const SafetensorsTensor& t,
                                   const std::function<void(const unsigned char*, std::size_t)>& consume) const {
  try {
    file_.Scan(data_start_ + t.begin, t.end - t.begin,
               [&](const unsigned char* p, std::size_t n, uint64_t) { consume(p, n); });
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorrupt) throw;
    throw Error(e.code(), path_.string() + ": tensor '" + t.name + "': " + e.what());
  }
}

void SafetensorsReader::ReadRegion(const SafetensorsTensor& t, const Box& box, void* out) const {
  auto* dst = static_cast<uint8_t*>(out);
  const std::size_t item = DTypeSize(t.dtype);
  if (box.sizes.empty()) {
    ReadRange(t, 0, item, dst);
    return;
  }
  ForEachRun(Box::Full(t.shape), box, box, [&](const BoxRun& run) {
    ReadRange(t, static_cast<uint64_t>(run.src) * item, static_cast<uint64_t>(run.count) * item,
              dst + run.dst * item);
  });
}

// With digests: the header (its blocks filled in at the end) and the tensors' digests.
struct SafetensorsWriter::Digests {
  json header;
  std::vector<std::string> names;
  std::vector<uint64_t> ends;  // each tensor's end in the data buffer
  std::vector<std::string> blocks;
  std::size_t current = 0;  // the tensor being appended
  std::unique_ptr<ChunkDigest> digest;
  uint64_t pos = 0;  // bytes hashed
  std::size_t text_bytes = 0;
};

namespace {
std::string HeaderText(const json& header) {
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the buffer to 8 bytes, as upstream
  return text;
}
}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path,
                                     std::vector<TensorSpec> tensors,
                                     const std::vector<std::pair<std::string, std::string>>& metadata,
                                     bool overwrite, bool digests)
    : path_(path), overwrite_(overwrite) {
  std::error_code ec;
  if (!overwrite && std::filesystem::exists(path, ec))
    throw Error(ErrorCode::kAlreadyExists, path.string() + ": already exists");
  json header = json::object();
  json m = json::object();
  for (const auto& [k, v] : metadata)
    if (!digests || !IsSafetensorsDigestKey(k)) m[k] = v;
  if (digests) {
    digests_ = std::make_unique<Digests>();
    m[std::string(kSafetensorsBlockBytesKey)] = std::to_string(kDefaultBlockBytes);
    m[std::string(kSafetensorsDigestKey)] = FormatChecksum(0);  // a placeholder of the same length
  }
  std::set<std::string> names;
  uint64_t off = 0;
  for (const auto& t : tensors) {
    if (t.name == "__metadata__" || t.name.empty() || !names.insert(t.name).second)
      throw Error(ErrorCode::kInvalidArgument,
                  path.string() + ": invalid or duplicate tensor name '" + t.name + "'");
    const uint64_t n = detail::TensorBytes(t.shape, DTypeSize(t.dtype), t.name);
    Shape shape = t.shape;
    if (t.dtype == DType::kFloat4E2M1FNx2) {  // safetensors counts the values
      if (shape.empty())
        throw Error(ErrorCode::kInvalidArgument,
                    path.string() + ": tensor '" + t.name +
                        "': a 0-d float4_e2m1fn_x2 (one byte, two values) has no safetensors F4 shape");
      if (__builtin_mul_overflow(shape.back(), int64_t{2}, &shape.back()))  // as NumElements, before it
        throw Error(ErrorCode::kCorrupt, t.name + ": size overflows 64 bits (" + std::to_string(t.shape.back()) + " x 2)");
    }
    header[t.name] = {{"dtype", SafetensorsDTypeName(t.dtype)},
                      {"shape", shape},
                      {"data_offsets", {off, off + n}}};
    off += n;
    if (digests_) {  // placeholders of the digests' length, filled in by WriteDigests
      m[std::string(kSafetensorsBlocksPrefix) + t.name] =
          std::string(16 * BlockCount(n, kDefaultBlockBytes), '0');
      digests_->names.push_back(t.name);
      digests_->ends.push_back(off);
    }
  }
  if (!m.empty()) header["__metadata__"] = std::move(m);
  data_total_ = off;
  const std::string text = HeaderText(header);
  if (digests_) {
    digests_->header = std::move(header);
    digests_->text_bytes = text.size();
    digests_->blocks.resize(digests_->names.size());
  }
  // Written at a staging sibling, committed by libckpt's commit routine (ckpt/files.h); a
  // throw from here on closes and discards it with the members.
  staged_.emplace(path, /*directory=*/false);
  out_ = files::File::Create(staged_->path());
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(text.size() >> (8 * i));
  out_.WriteAt(len, 8, 0);
  out_.WriteAt(text.data(), text.size(), 8);
  file_pos_ = 8 + text.size();
}

// Feeds appended bytes to the digests of the tensors they belong to, in order.
void SafetensorsWriter::Hash(const void* data, uint64_t bytes) {
  if (!digests_) return;
  Digests& d = *digests_;
  const auto* p = static_cast<const unsigned char*>(data);
  while (true) {
    while (d.current < d.ends.size() && d.pos == d.ends[d.current]) {  // the tensor is complete
      d.blocks[d.current++] = d.digest ? d.digest->Blocks() : std::string();
      d.digest.reset();
    }
    if (bytes == 0 || d.current == d.ends.size()) return;
    if (!d.digest) d.digest = std::make_unique<ChunkDigest>(DType::kUInt8, false, kDefaultBlockBytes);
    const uint64_t take = std::min(bytes, d.ends[d.current] - d.pos);
    d.digest->Update(p, static_cast<std::size_t>(take));
    p += take, bytes -= take, d.pos += take;
  }
}

// The header again, its blocks and digest filled in: of the same length, in place.
void SafetensorsWriter::WriteDigests() {
  Digests& d = *digests_;
  Hash(nullptr, 0);  // completes the trailing empty tensors
  json& meta = d.header["__metadata__"];
  for (std::size_t i = 0; i < d.names.size(); ++i)
    meta[std::string(kSafetensorsBlocksPrefix) + d.names[i]] = std::move(d.blocks[i]);
  meta[std::string(kSafetensorsDigestKey)] = HeaderDigest(d.header);
  const std::string text = HeaderText(d.header);
  if (text.size() != d.text_bytes)
    throw Error(ErrorCode::kInternal, out_.path().string() + ": the header with its digests is " +
                                          std::to_string(text.size()) + " bytes, not the " +
                                          std::to_string(d.text_bytes) + " reserved");
  out_.WriteAt(text.data(), text.size(), 8);
}

SafetensorsWriter::~SafetensorsWriter() = default;  // closes the files, discards an uncommitted staging

void SafetensorsWriter::Append(const void* data, uint64_t bytes) {
  if (!out_.is_open()) throw Error(ErrorCode::kInvalidArgument, path_.string() + ": writer is closed");
  if (bytes > data_total_ - written_)
    throw Error(ErrorCode::kInvalidArgument,
                path_.string() + ": more bytes appended than the header declares");
  out_.WriteAt(data, bytes, file_pos_);
  Hash(data, bytes);
  Wrote(bytes);
}

void SafetensorsWriter::AppendCopy(const FileRange& range) {
  if (!out_.is_open()) throw Error(ErrorCode::kInvalidArgument, path_.string() + ": writer is closed");
  if (range.length > data_total_ - written_)
    throw Error(ErrorCode::kInvalidArgument,
                path_.string() + ": more bytes appended than the header declares");
  int source = range.fd;  // the reader's own descriptor (a pinned checkpoint's shard), if any
  if (source < 0) {
    if (!source_.is_open() || source_.path() != range.file)  // tensors come file by file: keep the last one open
      source_ = files::File::OpenForRead(range.file);
    source = source_.fd();
  }
  out_.CopyFrom(source, range.file, range.offset, file_pos_, static_cast<std::size_t>(range.length));
  if (digests_)  // the bytes as written, read back (from the page cache)
    out_.Scan(file_pos_, range.length, [&](const unsigned char* p, std::size_t n, uint64_t) { Hash(p, n); });
  Wrote(range.length);
}

// Every 64 MiB, starts writeback so the disk works while the rest is produced and the
// final fsync has little left (as shard files do).
void SafetensorsWriter::Wrote(uint64_t bytes) {
  file_pos_ += bytes, written_ += bytes, unflushed_ += bytes;
  if (unflushed_ < (uint64_t{64} << 20)) return;
  out_.StartWriteback();
  unflushed_ = 0;
}

void SafetensorsWriter::Seal() {
  if (!out_.is_open()) throw Error(ErrorCode::kInvalidArgument, path_.string() + ": writer is closed");
  if (written_ != data_total_)
    throw Error(ErrorCode::kInvalidArgument,
                path_.string() + ": " + std::to_string(written_) + " data bytes written, header declares " +
                    std::to_string(data_total_));
  if (digests_) WriteDigests();
  out_.Sync();
  out_.Close();
  SafetensorsReader::Open(staged_->path());  // the header written parses back, before anything is committed
}

void SafetensorsWriter::Commit() {
  Seal();
  try {
    staged_->Commit(overwrite_ ? files::Replace::kExisting : files::Replace::kNever);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kAlreadyExists && !overwrite_)
      throw Error(ErrorCode::kAlreadyExists, path_.string() + ": already exists");
    throw;
  }
}

std::optional<std::filesystem::path> FindSafetensorsIndex(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (path.filename().string().ends_with(kSafetensorsIndexSuffix)) return path;
    return std::nullopt;
  }
  const fs::path model = path / ("model" + std::string(kSafetensorsIndexSuffix));
  if (fs::exists(model, ec)) return model;
  std::optional<fs::path> only;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->path().filename().string().ends_with(kSafetensorsIndexSuffix)) continue;
    if (only) return std::nullopt;  // several: which one is meant is not ours to guess
    only = it->path();
  }
  return only;
}

std::optional<std::filesystem::path> FindHubModel(const std::filesystem::path& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return std::nullopt;
  if (auto index = FindSafetensorsIndex(dir)) return index;
  const std::filesystem::path model = dir / "model.safetensors";
  if (std::filesystem::exists(model, ec)) return model;
  return std::nullopt;
}

SafetensorsIndex ReadSafetensorsIndex(const std::filesystem::path& index_file) {
  SafetensorsIndex index;
  index.path = index_file;
  const json j = ParseStrict(detail::ReadFileText(index_file, uint64_t{64} << 20), index_file);
  if (!j.is_object()) Corrupt(index_file, "the index is not a JSON object");
  if (j.contains("metadata")) {
    const json& m = j["metadata"];
    if (!m.is_object() && !m.is_null()) Corrupt(index_file, "'metadata' is not an object");
    if (m.is_object() && m.contains("total_size")) {
      const json& t = m["total_size"];
      // transformers has written it as an integer-valued float at times: accept those too.
      if (t.is_number_unsigned()) {
        index.total_size = t.get<uint64_t>();
      } else if (t.is_number_float() && t.get<double>() >= 0 && t.get<double>() < 0x1p63 &&
                 t.get<double>() == static_cast<double>(static_cast<uint64_t>(t.get<double>()))) {
        index.total_size = static_cast<uint64_t>(t.get<double>());
      } else {
        Corrupt(index_file, "metadata.total_size is not a non-negative integer: " + t.dump());
      }
    }
  }
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    Corrupt(index_file, "missing or non-object 'weight_map'");
  std::set<std::string> files;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (it.key().empty()) Corrupt(index_file, "weight_map has an empty tensor name");
    if (!it.value().is_string())
      Corrupt(index_file, "weight_map['" + it.key() + "'] is not a file name: " + it.value().dump());
    const std::string file = it.value().get<std::string>();
    if (!IsSafeFileName(file))
      Corrupt(index_file, "weight_map['" + it.key() + "'] = '" + file +
                              "' is not a plain file name in the index's directory");
    index.weight_map.emplace_back(it.key(), file);
    if (files.insert(file).second) index.files.push_back(file);
  }
  return index;
}

namespace {
std::string SafetensorsIndexText(uint64_t total_size,
                                 const std::vector<std::pair<std::string, std::string>>& weight_map,
                                 std::optional<uint64_t> total_parameters) {
  json map = json::object();
  for (const auto& [tensor, file] : weight_map) map[tensor] = file;
  json meta = {{"total_size", total_size}};
  if (total_parameters) meta["total_parameters"] = *total_parameters;  // as transformers 5 writes
  const json j = {{"metadata", meta}, {"weight_map", map}};
  // json objects keep keys sorted; ensure_ascii as Python's json.dumps.
  return j.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
}
}  // namespace

void WriteSafetensorsIndex(const std::filesystem::path& index_file, uint64_t total_size,
                           const std::vector<std::pair<std::string, std::string>>& weight_map,
                           std::optional<uint64_t> total_parameters) {
  files::CommitFile(index_file, SafetensorsIndexText(total_size, weight_map, total_parameters));
}

void CommitSafetensorsShards(const std::vector<SafetensorsWriter*>& shards, const std::filesystem::path& index_file,
                             uint64_t total_size, const std::vector<std::pair<std::string, std::string>>& weight_map,
                             std::optional<uint64_t> total_parameters) {
  bool overwrite = true;
  std::vector<files::StagedOutput*> staged;
  for (SafetensorsWriter* w : shards) {
    w->Seal();
    overwrite = overwrite && w->overwrite_;
    staged.push_back(&*w->staged_);
  }
  files::StagedOutput index(index_file, /*directory=*/false);  // discarded on a throw, as the shards are
  const std::string text = SafetensorsIndexText(total_size, weight_map, total_parameters);
  files::File out = files::File::Create(index.path());
  out.WriteAt(text.data(), text.size(), 0);
  out.Sync();
  out.Close();
  staged.push_back(&index);  // last: the file readers look for
  files::StagedOutput::CommitAll(staged, overwrite ? files::Replace::kExisting : files::Replace::kNever);
}

std::vector<std::vector<std::size_t>> PlanSafetensorsShards(const std::vector<uint64_t>& bytes,
                                                            uint64_t max_shard_bytes) {
  std::vector<std::vector<std::size_t>> shards;
  std::vector<std::size_t> current;
  uint64_t current_bytes = 0;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + bytes[i] > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += bytes[i];
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

std::string SafetensorsShardName(std::string_view stem, std::size_t shard, std::size_t shards) {
  char suffix[64];
  std::snprintf(suffix, sizeof suffix, "-%05zu-of-%05zu.safetensors", shard + 1, shards);
  return std::string(stem) + suffix;
}

}  // namespace ckpt::ops
