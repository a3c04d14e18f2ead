// ops/verify.cc: see ckpt/ops/verify.h.
//
// Structure first (metadata, files, tiling, datasets), on the calling thread; then data
// (checksums, finiteness) on `threads` threads, each with its own ShardReader per file
// (without the shard index: every dataset's own HDF5 header is checked),
// reading every chunk in blocks of kBlockBytes so memory stays bounded whatever the size.
#include "ckpt/ops/verify.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "ckpt/checkpoint.h"
#include "ckpt/error.h"
#include "ckpt/metadata.h"
#include "ckpt/ops/source.h"
#include "ops/json_schema.h"
#include "ops/util.h"
#include "storage/digest.h"
#include "storage/shard_reader.h"

namespace ckpt::ops {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kBlockBytes = uint64_t{8} << 20;

struct Ref {
  std::string type, dtype;
  Shape shape;
};

// A chunk whose data is read: its checksum recomputed and/or its elements checked.
struct DataJob {
  std::string key, file;
  DType dtype = DType::kUInt8;
  ChunkMeta chunk;  // a copy: bytes entries get a 1-D box here
  bool hash = true, finite = false;
  std::string problem_check, problem;  // filled by the worker
};

std::string TensorWhere(const std::string& file, const std::string& key, const ChunkMeta* c) {
  std::string s = file.empty() ? "" : file + ": ";
  s += "tensor '" + key + "'";
  if (c) s += " chunk " + c->box.ToString();
  return s;
}

class Collector {
 public:
  explicit Collector(VerifyReport& r) : r_(r) {}
  void Add(std::string check, std::string file, std::string key, std::string message) {
    r_.problems.push_back({std::move(check), std::move(file), std::move(key), std::move(message)});
  }

