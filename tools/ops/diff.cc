// ops/diff.cc: see ckpt/ops/diff.h.
#include "ckpt/ops/diff.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/digest.h"
#include "ckpt/error.h"
#include "ckpt/ops/source.h"
#include "ops/elements.h"
#include "ops/util.h"

namespace ckpt::ops {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct ValueStats {
  double max_abs = 0, max_rel = 0;
  uint64_t different = 0, nan = 0;
};

// Compares one block of n elements. Exact (no tolerance): identical stored bits are the
// same value, a NaN included; elements whose bits differ compare as numbers. With a
// tolerance the comparison is IEEE's: a NaN differs from everything, itself included,
// unless nan_equal.
void CompareBlock(DType dtype, const uint8_t* a, const uint8_t* b, std::size_t n, const DiffOptions& o,
                  ValueStats& s) {
  const std::size_t item = DTypeSize(dtype);
  const bool floating = IsFloating(dtype);
  const bool exact = o.atol == 0 && o.rtol == 0;
  if (std::memcmp(a, b, n * item) == 0) {
    if (!floating || exact || o.nan_equal) return;
    // Equal bytes, but under a tolerance NaN is not equal to NaN unless asked.
    int64_t nan = 0, inf = 0;
    detail::CountNonFinite(dtype, a, n, &nan, &inf);
    s.different += static_cast<uint64_t>(nan);
    s.nan += static_cast<uint64_t>(nan);
    return;
  }
  auto one = [&](double x, double y, bool bytes_equal) {
    if (std::isnan(x) || std::isnan(y)) {
      if (!(std::isnan(x) && std::isnan(y) && o.nan_equal)) ++s.different, ++s.nan;
      return;
    }
    if (x == y) {
      // Integers beyond 2^53 may convert equal: their bytes decide.
      if (!bytes_equal && !floating && exact) ++s.different;
      return;
    }
    const double d = std::fabs(x - y);
    const double rel = y != 0 ? d / std::fabs(y) : INFINITY;
    s.max_abs = std::max(s.max_abs, d);
    s.max_rel = std::max(s.max_rel, rel);
    if (!(d <= o.atol + o.rtol * std::fabs(y))) ++s.different;
  };
  if (dtype == DType::kFloat32) {
    for (std::size_t i = 0; i < n; ++i) {
      float x, y;
      std::memcpy(&x, a + 4 * i, 4);
      std::memcpy(&y, b + 4 * i, 4);
      if (x == y && !std::isnan(x)) continue;
      if (exact && std::memcmp(a + 4 * i, b + 4 * i, 4) == 0) continue;
      one(x, y, false);
    }
    return;
  }
  const int values = DTypeValues(dtype);  // float4_e2m1fn_x2: each of the pair's values compared
  double x[2], y[2];
  for (std::size_t i = 0; i < n; ++i) {
    const bool eq = std::memcmp(a + i * item, b + i * item, item) == 0;
    if (eq && (!floating || exact)) continue;
    ElementValues(dtype, a + i * item, x);
    ElementValues(dtype, b + i * item, y);
    const uint64_t before = s.different;
    for (int j = 0; j < values; ++j) one(x[j], y[j], eq);
    s.different = std::min(s.different, before + 1);  // elements are counted, not values
  }
}

std::string Describe(const EntryMeta& e) {
  if (e.kind == EntryKind::kTensor)
    return std::string(DTypeName(e.dtype)) + " " + detail::FormatShape(e.shape);
  if (e.kind == EntryKind::kScalar) return "scalar " + std::string(DTypeName(e.dtype)) + " " + e.value;
  return std::string(EntryKindName(e.kind));
}

std::string ContentHash(Source& src, const std::string& key, const EntryMeta& e, uint64_t budget,
                        detail::Buffer& buf) {
  ChunkDigest d(e.dtype, false);
  const std::size_t item = DTypeSize(e.dtype);
  for (const Box& block : SplitBox(Box::Full(e.shape), item, budget)) {
    const auto bytes = static_cast<std::size_t>(block.NumElements()) * item;
    uint8_t* p = buf.Get(std::max<std::size_t>(bytes, 8));
    if (bytes) src.ReadRegion(key, block, p);
    d.Update(p, bytes);
  }
  return d.Checksum();
}

// Compares tensor `key` of A and B block by block.
ValueStats CompareTensor(Source& a, Source& b, const std::string& key, const EntryMeta& e, uint64_t budget,
                         const DiffOptions& o, detail::Buffer& ba, detail::Buffer& bb,
                         const std::function<void(uint64_t)>& done) {
  ValueStats s;
  const std::size_t item = DTypeSize(e.dtype);
  for (const Box& block : SplitBox(Box::Full(e.shape), item, budget)) {
    const auto n = static_cast<std::size_t>(block.NumElements());
    uint8_t* pa = ba.Get(std::max<std::size_t>(n * item, 8));
    uint8_t* pb = bb.Get(std::max<std::size_t>(n * item, 8));
    if (n) {
      a.ReadRegion(key, block, pa);
      b.ReadRegion(key, block, pb);
    }
    CompareBlock(e.dtype, pa, pb, n, o, s);
    done(n * item);
  }
  return s;
}

// Compares the values of `jobs` (tensors of the same dtype and shape in A and B) on
// o.threads threads (automatic: up to kDiffThreads), each with its own pair of sources (the calling thread uses
// `a` and `b`); tensors are handed out largest first. Memory: two blocks per thread.
constexpr int kDiffThreads = 4;
constexpr uint64_t kParallelBytes = uint64_t{64} << 20;  // below this, one thread

std::vector<ValueStats> CompareAll(Source& a, Source& b, const std::vector<std::pair<const std::string*, const EntryMeta*>>& jobs,
                                   uint64_t max_memory, const DiffOptions& o, detail::Progress& progress) {
  std::vector<ValueStats> out(jobs.size());
  uint64_t total = 0;
  for (const auto& j : jobs) total += j.second->TensorBytes();
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int wanted = o.threads > 0 ? o.threads : total < kParallelBytes ? 1 : std::min(kDiffThreads, hw);
  const int threads = std::max(1, std::min(wanted, static_cast<int>(jobs.size())));
  const uint64_t budget = std::max<uint64_t>(
      std::min<uint64_t>(detail::kCacheBlockBytes, max_memory / (8 * static_cast<uint64_t>(std::max(threads, 1)))),
      uint64_t{1} << 16);
  std::vector<std::size_t> order(jobs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    return jobs[x].second->TensorBytes() > jobs[y].second->TensorBytes();
  });
  std::atomic<std::size_t> next{0};
  std::mutex mu;  // guards `failed` and `progress`
  std::exception_ptr failed;
  auto fail = [&] {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed) failed = std::current_exception();
    next = order.size();  // the others stop after their current tensor
  };
  auto work = [&](Source& sa, Source& sb) {
    detail::Buffer ba, bb;
    try {
      for (std::size_t k; (k = next.fetch_add(1)) < order.size();) {
        const auto& [key, e] = jobs[order[k]];
        out[order[k]] = CompareTensor(sa, sb, *key, *e, budget, o, ba, bb, [&](uint64_t n) {
          std::lock_guard<std::mutex> lock(mu);
          progress.Add(n);
        });
      }
    } catch (...) {
      fail();
    }
  };
  auto pool = detail::StartThreads(static_cast<std::size_t>(threads - 1), [&](std::size_t) {
      try {
        auto sa = a.Reopen();  // the same checkpoints, not whatever is at their paths now
        auto sb = b.Reopen();
        work(*sa, *sb);
      } catch (...) {
        fail();
      }
    });
  work(a, b);
  for (auto& t : pool) t.join();
  if (failed) std::rethrow_exception(failed);
  return out;
}

