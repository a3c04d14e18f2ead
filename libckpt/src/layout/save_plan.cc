// layout/save_plan.cc
#include "layout/save_plan.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "format/checked.h"
#include "format/flat_index.h"
#include "layout/box.h"

namespace ckpt::layout {
namespace {

using json = nlohmann::json;

[[noreturn]] void Invalid(const std::string& key, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': " + what);
}

// A scalar's value as the JSON text metadata.json holds.
std::string ScalarJson(const Scalar& s) {
  if (s.dtype == DType::kBool) return s.AsInt() ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&s.value)) {
    if (IsFloating(s.dtype)) return json(static_cast<double>(*i)).dump();
    return json(*i).dump();
  }
  const double d = std::get<double>(s.value);
  if (!IsFloating(s.dtype)) return json(static_cast<int64_t>(d)).dump();
  if (!std::isfinite(d)) {
    throw Error(ErrorCode::kInvalidArgument, "scalar value " + std::to_string(d) + " is not finite; JSON cannot hold it");
  }
  return json(d).dump();
}

void DescribeTensor(const std::string& key, const Tensor& t, EntryClaim& c) {
  if (t.shape.size() > static_cast<std::size_t>(ParseLimits{}.max_rank)) Invalid(key, "more than 32 dimensions");
  NumElements(t.shape);  // negative or overflowing shapes
  c.dtype = t.dtype;
  c.shape = t.shape;
  const Box whole = Box::Full(t.shape);
  c.boxes.reserve(t.chunks.size());
  for (const Chunk& chunk : t.chunks) {
    if (!Contains(whole, chunk.box)) {
      Invalid(key, "chunk " + chunk.box.ToString() + " lies outside the tensor " + whole.ToString());
    }
    if (chunk.box.NumElements() > 0 && chunk.data == nullptr) Invalid(key, "chunk " + chunk.box.ToString() + " has no data");
    for (const Box& b : c.boxes) {
      if (Overlaps(b, chunk.box)) {
        Invalid(key, "this rank's chunks " + b.ToString() + " and " + chunk.box.ToString() + " overlap");
      }
    }
    c.boxes.push_back(chunk.box);
  }
}

}  // namespace

RankDescription Describe(const StateDict& state) {
  RankDescription out;
  out.reserve(state.size());
  for (const auto& [key, entry] : state) {
    EntryClaim& c = out.emplace_back();
    c.key = key;
    c.kind = KindOf(entry);
    if (const auto* t = std::get_if<Tensor>(&entry)) {
      DescribeTensor(key, *t, c);
    } else if (const auto* s = std::get_if<Scalar>(&entry)) {
      c.dtype = s->dtype;
      c.value = ScalarJson(*s);
    } else if (const auto* b = std::get_if<Bytes>(&entry)) {
      c.size = b->data.size();
    } else {
      try {
        c.value = json::parse(std::get<Json>(entry).text).dump();
      } catch (const json::exception& ex) {
        Invalid(key, std::string("invalid JSON value: ") + ex.what());
      }
    }
  }
  return out;
}

// A tensor chunk claimed by one rank, before equal boxes are grouped into regions.
struct Claim {
  Box box;
  Holder holder;
};

struct SavePlanner::State {
  int world = 0;
  int next_rank = 0;
  std::vector<SaveKey> keys;
  std::vector<std::vector<Claim>> claims;  // per key (tensors)
  internal::IndexSlots index;              // of keys by name
  std::size_t indexed = 0;
  std::vector<std::string> problems;

  std::size_t FindOrAdd(std::size_t position, EntryClaim& c, bool& added) {
    added = false;
    // Ranks usually list the same keys in the same order: try the same position first.
    if (position < keys.size() && keys[position].key == c.key) return position;
    const std::size_t hash = std::hash<std::string_view>{}(c.key);
    const std::size_t p = internal::IndexLookup(index, hash, [&](std::size_t i) { return keys[i].key == c.key; });
    if (p) return p - 1;
    added = true;
    internal::IndexInsert(index, indexed, hash, keys.size());
    SaveKey& k = keys.emplace_back();
    k.key = c.key;
    k.kind = c.kind;
    k.dtype = c.dtype;
    k.shape = std::move(c.shape);
    k.value = std::move(c.value);
    k.size = c.size;
    claims.emplace_back();
    return keys.size() - 1;
  }