 private:
  VerifyReport& r_;
};

void CheckSchema(const std::string& text, const VerifyOptions& o, Collector& c) {
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return;  // ParseMetadata reports the JSON error precisely
  json schema = json::parse(o.schema ? detail::ReadFileText(*o.schema)
                                     : std::string(detail::EmbeddedMetadataSchema()),
                            nullptr, false);
  if (schema.is_discarded())
    throw Error(ErrorCode::kInvalidArgument, "the JSON schema is not valid JSON");
  detail::JsonSchema validator(std::move(schema));
  for (const auto& e : validator.Validate(doc))
    c.Add("metadata", kMetadataFileName, "", std::string(kMetadataFileName) + ": schema: " + e);
}

std::map<std::string, Ref> LoadReference(const fs::path& ref) {
  std::map<std::string, Ref> out;
  std::error_code ec;
  if (fs::is_regular_file(ref, ec) && ref.extension() == ".json") {
    json j = json::parse(detail::ReadFileText(ref), nullptr, false);
    const json* keys = j.is_object() && j.contains("keys") ? &j["keys"] : j.is_array() ? &j : nullptr;
    if (!keys || !keys->is_array())
      throw Error(ErrorCode::kInvalidArgument,
                  ref.string() + ": not a key list (expected the JSON of ckpt-inspect --json)");
    for (const auto& k : *keys) {
      if (!k.is_object() || !k.contains("key") || !k["key"].is_string())
        throw Error(ErrorCode::kInvalidArgument, ref.string() + ": key list entry without a \"key\"");
      Ref r;
      r.type = k.value("type", "tensor");
      r.dtype = k.value("dtype", "");
      if (k.contains("shape")) r.shape = k["shape"].get<Shape>();
      out[k["key"].get<std::string>()] = r;
    }
    return out;
  }
  auto src = Source::Open(ref);
  for (const auto& [key, e] : src->metadata().entries) {
    Ref r;
    r.type = std::string(EntryKindName(e.kind));
    if (e.kind == EntryKind::kTensor || e.kind == EntryKind::kScalar) r.dtype = std::string(DTypeName(e.dtype));
    if (e.kind == EntryKind::kTensor) r.shape = e.shape;
    out[key] = r;
  }
  return out;
}

void CheckExpect(const Metadata& md, const fs::path& ref_path, Collector& c) {
  const auto ref = LoadReference(ref_path);
  const std::string ref_name = ref_path.string();
  std::map<std::string, const EntryMeta*> mine;
  for (const auto& [k, e] : md.entries) mine[k] = &e;
  for (const auto& [k, r] : ref) {
    auto it = mine.find(k);
    if (it == mine.end()) {
      c.Add("expect", "", k, "key '" + k + "' is in " + ref_name + " but missing here");
      continue;
    }
    const EntryMeta& e = *it->second;
    const std::string type(EntryKindName(e.kind));
    if (type != r.type) {
      c.Add("expect", "", k, "key '" + k + "' is a " + type + ", " + ref_name + " has a " + r.type);
      continue;
    }
    if (!r.dtype.empty() && (e.kind == EntryKind::kTensor || e.kind == EntryKind::kScalar) &&
        DTypeName(e.dtype) != r.dtype)
      c.Add("expect", "", k, "key '" + k + "' has dtype " + std::string(DTypeName(e.dtype)) + ", " +
                                 ref_name + " has " + r.dtype);
    if (e.kind == EntryKind::kTensor && e.shape != r.shape)
      c.Add("expect", "", k, "key '" + k + "' has shape " + detail::FormatShape(e.shape) + ", " +
                                 ref_name + " has " + detail::FormatShape(r.shape));
  }
  for (const auto& [k, e] : mine)
    if (!ref.count(k)) c.Add("expect", "", k, "key '" + k + "' is not in " + ref_name);
}

// Reads every job's chunk block by block on `threads` threads.
uint64_t RunDataJobs(const fs::path& dir, std::vector<DataJob>& jobs, int threads, bool progress_on) {
  uint64_t total = 0;
  for (const auto& j : jobs)
    total += static_cast<uint64_t>(j.chunk.box.NumElements()) * DTypeSize(j.dtype);
  std::atomic<std::size_t> next{0};
  std::atomic<uint64_t> done{0};
  std::atomic<int> running{0};
  auto worker = [&] {
    std::map<std::string, std::unique_ptr<storage::ShardReader>> readers;
    std::vector<uint8_t> buf;
    for (;;) {
      const std::size_t i = next.fetch_add(1);
      if (i >= jobs.size()) break;
      DataJob& job = jobs[i];
      try {
        auto& reader = readers[job.file];
        if (!reader) reader = std::make_unique<storage::ShardReader>(dir, job.file, /*use_index=*/false);
        const std::size_t item = DTypeSize(job.dtype);
        storage::Digest digest(job.dtype, job.finite);
        for (const Box& block : detail::SplitBox(job.chunk.box, item, kBlockBytes)) {
          const auto bytes = static_cast<std::size_t>(block.NumElements()) * item;
          buf.resize(std::max<std::size_t>(bytes, 8));
          reader->Read(job.key, job.dtype, job.chunk, block, buf.data(), block, nullptr);
          digest.Update(buf.data(), bytes);
          done.fetch_add(bytes);
        }
        if (job.hash && digest.Checksum() != job.chunk.checksum) {
          job.problem_check = "checksums";
          job.problem = TensorWhere(job.file, job.key, &job.chunk) + ": checksum mismatch: metadata says " +
                        job.chunk.checksum + ", the data hashes to " + digest.Checksum();
        } else if (job.finite) {
          const auto stats = digest.Stats();
          if (stats && (stats->nan_count || stats->inf_count)) {
            job.problem_check = "finite";
            job.problem = TensorWhere(job.file, job.key, &job.chunk) + ": " +
                          std::to_string(stats->nan_count) + " NaN and " +
                          std::to_string(stats->inf_count) + " Inf elements";
          }
        }
      } catch (const std::exception& e) {
        job.problem_check = "datasets";  // missing dataset, wrong dtype or extent, short read
        job.problem = e.what();
      }
    }
    running.fetch_sub(1);
  };
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(jobs.size())));
  running = n;
  std::vector<std::thread> pool;
  for (int t = 0; t < n; ++t) pool.emplace_back(worker);
  detail::Progress progress("verify", total, progress_on);
  uint64_t shown = 0;
  while (running.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const uint64_t d = done.load();
    progress.Add(d - shown);
    shown = d;
  }
  for (auto& t : pool) t.join();
  progress.Done();
  return done.load();
}

