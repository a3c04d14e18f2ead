// ops/verify.cc: see ckpt/ops/verify.h. The checkpoint itself is checked by libckpt
// (ckpt/verify.h: files, indexes, tiling, datasets, data); this adds what only the tools
// check: metadata.json against a JSON Schema (on a thread of its own, beside libckpt's
// checks), the keys against a reference (--expect), lone shards and safetensors files, and
// the report's renderings (text, JSON, JUnit).
#include "ckpt/ops/verify.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "ckpt/digest.h"
#include "ckpt/error.h"
#include "ckpt/metadata.h"
#include "ckpt/ops/safetensors.h"
#include "ckpt/ops/source.h"
#include "ops/json_schema.h"
#include "ops/util.h"

namespace ckpt::ops {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kBlockBytes = uint64_t{8} << 20;

struct Ref {
  std::string type, dtype;
  Shape shape;
};


// Files problems into a report.
struct Collector {
  std::vector<VerifyProblem>& problems;
  void Add(std::string check, std::string file, std::string key, std::string message) {
    problems.push_back({std::move(check), std::move(file), std::move(key), std::move(message)});
  }
};

// Builds the tree of metadata.json except the members of its top-level "entries" object:
// each is handed to `on_entry(key, value)` as soon as it is complete, then dropped. (The
// tree of a 100,000-key document would be about ten times its text.) Values are placed
// as nlohmann's own tree builder places them (a repeated key keeps the last value).
class EntriesDiverter final : public nlohmann::json_sax<json> {
 public:
  using OnEntry = std::function<void(const std::string&, const json&)>;
  explicit EntriesDiverter(OnEntry on_entry) : on_entry_(std::move(on_entry)) {}
  json& root() { return root_; }