using Keyed = std::pair<const std::string*, const EntryMeta*>;

// The entries of A and B that the diff takes (not excluded; tensors only against a
// safetensors file), sorted into those only in A, only in B, and in both.
struct KeySets {
  std::vector<Keyed> only_a, only_b, both;
  std::size_t skipped = 0;  // non-tensor entries left out against a safetensors file
};
KeySets SelectKeys(const Source& a, const Source& b, const DiffOptions& o) {
  KeySets s;
  // safetensors holds tensors only: other entries cannot be compared against it.
  const bool tensors_only = a.kind() == SourceKind::kSafetensors || b.kind() == SourceKind::kSafetensors;
  auto selected = [&](const std::string& key, const EntryMeta& e) {
    if (detail::MatchesAny(o.exclude, key)) return false;
    if (tensors_only && e.kind != EntryKind::kTensor) {
      ++s.skipped;
      return false;
    }
    return true;
  };
  for (const auto& [k, e] : a.metadata().entries) {
    if (!selected(k, e)) continue;
    const EntryMeta* other = b.metadata().Find(k);
    if (other && selected(k, *other)) s.both.emplace_back(&k, &e);
    else if (!other) s.only_a.emplace_back(&k, &e);
  }
  for (const auto& [k, e] : b.metadata().entries)
    if (selected(k, e) && !a.metadata().Find(k)) s.only_b.emplace_back(&k, &e);
  return s;
}