// A lone shard or a safetensors file: what its self-description allows.
void VerifyFile(const fs::path& path, const VerifyOptions& o, VerifyReport& r, Collector& c) {
  std::unique_ptr<Source> src;
  try {
    src = Source::Open(path);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound || e.code() == ErrorCode::kIO) throw;
    c.Add("metadata", path.filename().string(), "", e.what());
    return;
  }
  const Metadata& md = src->metadata();
  r.files = 1;
  std::vector<uint8_t> buf;
  for (const auto& [key, e] : md.entries) {
    if (e.kind != EntryKind::kTensor) continue;
    ++r.keys;
    r.chunks += e.chunks.size();
    if (o.quick && !o.check_finite) continue;
    const std::size_t item = DTypeSize(e.dtype);
    try {
      storage::Digest digest(e.dtype, true);
      for (const auto& ch : e.chunks)
        for (const Box& block : detail::SplitBox(ch.box, item, kBlockBytes)) {
          const auto bytes = static_cast<std::size_t>(block.NumElements()) * item;
          buf.resize(std::max<std::size_t>(bytes, 8));
          src->ReadRegion(key, block, buf.data());
          if (o.check_finite) digest.Update(buf.data(), bytes);
          r.bytes_read += bytes;
        }
      const auto stats = digest.Stats();
      if (o.check_finite && stats && (stats->nan_count || stats->inf_count))
        c.Add("finite", path.filename().string(), key,
              TensorWhere(path.filename().string(), key, nullptr) + ": " + std::to_string(stats->nan_count) +
                  " NaN and " + std::to_string(stats->inf_count) + " Inf elements");
    } catch (const Error& e2) {
      c.Add("datasets", path.filename().string(), key, e2.what());
    }
  }
  if (o.expect) CheckExpect(md, *o.expect, c);
}

}  // namespace

VerifyReport Verify(const fs::path& path, const VerifyOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  VerifyReport r;
  r.path = path.string();
  r.quick = o.quick;
  Collector c(r);
  auto finish = [&] {
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  };
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw Error(ErrorCode::kNotFound, path.string() + ": no such file or directory");
  if (!fs::is_directory(st)) {
    VerifyFile(path, o, r, c);
    return finish();
  }

  // metadata
  const fs::path meta_path = path / kMetadataFileName;
  if (!fs::exists(meta_path, ec)) {
    c.Add("metadata", kMetadataFileName, "",
          path.string() + ": no metadata.json: not a committed checkpoint (an interrupted save?)");
    return finish();
  }
  const std::string text = detail::ReadFileText(meta_path);
  CheckSchema(text, o, c);
  Metadata md;
  try {
    md = ParseMetadata(text, kMetadataFileName);
  } catch (const Error& e) {
    c.Add("metadata", kMetadataFileName, "", e.what());
    return finish();
  }
  md.BuildIndex();
  r.keys = md.entries.size();
  r.files = md.files.size();

  // files
  std::map<std::string, bool> file_ok;
  for (const auto& f : md.files) {
    file_ok[f.name] = false;
    if (!IsSafeFileName(f.name)) {
      c.Add("files", f.name, "", "file name '" + f.name + "' escapes the checkpoint directory");
      continue;
    }
    const fs::path p = path / f.name;
    struct stat sb;
    if (::lstat(p.c_str(), &sb) != 0) {
      c.Add("files", f.name, "", f.name + ": missing (listed in metadata.json for rank " +
                                     std::to_string(f.rank) + ")");
      continue;
    }
    if (!S_ISREG(sb.st_mode)) {
      c.Add("files", f.name, "", f.name + ": not a regular file (symlinks and devices are refused)");
      continue;
    }
    if (static_cast<uint64_t>(sb.st_size) != f.bytes)
      c.Add("files", f.name, "", f.name + ": size is " + std::to_string(sb.st_size) +
                                     " bytes, metadata says " + std::to_string(f.bytes) +
                                     (static_cast<uint64_t>(sb.st_size) < f.bytes ? " (truncated?)" : ""));
    try {
      storage::ShardReader probe(path, f.name, /*use_index=*/false);
      file_ok[f.name] = true;
    } catch (const Error& e) {
      c.Add("files", f.name, "", e.what());
    }
  }

  // tiling, datasets
  std::vector<DataJob> jobs;
  std::map<std::string, std::unique_ptr<storage::ShardReader>> readers;
  uint8_t tiny[8];
  for (const auto& [key, e] : md.entries) {
    if (e.kind == EntryKind::kScalar || e.kind == EntryKind::kJson) continue;
    if (e.kind == EntryKind::kTensor)
      for (const auto& msg : CheckTiling(key, e)) c.Add("tiling", "", key, msg);
    for (const auto& chunk : e.chunks) {
      ++r.chunks;
      if (!file_ok[chunk.file]) continue;  // already reported under "files"
      DataJob job;
      job.key = key;
      job.file = chunk.file;
      job.dtype = e.dtype;
      job.chunk = chunk;
      if (e.kind == EntryKind::kBytes) {
        job.dtype = DType::kUInt8;
        job.chunk.box = Box{{0}, {static_cast<int64_t>(e.size)}};
      }
      const bool floating = e.kind == EntryKind::kTensor && IsFloating(e.dtype);
      job.finite = o.check_finite && floating && !(o.quick && chunk.stats);  // quick: trust recorded stats
      job.hash = !o.quick;
      if (job.hash || job.finite) {
        jobs.push_back(std::move(job));  // reading it checks its dataset too
        continue;
      }
      // Dataset exists with the dtype and extent metadata says (an empty read checks only).
      try {
        auto& reader = readers[chunk.file];
        if (!reader) reader = std::make_unique<storage::ShardReader>(path, chunk.file, /*use_index=*/false);
        Box probe{job.chunk.box.offsets, Shape(job.chunk.box.sizes.size(), 0)};
        if (job.chunk.box.sizes.empty() || job.chunk.box.NumElements() == 0) probe = job.chunk.box;
        reader->Read(key, job.dtype, job.chunk, probe, tiny, probe, nullptr);
      } catch (const Error& err) {
        c.Add("datasets", chunk.file, key, err.what());
        continue;
      }
      if (o.check_finite && floating && chunk.stats && (chunk.stats->nan_count || chunk.stats->inf_count))
        c.Add("finite", chunk.file, key, TensorWhere(chunk.file, key, &chunk) + ": " +
                                             std::to_string(chunk.stats->nan_count) + " NaN and " +
                                             std::to_string(chunk.stats->inf_count) +
                                             " Inf elements (recorded statistics)");
    }
  }
  readers.clear();

  // checksums, finite
  r.bytes_read = RunDataJobs(path, jobs, o.threads, o.progress);
  for (const auto& j : jobs)
    if (!j.problem.empty()) c.Add(j.problem_check, j.file, j.key, j.problem);

  if (o.expect) CheckExpect(md, *o.expect, c);
  return finish();
}