  void Merge(int rank, uint32_t entry, EntryClaim& c) {
    bool added = false;
    const std::size_t k = FindOrAdd(entry, c, added);
    SaveKey& p = keys[k];
    auto who = [&] { return "key '" + p.key + "': rank " + std::to_string(rank); };
    if (!added && c.kind != p.kind) {
      problems.push_back(who() + " has a " + std::string(EntryKindName(c.kind)) + ", another rank a " +
                         std::string(EntryKindName(p.kind)));
      return;
    }
    switch (p.kind) {
      case EntryKind::kTensor:
        if (!added && (c.dtype != p.dtype || c.shape != p.shape)) {
          problems.push_back(who() + " has " + std::string(DTypeName(c.dtype)) + " " + Box::Full(c.shape).ToString() +
                             ", another rank " + std::string(DTypeName(p.dtype)) + " " + Box::Full(p.shape).ToString());
          return;
        }
        for (std::size_t i = 0; i < c.boxes.size(); ++i) {
          claims[k].push_back(Claim{std::move(c.boxes[i]), Holder{rank, ChunkRef{entry, static_cast<uint32_t>(i)}}});
        }
        return;
      case EntryKind::kBytes:
        if (c.size != p.size) {
          problems.push_back(who() + " has " + std::to_string(c.size) + " bytes, another rank " + std::to_string(p.size));
          return;
        }
        if (p.regions.empty()) p.regions.push_back(SaveRegion{Box{{0}, {static_cast<int64_t>(p.size)}}});
        p.holders.push_back(Holder{rank, ChunkRef{entry, 0}});
        ++p.regions[0].holder_count;
        return;
      case EntryKind::kScalar:
      case EntryKind::kJson:
        if (!added && (c.value != p.value || c.dtype != p.dtype)) {
          problems.push_back(who() + " has value " + c.value + ", another rank " + p.value);
        }
        return;
    }
  }

  // Groups a tensor's claims into regions of equal boxes, ordered by offsets and, on
  // ties, by the region's first claim; each region's holders keep the claims' order.
  void MakeRegions(SaveKey& p, std::vector<Claim>& cl) {
    std::vector<uint32_t> order(cl.size());
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
      const Box& x = cl[a].box;
      const Box& y = cl[b].box;
      if (x.offsets != y.offsets) return x.offsets < y.offsets;
      if (x.sizes != y.sizes) return x.sizes < y.sizes;
      return a < b;
    });
    struct Group {
      std::size_t begin, end;  // in order
    };
    std::vector<Group> groups;
    for (std::size_t i = 0; i < order.size(); ++i) {
      if (i == 0 || !(cl[order[i]].box == cl[order[i - 1]].box)) groups.push_back(Group{i, i});
      groups.back().end = i + 1;
    }
    // Equal offsets: the group whose first claim came first (stable in arrival order).
    std::stable_sort(groups.begin(), groups.end(), [&](const Group& a, const Group& b) {
      const Box& x = cl[order[a.begin]].box;
      const Box& y = cl[order[b.begin]].box;
      if (x.offsets != y.offsets) return x.offsets < y.offsets;
      return order[a.begin] < order[b.begin];
    });
    p.regions.reserve(groups.size());
    p.holders.reserve(cl.size());
    for (const Group& g : groups) {
      SaveRegion& r = p.regions.emplace_back();
      r.box = std::move(cl[order[g.begin]].box);
      r.first_holder = static_cast<uint32_t>(p.holders.size());
      r.holder_count = static_cast<uint32_t>(g.end - g.begin);
      for (std::size_t i = g.begin; i < g.end; ++i) p.holders.push_back(cl[order[i]].holder);
    }
    std::vector<Claim>().swap(cl);
  }

  void CheckTiling(SaveKey& p) {
    std::vector<Box> boxes;
    boxes.reserve(p.regions.size());
    for (SaveRegion& r : p.regions) boxes.push_back(std::move(r.box));
    for (std::string& problem : TilingProblems(p.shape, boxes)) problems.push_back("key '" + p.key + "': " + problem);
    for (std::size_t i = 0; i < boxes.size(); ++i) p.regions[i].box = std::move(boxes[i]);
  }
};

SavePlanner::SavePlanner(int world) : s_(std::make_unique<State>()) { s_->world = world; }
SavePlanner::~SavePlanner() = default;