// Keys only in A or only in B, as diffs; a key only in A and one only in B with the same
// dtype, shape and values (unless keys_only) is one "renamed" diff instead.
void AddUnpaired(Source& a, Source& b, const KeySets& keys, const DiffOptions& o, DiffReport& r) {
  const uint64_t budget = std::max<uint64_t>(std::min(detail::kCacheBlockBytes, o.max_memory / 8), uint64_t{1} << 16);
  detail::Buffer ba, bb;
  const auto& only_a = keys.only_a;
  const auto& only_b = keys.only_b;
  std::vector<bool> renamed_a(only_a.size()), renamed_b(only_b.size());
  std::vector<KeyDiff> renames;
  if (!o.keys_only) {
    std::map<std::string, std::vector<std::size_t>> b_by_sig;  // "dtype shape" -> indices in only_b
    for (std::size_t j = 0; j < only_b.size(); ++j)
      if (only_b[j].second->kind == EntryKind::kTensor) b_by_sig[Describe(*only_b[j].second)].push_back(j);
    std::map<std::size_t, std::string> b_hash;
    for (std::size_t i = 0; i < only_a.size(); ++i) {
      const auto& [ka, ea] = only_a[i];
      if (ea->kind != EntryKind::kTensor) continue;
      auto it = b_by_sig.find(Describe(*ea));
      if (it == b_by_sig.end()) continue;
      const std::string ha = ContentHash(a, *ka, *ea, budget, ba);
      for (std::size_t j : it->second) {
        if (renamed_b[j]) continue;
        if (!b_hash.count(j)) b_hash[j] = ContentHash(b, *only_b[j].first, *only_b[j].second, budget, bb);
        if (b_hash[j] == ha) {
          renamed_a[i] = renamed_b[j] = true;
          KeyDiff d;
          d.what = "renamed";
          d.key = *ka;
          d.other_key = *only_b[j].first;
          d.a = d.b = Describe(*ea);
          renames.push_back(std::move(d));
          break;
        }
      }
    }
  }
  // The keys on one side only that no rename explains; `side` is the KeyDiff member they fill.
  const auto report_unmatched = [&](const auto& only, const std::vector<bool>& renamed, const char* what,
                                    std::string KeyDiff::*side) {
    for (std::size_t i = 0; i < only.size(); ++i) {
      if (renamed[i]) continue;
      KeyDiff d;
      d.what = what;
      d.key = *only[i].first;
      d.*side = Describe(*only[i].second);
      r.diffs.push_back(std::move(d));
    }
  };
  report_unmatched(only_a, renamed_a, "only_in_a", &KeyDiff::a);
  report_unmatched(only_b, renamed_b, "only_in_b", &KeyDiff::b);
  for (auto& d : renames) r.diffs.push_back(std::move(d));
}

