// ops/merge.cc: see ckpt/ops/merge.h.
#include "ckpt/ops/merge.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/ops/safetensors.h"
#include "ckpt/ops/source.h"
#include "ckpt/ops/verify.h"
#include "ops/elements.h"
#include "ops/util.h"
#include "storage/h5.h"

namespace ckpt::ops {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Selected {
  const std::string* key;
  const EntryMeta* entry;
};

std::vector<Selected> Select(const Source& src, const MergeOptions& o) {
  std::vector<Selected> out;
  for (const auto& [key, e] : src.metadata().entries) {
    if (!o.keys.empty() && !detail::MatchesAny(o.keys, key)) continue;
    if (detail::MatchesAny(o.exclude, key)) continue;
    if (e.kind == EntryKind::kTensor && !src.HoldsWhole(key))
      throw Error(ErrorCode::kInvalidArgument,
                  src.path().string() + ": tensor '" + key +
                      "' is only partly in this shard; merge the checkpoint directory instead");
    out.push_back({&key, &e});
  }
  return out;
}

DType OutType(const EntryMeta& e, const MergeOptions& o) {
  return o.cast && IsFloating(e.dtype) ? *o.cast : e.dtype;
}

// Streams tensor `key` block by block in row-major order; fn(block, data, bytes).
template <typename Fn>
void StreamTensor(Source& src, const std::string& key, const EntryMeta& e, const Box& part,
                  DType out_dtype, uint64_t budget, detail::Buffer& in, detail::Buffer& out, Fn&& fn) {
  const std::size_t in_item = DTypeSize(e.dtype), out_item = DTypeSize(out_dtype);
  for (const Box& block : detail::SplitBox(part, std::max(in_item, out_item), budget)) {
    const auto n = static_cast<std::size_t>(block.NumElements());
    uint8_t* data = in.Get(std::max<std::size_t>(n * in_item, 8));
    if (n > 0) src.ReadRegion(key, block, data);
    if (out_dtype == e.dtype) {
      fn(block, data, n * in_item);
    } else {
      uint8_t* cast = out.Get(std::max<std::size_t>(n * out_item, 8));
      detail::CastElements(e.dtype, data, out_dtype, cast, n);
      fn(block, cast, n * out_item);
    }
  }
}

Scalar ToScalar(const std::string& key, const EntryMeta& e) {
  const json v = json::parse(e.value, nullptr, false);
  if (v.is_boolean()) return Scalar::Int(v.get<bool>() ? 1 : 0, e.dtype);
  if (v.is_number_integer()) return Scalar::Int(v.get<int64_t>(), e.dtype);
  if (v.is_number()) return Scalar::Float(v.get<double>(), e.dtype);
  throw Error(ErrorCode::kCorrupt, "scalar '" + key + "' has a non-numeric value " + e.value);
}

fs::path Sibling(const fs::path& dst, const char* tag) {
  return dst.parent_path() / ("." + dst.filename().string() + tag + std::to_string(::getpid()));
}

// Puts the verified `staging` at `dst`, replacing what was there only with `force`.
void Install(const fs::path& staging, const fs::path& dst, bool force) {
  std::error_code ec;
  if (fs::exists(dst, ec)) {
    if (!force) {
      fs::remove_all(staging, ec);
      throw Error(ErrorCode::kAlreadyExists, dst.string() + ": already exists (use --force to replace it)");
    }
    const fs::path old = Sibling(dst, ".merge-old-");
    fs::rename(dst, old, ec);
    if (ec) throw Error(ErrorCode::kIO, dst.string() + ": cannot move aside: " + ec.message());
    fs::rename(staging, dst, ec);
    if (ec) {
      std::error_code ignored;
      fs::rename(old, dst, ignored);
      throw Error(ErrorCode::kIO, dst.string() + ": cannot rename into place: " + ec.message());
    }
    fs::remove_all(old, ec);
    return;
  }
  fs::rename(staging, dst, ec);
  if (ec) throw Error(ErrorCode::kIO, dst.string() + ": cannot rename into place: " + ec.message());
}

void WriteCheckpoint(Source& src, const std::vector<Selected>& sel, const fs::path& dst,
                     const MergeOptions& o, uint64_t budget, MergeReport& r) {
  const int files = std::max(1, o.world);
  CheckpointWriter::Options wo;
  wo.state_dict_type = o.world == 0 ? StateDictType::kFull : StateDictType::kSharded;
  wo.world_size = files;
  wo.num_files = files;
  wo.compression = o.compression;
  wo.user_metadata = src.metadata().user.empty() ? "{}" : src.metadata().user;
  const fs::path staging = Sibling(dst, ".merge-tmp-");
  std::error_code ec;
  fs::remove_all(staging, ec);
  uint64_t total = 0;
  for (const auto& s : sel)
    if (s.entry->kind == EntryKind::kTensor) total += s.entry->TensorBytes();
  detail::Progress progress(o.world ? "reshard" : "merge", total, o.progress);
  {
    auto writer = CheckpointWriter::Create(staging, wo);
    detail::Buffer in, out;
    int next_whole = 0;  // tensors too small to split go to the files in turn
    for (const auto& s : sel) {
      const std::string& key = *s.key;
      const EntryMeta& e = *s.entry;
      switch (e.kind) {
        case EntryKind::kTensor: {
          const DType out_dtype = OutType(e, o);
          std::vector<std::pair<Box, int>> parts;
          const auto rank = static_cast<int>(e.shape.size());
          if (o.world > 1 && o.dim < rank && e.shape[o.dim] >= o.world) {
            for (int p = 0; p < o.world; ++p) {
              Box b = Box::Full(e.shape);
              auto [begin, end] = RowRange(e.shape[o.dim], o.world, p);
              b.offsets[o.dim] = begin;
              b.sizes[o.dim] = end - begin;
              parts.emplace_back(b, p);
            }
          } else {
            parts.emplace_back(Box::Full(e.shape), next_whole++ % files);
          }
          for (const auto& [part, file] : parts)
            StreamTensor(src, key, e, part, out_dtype, budget, in, out,
                         [&, f = file](const Box& block, const void* data, std::size_t bytes) {
                           writer->WriteChunk(key, out_dtype, e.shape, block, data, f);
                           ++r.chunks;
                           r.bytes += bytes;
                           progress.Add(bytes);
                         });
          ++r.tensors;
          break;
        }
        case EntryKind::kScalar:
          writer->WriteScalar(key, ToScalar(key, e));
          ++r.other_entries;
          break;
        case EntryKind::kBytes: {
          const auto blob = src.ReadBytes(key);
          writer->WriteBytes(key, blob, 0);
          ++r.other_entries;
          break;
        }
        case EntryKind::kJson:
          writer->WriteJson(key, e.value);
          ++r.other_entries;
          break;
      }
    }
    const Metadata written = writer->Commit();
    r.files = written.files.size();
  }
  progress.Done();
  // Verified before it is put in place: structure always, data on request.
  VerifyOptions vo;
  vo.quick = !o.verify_data;
  const VerifyReport v = Verify(staging, vo);
  if (!v.ok()) {
    fs::remove_all(staging, ec);
    throw Error(ErrorCode::kCorrupt, "the merged checkpoint failed verification; nothing written:\n" +
                                         RenderVerifyText(v));
  }
  Install(staging, dst, o.force);
}

void WriteSafetensors(Source& src, const std::vector<Selected>& sel, const fs::path& dst,
                      const MergeOptions& o, uint64_t budget, MergeReport& r) {
  std::vector<SafetensorsWriter::TensorSpec> specs;
  std::vector<std::string> skipped;
  uint64_t total = 0;
  for (const auto& s : sel) {
    if (s.entry->kind != EntryKind::kTensor) {
      skipped.push_back(*s.key);
      continue;
    }
    specs.push_back({*s.key, OutType(*s.entry, o), s.entry->shape});
    total += s.entry->TensorBytes();
  }
  if (!skipped.empty())
    r.notes.push_back(std::to_string(skipped.size()) + " non-tensor entries not written (safetensors holds "
                      "tensors only), e.g. '" + skipped.front() + "'");
  // ckpt's user metadata becomes __metadata__ (string values kept, others as JSON text).
  std::vector<std::pair<std::string, std::string>> meta;
  const json user = json::parse(src.metadata().user.empty() ? "{}" : src.metadata().user, nullptr, false);
  if (user.is_object())
    for (auto it = user.begin(); it != user.end(); ++it)
      meta.emplace_back(it.key(), it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  SafetensorsWriter w(dst, specs, meta, o.force);
  detail::Progress progress("convert", total, o.progress);
  detail::Buffer in, out;
  for (const auto& s : sel) {
    if (s.entry->kind != EntryKind::kTensor) continue;
    StreamTensor(src, *s.key, *s.entry, Box::Full(s.entry->shape), OutType(*s.entry, o), budget, in, out,
                 [&](const Box&, const void* data, std::size_t bytes) {
                   w.Append(data, bytes);
                   r.bytes += bytes;
                   progress.Add(bytes);
                 });
    ++r.tensors;
    ++r.chunks;
  }
  progress.Done();
  w.Commit();
  r.other_entries = 0;
  r.files = 1;
  SafetensorsReader::Open(dst);  // the header we wrote parses back
}

void WriteVirtual(Source& src, const std::vector<Selected>& sel, const fs::path& dst,
                  const MergeOptions& o, MergeReport& r) {
  if (src.kind() != SourceKind::kCheckpoint)
    throw Error(ErrorCode::kInvalidArgument, "--virtual needs a checkpoint directory as source");
  if (o.cast || o.world > 0 || o.compression.codec != Compression::Codec::kNone)
    throw Error(ErrorCode::kInvalidArgument, "--virtual copies nothing: it cannot cast, reshard or compress");
  std::error_code ec;
  if (fs::exists(dst, ec) && !o.force)
    throw Error(ErrorCode::kAlreadyExists, dst.string() + ": already exists (use --force to replace it)");
  h5::Init();
  const fs::path tmp = Sibling(dst, ".virtual-tmp-");
  const fs::path src_dir = fs::absolute(src.path());
  std::vector<uint8_t> buf;
  try {
    h5::Handle file = h5::File(h5::Check(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT),
                                         tmp.string() + ": cannot create"));
    for (const auto& s : sel) {
      const EntryMeta& e = *s.entry;
      if (e.kind != EntryKind::kTensor) {
        r.notes.push_back("'" + *s.key + "' is a " + std::string(EntryKindName(e.kind)) +
                          " entry: not in the virtual file");
        continue;
      }
      const std::string name = h5::EscapeKey(*s.key);
      h5::Handle type = h5::FileType(e.dtype);
      std::vector<hsize_t> dims(e.shape.begin(), e.shape.end());
      h5::Handle space = h5::MakeSpace(dims);
      h5::Handle dcpl = h5::Plist(H5Pcreate(H5P_DATASET_CREATE));
      const bool copy = e.shape.empty();  // HDF5 has no virtual scalar datasets: copy the one element
      if (!copy) {
        for (const auto& c : e.chunks) {
          if (c.box.NumElements() == 0) continue;
          std::vector<hsize_t> start(c.box.offsets.begin(), c.box.offsets.end());
          std::vector<hsize_t> count(c.box.sizes.begin(), c.box.sizes.end());
          h5::Handle vsel = h5::Space(H5Scopy(space.get()));
          h5::Check(H5Sselect_hyperslab(vsel.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr),
                    "H5Sselect_hyperslab");
          h5::Handle srcspace = h5::MakeSpace(count);
          h5::Check(H5Pset_virtual(dcpl.get(), vsel.get(), (src_dir / c.file).c_str(), c.dataset.c_str(),
                                   srcspace.get()),
                    dst.string() + ": tensor '" + *s.key + "': H5Pset_virtual");
        }
      }
      h5::Handle ds = h5::Dataset(h5::Check(
          H5Dcreate2(file.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
          dst.string() + ": tensor '" + *s.key + "': cannot create dataset"));
      if (copy) {
        buf.resize(8);
        src.ReadRegion(*s.key, Box::Full(e.shape), buf.data());
        h5::Check(H5Dwrite(ds.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()), "H5Dwrite");
      }
      if (h5::NeedsDTypeAttr(e.dtype)) h5::WriteStringAttr(ds.get(), "dtype", std::string(DTypeName(e.dtype)));
      ++r.tensors;
      r.chunks += e.chunks.size();
      r.bytes += e.TensorBytes();
    }
    h5::Check(file.Close(), tmp.string() + ": cannot close");
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
  r.files = 1;
  fs::rename(tmp, dst, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw Error(ErrorCode::kIO, dst.string() + ": cannot rename into place: " + ec.message());
  }
}

}  // namespace

std::pair<int64_t, int64_t> RowRange(int64_t n, int world, int part) {
  const int64_t base = n / world, extra = n % world;
  const int64_t begin = part * base + std::min<int64_t>(part, extra);
  return {begin, begin + base + (part < extra ? 1 : 0)};
}

MergeReport Merge(const fs::path& src_path, const fs::path& dst, const MergeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  if (o.world < 0 || o.dim < 0 || o.dim >= 32)
    throw Error(ErrorCode::kInvalidArgument, "--world must be >= 1 and --dim in [0, 32)");
  if (o.cast && !IsFloating(*o.cast))
    throw Error(ErrorCode::kInvalidArgument, "--dtype must be a floating dtype, not " +
                                                 std::string(DTypeName(*o.cast)));
  std::error_code ec;
  if (fs::exists(dst, ec) && !o.force)
    throw Error(ErrorCode::kAlreadyExists, dst.string() + ": already exists (use --force to replace it)");
  if (fs::exists(dst, ec) && fs::equivalent(src_path, dst, ec))
    throw Error(ErrorCode::kInvalidArgument, dst.string() + ": source and destination are the same");
  auto src = Source::Open(src_path);
  const auto sel = Select(*src, o);
  MergeReport r;
  r.src = src_path.string();
  r.dst = dst.string();
  // Two block buffers (read, cast) of at most `budget` each, well inside max_memory.
  const uint64_t budget =
      std::max<uint64_t>(std::min<uint64_t>(o.chunk_bytes, o.max_memory / 8), uint64_t{1} << 16);
  if (o.virtual_file) {
    r.output = "virtual";
    WriteVirtual(*src, sel, dst, o, r);
  } else if (dst.extension() == ".safetensors") {
    if (o.world > 0)
      throw Error(ErrorCode::kInvalidArgument, "a .safetensors destination is one full file; drop --world");
    r.output = "safetensors";
    WriteSafetensors(*src, sel, dst, o, budget, r);
  } else {
    r.output = o.world > 0 ? "sharded checkpoint" : "full checkpoint";
    WriteCheckpoint(*src, sel, dst, o, budget, r);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string RenderMergeText(const MergeReport& r) {
  char buf[512];
  const double rate = r.seconds > 0 ? static_cast<double>(r.bytes) / r.seconds : 0;
  std::snprintf(buf, sizeof buf, "wrote %s (%s, %zu %s): %zu tensors in %zu chunks, %zu other entries, %s in %.2f s (%s/s)\n",
                r.dst.c_str(), r.output.c_str(), r.files, r.files == 1 ? "file" : "files", r.tensors, r.chunks,
                r.other_entries, detail::FormatBytes(static_cast<double>(r.bytes)).c_str(), r.seconds,
                detail::FormatBytes(rate).c_str());
  std::string out = buf;
  for (const auto& n : r.notes) out += "note: " + n + "\n";
  return out;
}

std::string RenderMergeJson(const MergeReport& r) {
  nlohmann::ordered_json j;
  j["src"] = r.src;
  j["dst"] = r.dst;
  j["output"] = r.output;
  j["files"] = r.files;
  j["tensors"] = r.tensors;
  j["chunks"] = r.chunks;
  j["other_entries"] = r.other_entries;
  j["bytes"] = r.bytes;
  j["seconds"] = r.seconds;
  j["notes"] = r.notes;
  return j.dump(2) + "\n";
}

}  // namespace ckpt::ops