void SavePlanner::Add(RankDescription description) {
  const int rank = s_->next_rank++;
  if (description.size() > UINT32_MAX) throw Error(ErrorCode::kInvalidArgument, "save: too many entries");
  for (std::size_t i = 0; i < description.size(); ++i) s_->Merge(rank, static_cast<uint32_t>(i), description[i]);
}

SavePlan SavePlanner::Finish() {
  State& s = *s_;
  if (s.next_rank != s.world) {
    throw Error(ErrorCode::kInternal, "save plan: " + std::to_string(s.next_rank) + " descriptions for " +
                                          std::to_string(s.world) + " ranks");
  }
  for (std::size_t k = 0; k < s.keys.size(); ++k) {
    SaveKey& p = s.keys[k];
    if (p.kind != EntryKind::kTensor) continue;
    s.MakeRegions(p, s.claims[k]);
    s.CheckTiling(p);
  }
  if (!s.problems.empty()) {
    std::string msg = "save: the state cannot be saved as given:";
    for (std::size_t i = 0; i < s.problems.size() && i < 50; ++i) msg += "\n  " + s.problems[i];
    if (s.problems.size() > 50) msg += "\n  ... and " + std::to_string(s.problems.size() - 50) + " more";
    throw Error(ErrorCode::kInvalidArgument, msg);
  }
  for (SaveKey& p : s.keys) {
    if (p.kind == EntryKind::kBytes) p.regions[0].bytes = p.size;
    if (p.kind != EntryKind::kTensor) continue;
    const auto item = static_cast<int64_t>(DTypeSize(p.dtype));
    for (SaveRegion& r : p.regions) {
      r.bytes = static_cast<uint64_t>(internal::CheckedMul(r.box.NumElements(), item, "key '" + p.key + "'"));
    }
  }
  SavePlan plan;
  plan.world = s.world;
  plan.keys = std::move(s.keys);
  return plan;
}

SavePlan PlanSave(std::vector<RankDescription> descriptions) {
  SavePlanner planner(static_cast<int>(descriptions.size()));
  for (RankDescription& d : descriptions) planner.Add(std::move(d));
  return planner.Finish();
}

namespace {

// Calls fn(key, region) for each region held by two or more ranks, in plan order.
template <typename Fn>
void ForEachReplicated(const SavePlan& plan, Fn&& fn) {
  for (const SaveKey& p : plan.keys) {
    for (const SaveRegion& r : p.regions) {
      if (r.holder_count >= 2) fn(p, r);
    }
  }
}

}  // namespace

std::vector<std::vector<ChunkRef>> ReplicaRequests(const SavePlan& plan) {
  std::vector<std::vector<ChunkRef>> out(static_cast<std::size_t>(plan.world));
  ForEachReplicated(plan, [&](const SaveKey& p, const SaveRegion& r) {
    for (const Holder& h : p.HoldersOf(r)) out[h.rank].push_back(h.ref);
  });
  return out;
}

void CheckReplicas(const SavePlan& plan, const std::vector<std::vector<std::string>>& digests) {
  const std::vector<std::vector<ChunkRef>> requests = ReplicaRequests(plan);
  if (digests.size() != requests.size()) {
    throw Error(ErrorCode::kComm, "save: " + std::to_string(digests.size()) + " ranks answered with digests, expected " +
                                      std::to_string(requests.size()));
  }
  for (std::size_t r = 0; r < requests.size(); ++r) {
    if (digests[r].size() != requests[r].size()) {
      throw Error(ErrorCode::kComm, "save: rank " + std::to_string(r) + " sent " + std::to_string(digests[r].size()) +
                                        " replica digests, expected " + std::to_string(requests[r].size()));
    }
  }
  std::vector<std::size_t> next(requests.size(), 0);
  std::vector<std::string> problems;
  ForEachReplicated(plan, [&](const SaveKey& p, const SaveRegion& r) {
    std::map<std::string_view, std::vector<int>> by_digest;
    for (const Holder& h : p.HoldersOf(r)) by_digest[digests[h.rank][next[h.rank]++]].push_back(h.rank);
    if (by_digest.size() < 2) return;
    std::string groups;
    for (const auto& [digest, ranks] : by_digest) {
      groups += groups.empty() ? "" : " vs ";
      groups += "ranks";
      for (int rank : ranks) groups += " " + std::to_string(rank);
    }
    problems.push_back("key '" + p.key + "' region " + r.box.ToString() + ": replicas differ (" + groups + ")");
  });
  if (!problems.empty()) {
    std::string msg = "save: replicated tensors differ between ranks (a data-parallel desync?):";
    for (const auto& s : problems) msg += "\n  " + s;
    throw Error(ErrorCode::kMismatch, msg);
  }
}