namespace {

std::string Summary(const VerifyReport& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%zu keys, %zu chunks, %zu files; %s read in %.2f s", r.keys, r.chunks,
                r.files, detail::FormatBytes(static_cast<double>(r.bytes_read)).c_str(), r.seconds);
  return buf;
}

std::string XmlEscape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += ch;
    }
  }
  return o;
}

constexpr const char* kChecks[] = {"metadata", "files", "tiling", "datasets", "checksums", "finite", "expect"};

}  // namespace

std::string RenderVerifyText(const VerifyReport& r) {
  std::ostringstream out;
  for (const auto& p : r.problems) out << "  " << p.check << ": " << p.message << "\n";
  if (r.ok())
    out << "OK: " << r.path << (r.quick ? " (quick: data not read)" : "") << ": " << Summary(r) << "\n";
  else
    out << "FAILED: " << r.path << ": " << r.problems.size()
        << (r.problems.size() == 1 ? " problem" : " problems") << " (" << Summary(r) << ")\n";
  return out.str();
}

std::string RenderVerifyJson(const VerifyReport& r) {
  nlohmann::ordered_json j;
  j["path"] = r.path;
  j["ok"] = r.ok();
  j["quick"] = r.quick;
  j["keys"] = r.keys;
  j["chunks"] = r.chunks;
  j["files"] = r.files;
  j["bytes_read"] = r.bytes_read;
  j["seconds"] = r.seconds;
  j["problems"] = nlohmann::ordered_json::array();
  for (const auto& p : r.problems)
    j["problems"].push_back({{"check", p.check}, {"file", p.file}, {"key", p.key}, {"message", p.message}});
  return j.dump(2) + "\n";
}

std::string RenderVerifyJUnit(const VerifyReport& r) {
  std::ostringstream out;
  std::size_t failures = 0;
  for (const char* check : kChecks)
    for (const auto& p : r.problems)
      if (p.check == check) {
        ++failures;
        break;
      }
  out << "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      << "<testsuites>\n<testsuite name=\"ckpt-verify\" tests=\"" << std::size(kChecks) << "\" failures=\""
      << failures << "\" errors=\"0\" time=\"" << r.seconds << "\">\n";
  for (const char* check : kChecks) {
    out << "  <testcase classname=\"ckpt-verify." << XmlEscape(r.path) << "\" name=\"" << check << "\"";
    std::string text;
    std::size_t n = 0;
    for (const auto& p : r.problems)
      if (p.check == check) text += p.message + "\n", ++n;
    const bool skipped = (r.quick && std::string(check) == "checksums");
    if (n == 0) {
      out << (skipped ? "><skipped/></testcase>\n" : "/>\n");
    } else {
      out << ">\n    <failure message=\"" << n << (n == 1 ? " problem" : " problems") << "\">"
          << XmlEscape(text) << "</failure>\n  </testcase>\n";
    }
  }
  out << "</testsuite>\n</testsuites>\n";
  return out.str();
}

}  // namespace ckpt::ops