// The difference of key `key` between A (`ea`) and B (`eb`); nullopt when they are the same.
// `values`: the compared values of a tensor of the same dtype and shape on both sides.
std::optional<KeyDiff> DiffEntry(Source& a, Source& b, const std::string& key, const EntryMeta& ea,
                                 const EntryMeta& eb, const ValueStats* values, const DiffOptions& o) {
  KeyDiff d;
  d.key = key;
  if (ea.kind != eb.kind) {
    d.what = "kind";
    d.a = std::string(EntryKindName(ea.kind));
    d.b = std::string(EntryKindName(eb.kind));
  } else if ((ea.kind == EntryKind::kTensor || ea.kind == EntryKind::kScalar) && ea.dtype != eb.dtype) {
    d.what = "dtype";
    d.a = std::string(DTypeName(ea.dtype));
    d.b = std::string(DTypeName(eb.dtype));
  } else if (ea.kind == EntryKind::kTensor && ea.shape != eb.shape) {
    d.what = "shape";
    d.a = detail::FormatShape(ea.shape);
    d.b = detail::FormatShape(eb.shape);
  } else if (o.keys_only) {
    return std::nullopt;
  } else if (ea.kind == EntryKind::kScalar || ea.kind == EntryKind::kJson) {
    if (json::parse(ea.value, nullptr, false) == json::parse(eb.value, nullptr, false)) return std::nullopt;
    d.what = "values";
    d.a = ea.value;
    d.b = eb.value;
  } else if (ea.kind == EntryKind::kBytes) {
    if (a.ReadBytes(key) == b.ReadBytes(key)) return std::nullopt;
    d.what = "values";
    d.a = std::to_string(ea.size) + " bytes";
    d.b = std::to_string(eb.size) + " bytes";
  } else {
    if (values->different == 0) return std::nullopt;
    d.what = "values";
    d.max_abs = values->max_abs;
    d.max_rel = values->max_rel;
    d.num_different = values->different;
    d.num_nan = values->nan;
    d.num_elements = static_cast<uint64_t>(NumElements(ea.shape));
  }
  return d;
}

// The keys in both A and B: tensor values first, in parallel; then every key in order.
void AddPaired(Source& a, Source& b, const std::vector<Keyed>& both, const DiffOptions& o, DiffReport& r) {
  uint64_t total = 0;
  if (!o.keys_only)
    for (const auto& [k, e] : both)
      if (e->kind == EntryKind::kTensor) total += e->TensorBytes();
  detail::Progress progress("diff", total, o.progress);
  std::vector<Keyed> value_jobs;
  std::map<const std::string*, std::size_t> value_index;
  if (!o.keys_only)
    for (const auto& [kp, ea] : both) {
      const EntryMeta& eb = *b.metadata().Find(*kp);
      if (ea->kind == EntryKind::kTensor && eb.kind == EntryKind::kTensor && ea->dtype == eb.dtype &&
          ea->shape == eb.shape) {
        value_index[kp] = value_jobs.size();
        value_jobs.emplace_back(kp, ea);
      }
    }
  const std::vector<ValueStats> values = CompareAll(a, b, value_jobs, o.max_memory, o, progress);
  for (const auto& v : value_jobs) r.bytes_compared += v.second->TensorBytes();
  for (const auto& [kp, ea] : both) {
    ++r.compared;
    const auto vi = value_index.find(kp);
    auto d = DiffEntry(a, b, *kp, *ea, *b.metadata().Find(*kp), vi == value_index.end() ? nullptr : &values[vi->second], o);
    if (d) r.diffs.push_back(std::move(*d));
  }
  progress.Done();
}

}  // namespace