void AssignWriters(SavePlan& plan) {
  std::vector<uint64_t> load(static_cast<std::size_t>(plan.world), 0);
  std::vector<std::pair<const SaveKey*, SaveRegion*>> replicated;
  for (SaveKey& p : plan.keys) {
    for (SaveRegion& r : p.regions) {
      if (r.holder_count == 1) {
        r.writer = p.holders[r.first_holder].rank;
        load[r.writer] += r.bytes;
      } else if (r.holder_count > 1) {
        replicated.emplace_back(&p, &r);
      }
    }
  }
  std::stable_sort(replicated.begin(), replicated.end(),
                   [](const auto& a, const auto& b) { return a.second->bytes > b.second->bytes; });
  for (auto& [p, r] : replicated) {
    int best = p->holders[r->first_holder].rank;
    for (const Holder& h : p->HoldersOf(*r)) {
      if (load[h.rank] < load[best]) best = h.rank;
    }
    r->writer = best;
    load[best] += r->bytes;
  }
}

std::vector<std::vector<Write>> WritesByRank(const SavePlan& plan) {
  std::vector<std::vector<Write>> out(static_cast<std::size_t>(plan.world));
  for (std::size_t k = 0; k < plan.keys.size(); ++k) {
    const SaveKey& p = plan.keys[k];
    for (std::size_t g = 0; g < p.regions.size(); ++g) {
      for (const Holder& h : p.HoldersOf(p.regions[g])) {
        if (h.rank == p.regions[g].writer) {
          out[h.rank].push_back(Write{h.ref, static_cast<uint32_t>(k), static_cast<uint32_t>(g)});
        }
      }
    }
  }
  return out;
}

void Assemble(const SavePlan& plan, const std::vector<std::vector<Write>>& writes, std::vector<RankResult> results,
              Metadata& m) {
  if (results.size() != writes.size()) {
    throw Error(ErrorCode::kComm, "save: " + std::to_string(results.size()) + " ranks reported what they wrote, expected " +
                                      std::to_string(writes.size()));
  }
  std::vector<std::vector<std::pair<uint32_t, ChunkMeta>>> placed(plan.keys.size());
  for (std::size_t r = 0; r < results.size(); ++r) {
    RankResult& res = results[r];
    if (res.chunks.size() != writes[r].size()) {
      throw Error(ErrorCode::kComm, "save: rank " + std::to_string(r) + " reported " + std::to_string(res.chunks.size()) +
                                        " chunks written, expected " + std::to_string(writes[r].size()));
    }
    if (!res.chunks.empty()) m.files.push_back(FileMeta{res.file, static_cast<int>(r), res.bytes, res.index});
    for (std::size_t i = 0; i < res.chunks.size(); ++i) {
      placed[writes[r][i].key].emplace_back(writes[r][i].region, std::move(res.chunks[i]));
    }
  }
  m.entries.reserve(m.entries.size() + plan.keys.size());
  for (std::size_t k = 0; k < plan.keys.size(); ++k) {
    const SaveKey& p = plan.keys[k];
    EntryMeta e;
    e.kind = p.kind;
    if (p.kind == EntryKind::kTensor || p.kind == EntryKind::kScalar) e.dtype = p.dtype;
    if (p.kind == EntryKind::kBytes) e.dtype = DType::kUInt8;
    if (p.kind == EntryKind::kTensor) e.shape = p.shape;
    if (p.kind == EntryKind::kBytes) e.size = p.size;
    if (p.kind == EntryKind::kScalar || p.kind == EntryKind::kJson) e.value = p.value;
    std::stable_sort(placed[k].begin(), placed[k].end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    e.chunks.reserve(placed[k].size());
    for (auto& [g, c] : placed[k]) e.chunks.push_back(std::move(c));
    m.entries.emplace_back(p.key, std::move(e));
  }
  m.BuildIndex();
}

}  // namespace ckpt::layout
