// layout/save_plan.cc
#include "layout/save_plan.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <unordered_map>

#include "format/checked.h"
#include "format/flat_index.h"
#include "format/grid.h"
#include "format/scalar.h"
#include "layout/box.h"

namespace ckpt::layout {
namespace {

[[noreturn]] void Invalid(const std::string& key, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': " + what);
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
  // A tensor of zero volume is stored as one chunk, the whole tensor (FORMAT.md §3.3, §9.1),
  // whatever empty pieces the ranks hold of it: each rank that holds any claims the whole
  // box (replicas of no bytes), through its first chunk (save.cc writes it as the whole box).
  if (NumElements(t.shape) == 0 && !c.boxes.empty()) c.boxes.assign(1, whole);
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
      c.value = format::ScalarText(*s);
    } else if (const auto* b = std::get_if<Bytes>(&entry)) {
      c.size = b->data.size();
    } else {
      c.value = format::JsonEntryText(key, std::get<Json>(entry).text);
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
  bool compact = true;
  std::vector<SaveKey> keys;
  std::vector<std::vector<Claim>> claims;  // per key (tensors)
  // Per key: a tensor still kept as runs (SaveKey::step is 0 until its first claim)?
  std::vector<uint8_t> regular;
  std::vector<uint8_t> fast;  // per key of rank 0's: on the fast path (AddFastParts)
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
    regular.push_back(compact && k.kind == EntryKind::kTensor);
    return keys.size() - 1;
  }

  // True if `b` is one part of p's dim-0 step rule, setting `part`. The first claim sets
  // the step (its rows); a wrong guess (it was a short last part) only makes the key
  // explicit when a later claim does not fit.
  static bool FitsRule(SaveKey& p, const Box& b, uint32_t& part) {
    const std::size_t n = p.shape.size();
    if (n == 0 || b.offsets.size() != n || b.sizes.size() != n) return false;
    for (std::size_t d = 1; d < n; ++d) {
      if (p.shape[d] <= 0 || b.offsets[d] != 0 || b.sizes[d] != p.shape[d]) return false;
    }
    const int64_t extent = p.shape[0], o = b.offsets[0], z = b.sizes[0];
    if (extent <= 0 || z <= 0 || o < 0 || o >= extent || z > extent - o) return false;
    int64_t step = p.step;
    if (step == 0) step = z;
    if (o % step != 0 || z != std::min(step, extent - o) || o / step >= UINT32_MAX) return false;
    p.step = step;
    part = static_cast<uint32_t>(o / step);
    return true;
  }

  // Key k leaves the regular form: its runs become claims, in the order they came.
  void MakeExplicit(std::size_t k) {
    SaveKey& p = keys[k];
    regular[k] = 0;
    if (p.step > 0) {
      for (const RegularRun& run : p.runs) {
        for (uint32_t i = 0; i < run.count; ++i) {
          const int64_t o = static_cast<int64_t>(run.first_part + i) * p.step;
          Box box{Shape(p.shape.size(), 0), p.shape};
          box.offsets[0] = o;
          box.sizes[0] = std::min(p.step, p.shape[0] - o);
          claims[k].push_back(Claim{std::move(box), Holder{run.first_rank + static_cast<int>(i), ChunkRef{run.entry, 0}}});
        }
      }
    }
    p.step = 0;
    std::vector<RegularRun>().swap(p.runs);
  }

  // A claim of rank `rank` (entry `entry`) for the regular key k: appended to its runs.
  // False if it breaks the rule.
  bool AddRegular(std::size_t k, int rank, uint32_t entry, const EntryClaim& c) {
    if (c.boxes.empty()) return true;  // this rank holds none of it
    SaveKey& p = keys[k];
    uint32_t part = 0;
    if (c.boxes.size() != 1 || !FitsRule(p, c.boxes[0], part)) return false;
    if (!p.runs.empty()) {
      RegularRun& last = p.runs.back();
      if (last.entry == entry && last.first_rank + static_cast<int64_t>(last.count) == rank &&
          last.first_part + static_cast<uint64_t>(last.count) == part) {
        ++last.count;
        return true;
      }
    }
    p.runs.push_back(RegularRun{rank, part, 1, entry});
    return true;
  }