  bool null() override { return Add(json(nullptr)); }
  bool boolean(bool v) override { return Add(json(v)); }
  bool number_integer(number_integer_t v) override { return Add(json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return Add(json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return Add(json(v)); }
  bool string(string_t& v) override { return Add(json(std::move(v))); }
  bool binary(binary_t& v) override { return Add(json::binary(std::move(v))); }
  bool start_object(std::size_t) override { return Open(json::object()); }
  bool start_array(std::size_t) override { return Open(json::array()); }
  bool end_object() override { return Close(); }
  bool end_array() override { return Close(); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  // Puts v in the innermost open container (under key_ in an object).
  json* Place(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *open_.back();
    if (top.is_object()) {
      json& slot = top[key_];
      slot = std::move(v);
      return &slot;
    }
    top.push_back(std::move(v));
    return &top.back();
  }
  bool Add(json&& v) {
    Done(Place(std::move(v)));
    return true;
  }
  bool Open(json&& v) {
    json* p = Place(std::move(v));
    if (open_.size() == 1 && key_ == "entries" && p->is_object()) entries_ = p;
    open_.push_back(p);
    keys_.push_back(key_);
    return true;
  }
  bool Close() {
    json* p = open_.back();
    open_.pop_back();
    key_ = std::move(keys_.back());
    keys_.pop_back();
    Done(p);
    return true;
  }
  // A value just completed: an entry when its container is the top-level "entries".
  void Done(const json* p) {
    if (entries_ == nullptr || open_.size() != 2 || open_[1] != entries_) return;
    on_entry_(key_, *p);
    entries_->erase(key_);
  }

  OnEntry on_entry_;
  json root_;
  std::vector<json*> open_;         // the containers being built, outermost first
  std::vector<std::string> keys_;   // the key each of them sits under
  std::string key_;
  json* entries_ = nullptr;
};

// The part of `schema` that applies to each member of "entries", as a schema of its own
// over a one-member object, when "entries" constrains only its members one at a time
// (the shipped schema does); null otherwise (e.g. a --schema with maxProperties there).
json EntriesSchema(const json& schema) {
  if (!schema.is_object() || !schema.contains("properties") || !schema["properties"].is_object()) return nullptr;
  const json& props = schema["properties"];
  if (!props.contains("entries") || !props["entries"].is_object()) return nullptr;
  static const std::set<std::string> kPerMember = {"type", "propertyNames", "additionalProperties", "title",
                                                   "description", "$comment"};
  for (const auto& [k, v] : props["entries"].items())
    if (!kPerMember.count(k)) return nullptr;
  if (props["entries"].contains("type") && props["entries"]["type"] != "object") return nullptr;
  json defs = schema.contains("$defs") && schema["$defs"].is_object() ? schema["$defs"] : json::object();
  if (defs.contains("ckpt-entries")) return nullptr;
  defs["ckpt-entries"] = props["entries"];
  return json{{"$defs", std::move(defs)}, {"$ref", "#/$defs/ckpt-entries"}};
}

// Validates metadata.json against the schema. Entries are checked one at a time against
// the schema's per-entry part, so no tree of the whole document is built; the violations
// (and their JSON pointers) are those a check of the whole tree reports.
void CheckSchema(const std::string& text, const VerifyOptions& o, Collector& c) {
  json schema = json::parse(o.schema ? detail::ReadFileText(*o.schema)
                                     : std::string(detail::EmbeddedMetadataSchema()),
                            nullptr, false);
  if (schema.is_discarded())
    throw Error(ErrorCode::kInvalidArgument, "the JSON schema is not valid JSON");
  constexpr std::size_t kLimit = 100;
  std::vector<std::string> errors;
  json per_entry = EntriesSchema(schema);
  const detail::JsonSchema validator(std::move(schema));
  json doc;
  if (per_entry.is_null()) {
    doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return;  // ParseMetadata reports the JSON error precisely
  } else {
    const detail::JsonSchema entry_validator(std::move(per_entry));
    json one = json::object();
    EntriesDiverter sax([&](const std::string& key, const json& value) {
      if (errors.size() >= kLimit) return;
      one.clear();
      one[key] = value;
      for (auto& e : entry_validator.Validate(one, kLimit - errors.size())) errors.push_back("/entries" + e);
    });
    if (!json::sax_parse(text, &sax)) return;  // ParseMetadata reports the JSON error precisely
    doc = std::move(sax.root());
  }
  // The rest (with "entries" emptied of what was checked above), violations first-found first.
  std::vector<std::string> rest = validator.Validate(doc, kLimit);
  rest.insert(rest.end(), errors.begin(), errors.end());
  if (rest.size() > kLimit) rest.resize(kLimit);
  for (const auto& e : rest)
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

// A lone shard or safetensors (a file, or the Hub's sharded layout): what its self-description allows.
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
  r.files = md.files.size();
  std::vector<uint8_t> buf;
  for (const auto& [key, e] : md.entries) {
    if (e.kind != EntryKind::kTensor) continue;
    ++r.keys;
    r.chunks += e.chunks.size();
    if (o.quick && !o.check_finite) continue;
    const std::size_t item = DTypeSize(e.dtype);
    try {
      ChunkDigest digest(e.dtype, true);
      for (const auto& ch : e.chunks)
        for (const Box& block : SplitBox(ch.box, item, kBlockBytes)) {
          const auto bytes = static_cast<std::size_t>(block.NumElements()) * item;
          buf.resize(std::max<std::size_t>(bytes, 8));
          src->ReadRegion(key, block, buf.data());
          if (o.check_finite) digest.Update(buf.data(), bytes);
          r.bytes_read += bytes;
        }
      const auto stats = digest.Stats();
      if (o.check_finite && stats && (stats->nan_count || stats->inf_count))
        c.Add("finite", path.filename().string(), key,
              path.filename().string() + ": tensor '" + key + "': " + std::to_string(stats->nan_count) +
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
  std::error_code ec;
  if (!IsObjectUrl(path)) {
    const auto st = fs::status(path, ec);
    if (ec || !fs::exists(st)) throw Error(ErrorCode::kNotFound, path.string() + ": no such file or directory");
    if (!fs::is_directory(st) || (!fs::exists(path / kMetadataFileName, ec) && FindHubModel(path))) {
      VerifyReport r;  // a lone shard, a safetensors file or a Hub sharded-safetensors directory
      r.path = path.string();
      r.quick = o.quick;
      Collector c{r.problems};
      VerifyFile(path, o, r, c);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return r;
    }
  }
  CheckOptions co;
  co.quick = o.quick;
  co.check_finite = o.check_finite;
  co.threads = o.threads;
  co.group_chunks = o.group_chunks;
  std::unique_ptr<detail::Progress> progress;  // one line per group of files
  uint64_t shown = 0, group_total = 0;
  if (o.progress) {
    co.progress = [&](uint64_t done, uint64_t total) {
      if (!progress || total != group_total || done < shown) {
        if (progress) progress->Done();
        progress = std::make_unique<detail::Progress>("verify", total, true);
        shown = 0;
        group_total = total;
      }
      progress->Add(done - shown);
      shown = done;
    };
  }
  // Entries are validated one at a time (CheckSchema), so the check holds no tree of them.
  co.check_text = [&](const std::string& text) {
    VerifyReport sr;
    Collector sc{sr.problems};
    CheckSchema(text, o, sc);
    return std::move(sr.problems);
  };
  if (o.expect) {
    co.check_metadata = [&](const Metadata& md) {
      VerifyReport er;
      Collector ec2{er.problems};
      CheckExpect(md, *o.expect, ec2);
      return std::move(er.problems);
    };
  }
  VerifyReport r = VerifyCheckpoint(path, co);
  if (progress) progress->Done();
  return r;
}

namespace {

std::string Summary(const VerifyReport& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%zu keys, %zu chunks, %zu files; %s read in %.2f s", r.keys, r.chunks,
                r.files, detail::FormatBytes(static_cast<double>(r.bytes_read)).c_str(), r.seconds);
  return (r.format_version ? "format v" + std::to_string(r.format_version) + ", " : std::string()) + buf;
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

constexpr const char* kChecks[] = {"metadata", "files", "index", "tiling", "datasets", "checksums", "finite", "expect"};

}  // namespace

std::string RenderVerifyText(const VerifyReport& r) {
  std::ostringstream out;
  for (const auto& p : r.problems) out << "  " << p.check << ": " << p.message << "\n";
  if (r.ok())
    out << "OK: " << r.path << (r.quick ? " (quick: data not read)" : "") << ": " << Summary(r) << "\n";
  else
    out << "FAILED: " << r.path << ": " << r.problems.size()
        << (r.problems.size() == 1 ? " problem" : " problems") << " (" << Summary(r) << ")\n";
  if (r.mode == "ranged")
    out << "  (ranged: metadata.json, each object's size and shard index, tiling"
        << (r.quick ? "" : ", every chunk's checksum and block digests")
        << "; HDF5 headers and stray datasets are checked on a local copy only)\n";
  if (r.mode == "downloaded")
    out << "  (downloaded: ranged reads cannot check this one, or --check-finite needs every value;"
           " checked whole on a local copy, removed after)\n";
  return out.str();
}

std::string RenderVerifyJson(const VerifyReport& r) {
  nlohmann::ordered_json j;
  j["path"] = r.path;
  j["ok"] = r.ok();
  j["quick"] = r.quick;
  j["mode"] = r.mode.empty() ? "local" : r.mode;
  j["format_version"] = r.format_version ? nlohmann::ordered_json(r.format_version) : nlohmann::ordered_json(nullptr);
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