DiffReport Diff(const fs::path& a_path, const fs::path& b_path, const DiffOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  auto a = Source::Open(a_path);
  auto b = Source::Open(b_path);
  DiffReport r;
  r.a = a_path.string();
  r.b = b_path.string();
  const KeySets keys = SelectKeys(*a, *b, o);
  if (keys.skipped)
    r.notes.push_back(std::to_string(keys.skipped) +
                      " non-tensor entries not compared (a safetensors file holds tensors only)");
  for (const auto& [k, e] : keys.both)
    for (auto* src : {a.get(), b.get()})
      if (e->kind == EntryKind::kTensor && !src->HoldsWhole(*k))
        throw Error(ErrorCode::kInvalidArgument, src->path().string() + ": tensor '" + *k +
                                                     "' is only partly in this shard; compare checkpoint directories");
  AddUnpaired(*a, *b, keys, o, r);
  AddPaired(*a, *b, keys.both, o, r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string RenderDiffText(const DiffReport& r) {
  std::ostringstream out;
  std::map<std::string, std::size_t> counts;
  for (const auto& d : r.diffs) {
    ++counts[d.what];
    if (d.what == "only_in_a") out << "only in A:  " << d.key << "  (" << d.a << ")\n";
    else if (d.what == "only_in_b") out << "only in B:  " << d.key << "  (" << d.b << ")\n";
    else if (d.what == "renamed") out << "renamed:    " << d.key << " -> " << d.other_key << "  (" << d.a << ", same values)\n";
    else if (d.what == "values" && d.num_elements)
      out << "values:     " << d.key << "  " << d.num_different << " of " << d.num_elements
          << " elements differ" << (d.num_nan ? " (" + std::to_string(d.num_nan) + " with NaN)" : "")
          << ", max abs diff " << detail::FormatDouble(d.max_abs) << ", max rel diff "
          << detail::FormatDouble(d.max_rel) << "\n";
    else out << d.what << ":" << std::string(d.what.size() < 11 ? 11 - d.what.size() : 1, ' ') << d.key << "  "
             << d.a << " -> " << d.b << "\n";
  }
  for (const auto& n : r.notes) out << "note: " << n << "\n";
  char tail[200];
  std::snprintf(tail, sizeof tail, "%zu keys compared, %s of values in %.2f s", r.compared,
                detail::FormatBytes(static_cast<double>(r.bytes_compared)).c_str(), r.seconds);
  if (r.same()) {
    out << "SAME: " << tail << "\n";
  } else {
    out << "DIFFERENT: " << r.diffs.size() << (r.diffs.size() == 1 ? " difference (" : " differences (");
    bool first = true;
    for (const auto& [what, n] : counts) out << (first ? "" : ", ") << n << " " << what, first = false;
    out << "); " << tail << "\n";
  }
  return out.str();
}

std::string RenderDiffJson(const DiffReport& r) {
  nlohmann::ordered_json j;
  j["a"] = r.a;
  j["b"] = r.b;
  j["same"] = r.same();
  j["compared"] = r.compared;
  j["bytes_compared"] = r.bytes_compared;
  j["seconds"] = r.seconds;
  j["differences"] = nlohmann::ordered_json::array();
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
  for (const auto& d : r.diffs) {
    nlohmann::ordered_json x = {{"what", d.what}, {"key", d.key}};
    if (!d.other_key.empty()) x["other_key"] = d.other_key;
    if (!d.a.empty()) x["a"] = d.a;
    if (!d.b.empty()) x["b"] = d.b;
    if (d.num_elements) {
      x["num_different"] = d.num_different;
      x["num_elements"] = d.num_elements;
      x["num_nan"] = d.num_nan;
      x["max_abs_diff"] = num(d.max_abs);
      x["max_rel_diff"] = num(d.max_rel);
    }
    j["differences"].push_back(std::move(x));
  }
  j["notes"] = r.notes;
  return j.dump(2) + "\n";
}

}  // namespace ckpt::ops