  // At Finish: key k stays regular if its runs cover every part once; sorts them by part.
  bool KeepRegular(std::size_t k) {
    SaveKey& p = keys[k];
    if (!regular[k] || p.step == 0) return false;
    std::vector<RegularRun> sorted = p.runs;
    std::sort(sorted.begin(), sorted.end(),
              [](const RegularRun& a, const RegularRun& b) { return a.first_part < b.first_part; });
    uint64_t next = 0;
    for (const RegularRun& run : sorted) {
      if (run.first_part != next) return false;
      next += run.count;
    }
    if (next != p.RegionCount()) return false;
    p.runs = std::move(sorted);
    return true;
  }

  void Merge(int rank, uint32_t entry, EntryClaim& c) {
    bool added = false;
    const std::size_t k = FindOrAdd(entry, c, added);
    SaveKey& p = keys[k];
    if (k < fast.size() && fast[k]) {
      // Every rank said its entry was on the fast path: a description naming it contradicts that.
      throw Error(ErrorCode::kComm, "save: rank " + std::to_string(rank) + "'s description: key '" + p.key +
                                        "' is on the fast path, which no rank describes");
    }
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
        if (regular[k]) {
          if (AddRegular(k, rank, entry, c)) return;
          MakeExplicit(k);
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

SavePlanner::SavePlanner(int world, bool compact) : s_(std::make_unique<State>()) {
  s_->world = world;
  s_->compact = compact;
}
SavePlanner::~SavePlanner() = default;

void SavePlanner::Add(RankDescription description, std::vector<uint32_t> entries) {
  const int rank = s_->next_rank++;
  if (description.size() > UINT32_MAX) throw Error(ErrorCode::kInvalidArgument, "save: too many entries");
  if (!entries.empty() && entries.size() != description.size()) {
    throw Error(ErrorCode::kInternal, "save plan: " + std::to_string(entries.size()) + " positions for " +
                                          std::to_string(description.size()) + " claims");
  }
  for (std::size_t i = 0; i < description.size(); ++i) {
    s_->Merge(rank, entries.empty() ? static_cast<uint32_t>(i) : entries[i], description[i]);
  }
}

void SavePlanner::AddFastParts(std::span<const uint8_t> fast) {
  State& s = *s_;
  if (s.next_rank != 1 || fast.size() > s.keys.size()) {
    throw Error(ErrorCode::kInternal, "save plan: fast parts of " + std::to_string(fast.size()) + " keys after " +
                                          std::to_string(s.next_rank) + " descriptions");
  }
  s.fast.assign(fast.begin(), fast.end());
  for (std::size_t k = 0; k < fast.size(); ++k) {
    SaveKey& p = s.keys[k];
    if (!fast[k] || p.kind != EntryKind::kTensor) continue;
    // Rank 0's claim made the one run {rank 0, part 0}; ranks 1.. continue it, one part each.
    const std::size_t parts = p.step > 0 ? p.RegionCount() : 0;
    if (!s.regular[k] || p.runs.size() != 1 || !(p.runs[0].first_rank == 0 && p.runs[0].first_part == 0 &&
                                                 p.runs[0].count == 1 && p.runs[0].entry == k) ||
        parts > static_cast<std::size_t>(s.world)) {
      throw Error(ErrorCode::kInternal, "save plan: key '" + p.key + "' is not part 0 of a rule of " +
                                            std::to_string(s.world) + " ranks on rank 0");
    }
    p.runs[0].count = static_cast<uint32_t>(parts);
  }
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
    if (s.KeepRegular(k)) continue;
    s.MakeExplicit(k);
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
    if (p.regular()) {
      // Part 0 has `step` rows, the most of any part: checked as an explicit region is.
      const int64_t bytes0 = internal::CheckedMul(p.Region(0).box.NumElements(), item, "key '" + p.key + "'");
      p.row_bytes = static_cast<uint64_t>(bytes0 / p.step);
      continue;
    }
    for (SaveRegion& r : p.regions) {
      r.bytes = static_cast<uint64_t>(internal::CheckedMul(r.box.NumElements(), item, "key '" + p.key + "'"));
    }
  }
  SavePlan plan;
  plan.world = s.world;
  plan.keys = std::move(s.keys);
  return plan;
}

SavePlan PlanSave(std::vector<RankDescription> descriptions, bool compact) {
  SavePlanner planner(static_cast<int>(descriptions.size()), compact);
  for (RankDescription& d : descriptions) planner.Add(std::move(d));
  return planner.Finish();
}

namespace {

// The parts of a dim-0 step rule of `step` rows over `shape`.
int64_t PartCount(const Shape& shape, int64_t step) { return shape[0] / step + (shape[0] % step != 0); }

// True if `boxes` is exactly part `part` of `shape`'s rule of `step` rows (SavePlanner's
// FitsRule): one box, those rows of dim 0, whole in the others; or none, for a part past
// the last.
bool IsPart(const Shape& shape, int64_t step, int64_t part, const std::vector<Box>& boxes) {
  if (part >= PartCount(shape, step)) return boxes.empty();
  if (boxes.size() != 1) return false;
  const Box& b = boxes[0];
  const std::size_t n = shape.size();
  if (b.offsets.size() != n || b.sizes.size() != n) return false;
  for (std::size_t d = 1; d < n; ++d) {
    if (b.offsets[d] != 0 || b.sizes[d] != shape[d]) return false;
  }
  const int64_t o = part * step;  // < shape[0]: no overflow
  return b.offsets[0] == o && b.sizes[0] == std::min(step, shape[0] - o);
}

// The rows of part 0 of the rule that rank 0's claim `c` is part 0 of, or 0 if it is none.
int64_t PartZeroRows(const EntryClaim& c) {
  const Shape& shape = c.shape;
  if (shape.empty() || shape[0] <= 0 || c.boxes.size() != 1) return 0;
  for (std::size_t d = 1; d < shape.size(); ++d) {
    if (shape[d] <= 0) return 0;  // FitsRule refuses an empty dimension
  }
  const int64_t step = c.boxes[0].sizes.empty() ? 0 : c.boxes[0].sizes[0];
  if (step <= 0 || step > shape[0] || !IsPart(shape, step, 0, c.boxes)) return 0;
  return step;
}

}  // namespace

KeyTable MakeKeyTable(const RankDescription& rank0, int world) {
  KeyTable table(rank0.size());
  for (std::size_t i = 0; i < rank0.size(); ++i) {
    const EntryClaim& c = rank0[i];
    TableEntry& t = table[i];
    t.key = c.key;
    t.kind = c.kind;
    if (c.kind == EntryKind::kTensor || c.kind == EntryKind::kScalar) t.dtype = c.dtype;
    if (c.kind == EntryKind::kTensor) {
      t.shape = c.shape;
      t.step = PartZeroRows(c);
      if (t.step > 0 && PartCount(t.shape, t.step) > world) t.step = 0;  // parts no rank would hold
    }
    if (c.kind == EntryKind::kScalar || c.kind == EntryKind::kJson) t.value = c.value;
  }
  return table;
}

namespace {

// Calls fn(i, t) for each claim i of `mine` whose key is table entry t (t = i first: ranks
// usually list the same keys in the same order), fn(i, table.size()) for the others.
template <typename Fn>
void MatchTable(const KeyTable& table, const RankDescription& mine, Fn&& fn) {
  std::unordered_map<std::string_view, std::size_t> by_key;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    if (i < table.size() && table[i].key == mine[i].key) {
      fn(i, i);
      continue;
    }
    if (by_key.empty()) {
      by_key.reserve(table.size());
      for (std::size_t t = 0; t < table.size(); ++t) by_key.emplace(table[t].key, t);
    }
    const auto it = by_key.find(mine[i].key);
    fn(i, it == by_key.end() ? table.size() : it->second);
  }
}

}  // namespace

std::vector<uint8_t> FastEntries(const KeyTable& table, const RankDescription& mine, int rank) {
  std::vector<uint8_t> out(table.size(), 0);
  MatchTable(table, mine, [&](std::size_t i, std::size_t t) {
    if (t == table.size()) return;
    const TableEntry& e = table[t];
    const EntryClaim& c = mine[i];
    if (c.kind != e.kind) return;
    switch (c.kind) {
      case EntryKind::kTensor:
        // The same position: the plan's run names rank 0's entry for every rank.
        out[t] = t == i && e.step > 0 && c.dtype == e.dtype && c.shape == e.shape && !e.shape.empty() &&
                 IsPart(e.shape, e.step, rank, c.boxes);
        return;
      case EntryKind::kScalar:
        out[t] = c.dtype == e.dtype && c.value == e.value;
        return;
      case EntryKind::kJson:
        out[t] = c.value == e.value;
        return;
      case EntryKind::kBytes:
        return;  // every holder is one of the region's (replicas)
    }
  });
  return out;
}

RankDescription SlowClaims(const KeyTable& table, std::span<const uint8_t> fast, RankDescription mine,
                           std::vector<uint32_t>& entries) {
  RankDescription out;
  entries.clear();
  MatchTable(table, mine, [&](std::size_t i, std::size_t t) {
    if (t < table.size() && t < fast.size() && fast[t]) return;
    out.push_back(std::move(mine[i]));
    entries.push_back(static_cast<uint32_t>(i));
  });
  return out;
}

std::size_t SaveKey::RegionCount() const {
  if (!regular()) return regions.size();
  return static_cast<std::size_t>(shape[0] / step + (shape[0] % step != 0));  // no overflow near INT64_MAX
}

uint64_t SaveKey::PartBytes(uint64_t part) const {
  const int64_t o = static_cast<int64_t>(part) * step;
  return static_cast<uint64_t>(std::min(step, shape[0] - o)) * row_bytes;
}

namespace {

// The run of a regular key holding part g.
const RegularRun& RunOf(const SaveKey& p, std::size_t g) {
  auto it = std::upper_bound(p.runs.begin(), p.runs.end(), g,
                             [](std::size_t part, const RegularRun& run) { return part < run.first_part; });
  return *std::prev(it);
}

}  // namespace

SaveRegion SaveKey::Region(std::size_t g) const {
  if (!regular()) return regions[g];
  SaveRegion r;
  r.box = Box{Shape(shape.size(), 0), shape};
  r.box.offsets[0] = static_cast<int64_t>(g) * step;
  r.box.sizes[0] = std::min(step, shape[0] - r.box.offsets[0]);
  r.bytes = PartBytes(g);
  r.writer = RegionHolders(g)[0].rank;
  r.holder_count = 1;
  return r;
}

std::vector<Holder> SaveKey::RegionHolders(std::size_t g) const {
  if (!regular()) {
    const std::span<const Holder> h = HoldersOf(regions[g]);
    return std::vector<Holder>(h.begin(), h.end());
  }
  const RegularRun& run = RunOf(*this, g);
  const auto i = static_cast<int>(g - run.first_part);
  return {Holder{run.first_rank + i, ChunkRef{run.entry, 0}}};
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
    for (const RegularRun& run : p.runs) {
      for (uint32_t i = 0; i < run.count; ++i) load[run.first_rank + i] += p.PartBytes(run.first_part + i);
    }
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

std::vector<std::vector<Write>> WritesByRank(const SavePlan& plan, std::span<const uint8_t> omit) {
  std::vector<std::vector<Write>> out(static_cast<std::size_t>(plan.world));
  for (std::size_t k = 0; k < plan.keys.size(); ++k) {
    if (k < omit.size() && omit[k]) continue;
    const SaveKey& p = plan.keys[k];
    for (const RegularRun& run : p.runs) {
      for (uint32_t i = 0; i < run.count; ++i) {
        out[run.first_rank + i].push_back(Write{ChunkRef{run.entry, 0}, static_cast<uint32_t>(k), run.first_part + i});
      }
    }
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

std::vector<uint64_t> WriteCounts(const SavePlan& plan) {
  std::vector<uint64_t> out(static_cast<std::size_t>(plan.world), 0);
  for (const SaveKey& p : plan.keys) {
    for (const RegularRun& run : p.runs) {
      for (uint32_t i = 0; i < run.count; ++i) ++out[run.first_rank + i];
    }
    for (const SaveRegion& r : p.regions) ++out[r.writer];
  }
  return out;
}

std::vector<Write> FastWrites(const KeyTable& table, std::span<const uint8_t> fast, int rank) {
  std::vector<Write> out;
  for (std::size_t k = 0; k < table.size() && k < fast.size(); ++k) {
    const TableEntry& e = table[k];
    // (A fast tensor has a step: every rank refused one without.)
    if (!fast[k] || e.kind != EntryKind::kTensor || e.step <= 0 || rank >= PartCount(e.shape, e.step)) continue;
    out.push_back(Write{ChunkRef{static_cast<uint32_t>(k), 0}, static_cast<uint32_t>(k), static_cast<uint32_t>(rank)});
  }
  return out;
}

void KeyTotals::Add(const ChunkMeta& chunk) {
  stored_bytes += chunk.stored_bytes;
  compressed = compressed || chunk.compression.codec != Compression::Codec::kNone;
  stats.Add(chunk.stats ? &*chunk.stats : nullptr);
}

void Assemble(const SavePlan& plan, const std::vector<std::vector<Write>>& writes,
              const std::vector<RankResult>& results, const std::vector<KeyTotals>& totals,
              const Compression& compression, Metadata& m) {
  std::vector<uint64_t> counts(writes.size());
  for (std::size_t r = 0; r < writes.size(); ++r) counts[r] = writes[r].size();
  Assemble(plan, counts, results, totals, compression, m);
}

void Assemble(const SavePlan& plan, std::span<const uint64_t> write_counts, const std::vector<RankResult>& results,
              const std::vector<KeyTotals>& totals, const Compression& compression, Metadata& m) {
  if (results.size() != write_counts.size()) {
    throw Error(ErrorCode::kComm, "save: " + std::to_string(results.size()) + " ranks reported what they wrote, expected " +
                                      std::to_string(write_counts.size()));
  }
  if (totals.size() != plan.keys.size()) {
    throw Error(ErrorCode::kComm, "save: totals of " + std::to_string(totals.size()) + " keys, expected " +
                                      std::to_string(plan.keys.size()));
  }
  // Each rank's file position, and per key its regions' writers.
  std::vector<int32_t> file_of(results.size(), -1);
  for (std::size_t r = 0; r < results.size(); ++r) {
    const RankResult& res = results[r];
    if (res.chunks != write_counts[r]) {
      throw Error(ErrorCode::kComm, "save: rank " + std::to_string(r) + " reported " + std::to_string(res.chunks) +
                                        " chunks written, expected " + std::to_string(write_counts[r]));
    }
    if (res.chunks == 0) continue;
    file_of[r] = static_cast<int32_t>(m.files.size());
    m.files.push_back(FileMeta{res.file, static_cast<int>(r), res.bytes, res.index, res.index_offset, res.index_bytes});
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
    if (p.kind == EntryKind::kTensor || p.kind == EntryKind::kBytes) {
      std::vector<grid::PlacedBox> placed;
      placed.reserve(p.RegionCount());
      for (std::size_t g = 0; g < p.RegionCount(); ++g) {
        const SaveRegion region = p.Region(g);
        placed.push_back({region.box, file_of.at(static_cast<std::size_t>(region.writer))});
      }
      if (p.kind == EntryKind::kTensor) {
        e.layout = grid::DescribeLayout(p.shape, placed);
      } else {
        e.layout.kind = TensorLayout::Kind::kChunks;
        e.layout.pieces.push_back({placed.at(0).box, placed.at(0).file});
      }
      const KeyTotals& t = totals[k];
      e.stored_bytes = t.stored_bytes;
      if (t.compressed) e.compression = compression;
      if (p.kind == EntryKind::kTensor && IsFloating(p.dtype)) e.stats = t.stats.Result();
    }
    m.entries.emplace_back(p.key, std::move(e));
  }
  m.resolved = false;  // the chunk records are in the shard indexes
  m.BuildIndex();
}

}  // namespace ckpt::layout
