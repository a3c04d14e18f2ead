// layout/save_messages.cc
#include "layout/save_messages.h"

#include <iterator>

#include "format/wire.h"

namespace ckpt::layout {
namespace {

using internal::WireReader;
using internal::WireWriter;

// Tags: one per kind of message, so that one read in the wrong place is refused.
constexpr uint8_t kDescriptionTag = 'D', kRequestsTag = 'Q', kDigestsTag = 'H', kPlanTag = 'P', kResultTag = 'R',
                  kKeyTableTag = 'K';

uint64_t MaxRank() { return static_cast<uint64_t>(ParseLimits{}.max_rank); }

std::string Who(int rank, const char* message) { return "save: rank " + std::to_string(rank) + "'s " + message; }

uint32_t U32(WireReader& r) {
  const uint64_t v = r.Varint();
  if (v > UINT32_MAX) r.Fail("an index of " + std::to_string(v) + " exceeds 32 bits");
  return static_cast<uint32_t>(v);
}

DType ReadDType(WireReader& r) {
  const uint8_t d = r.U8();
  if (d >= std::size(kAllDTypes)) r.Fail("unknown dtype " + std::to_string(d));
  return static_cast<DType>(d);
}

void WriteBox(WireWriter& w, const Box& b) {
  w.Ints(b.offsets);
  w.Ints(b.sizes);
}

Box ReadBox(WireReader& r) {
  Box b;
  b.offsets = r.Ints(MaxRank());
  b.sizes = r.Ints(MaxRank());
  return b;
}

// A list of chunk references: `ref(item)` of each item.
template <typename T, typename Ref>
void WriteRefs(WireWriter& w, const std::vector<T>& items, Ref&& ref) {
  w.Varint(items.size());
  for (const T& item : items) {
    const ChunkRef& c = ref(item);
    w.Varint(c.entry);
    w.Varint(c.chunk);
  }
}

std::vector<ChunkRef> ReadRefs(WireReader& r) {
  std::vector<ChunkRef> refs(r.Count(2));
  for (ChunkRef& c : refs) {
    c.entry = U32(r);
    c.chunk = U32(r);
  }
  return refs;
}

// Rank `rank`'s section of a broadcast of per-rank sections.
WireReader RankSection(WireReader& r, int rank, int world) {
  const std::size_t n = r.Count(1);
  if (n != static_cast<std::size_t>(world)) {
    r.Fail("lists for " + std::to_string(n) + " ranks, the group has " + std::to_string(world));
  }
  for (int i = 0; i < rank; ++i) r.Skip();
  WireReader mine = r.Section();
  for (int i = rank + 1; i < world; ++i) r.Skip();
  r.Finish();
  return mine;
}

}  // namespace

Message EncodeDescription(const RankDescription& description, std::span<const uint32_t> entries) {
  WireWriter w(kDescriptionTag);
  // A whole state (the usual case without the fast path) spends no byte on positions.
  w.U8(!entries.empty());
  w.Varint(description.size());
  int64_t last = -1;
  for (std::size_t i = 0; i < description.size(); ++i) {
    const EntryClaim& c = description[i];
    if (!entries.empty()) {
      w.Varint(static_cast<uint64_t>(entries[i] - last - 1));  // the gap since the last position
      last = entries[i];
    }
    w.Str(c.key);
    w.U8(static_cast<uint8_t>(c.kind));
    switch (c.kind) {
      case EntryKind::kTensor:
        w.U8(static_cast<uint8_t>(c.dtype));
        w.Ints(c.shape);
        w.Varint(c.boxes.size());
        for (const Box& b : c.boxes) WriteBox(w, b);
        break;
      case EntryKind::kScalar:
        w.U8(static_cast<uint8_t>(c.dtype));
        w.Str(c.value);
        break;
      case EntryKind::kBytes:
        w.Varint(c.size);
        break;
      case EntryKind::kJson:
        w.Str(c.value);
        break;
    }
  }
  return w.Take();
}

RankDescription DecodeDescription(std::span<const uint8_t> message, int rank) {
  std::vector<uint32_t> entries;
  return DecodeDescription(message, rank, entries);
}

RankDescription DecodeDescription(std::span<const uint8_t> message, int rank, std::vector<uint32_t>& entries) {
  WireReader r(message, Who(rank, "description"), kDescriptionTag);
  const uint8_t positioned = r.U8();
  if (positioned > 1) r.Fail("a flag of " + std::to_string(positioned));
  RankDescription d(r.Count(3));  // a key, a kind and at least one more byte each
  entries.resize(d.size());
  uint64_t next = 0;  // the least position the next claim may have
  for (std::size_t i = 0; i < d.size(); ++i) {
    EntryClaim& c = d[i];
    const uint64_t position = positioned ? next + r.Varint() : next;
    if (position > UINT32_MAX) r.Fail("an entry position of " + std::to_string(position) + " exceeds 32 bits");
    entries[i] = static_cast<uint32_t>(position);
    next = position + 1;
    c.key = r.Str();
    const uint8_t kind = r.U8();
    if (kind > static_cast<uint8_t>(EntryKind::kJson)) r.Fail("unknown entry kind " + std::to_string(kind));
    c.kind = static_cast<EntryKind>(kind);
    switch (c.kind) {
      case EntryKind::kTensor:
        c.dtype = ReadDType(r);
        c.shape = r.Ints(MaxRank());
        c.boxes.resize(r.Count(2));
        for (Box& b : c.boxes) b = ReadBox(r);
        break;
      case EntryKind::kScalar:
        c.dtype = ReadDType(r);
        c.value = r.Str();
        break;
      case EntryKind::kBytes:
        c.size = r.Varint();
        break;
      case EntryKind::kJson:
        c.value = r.Str();
        break;
    }
  }
  r.Finish();
  return d;
}

Message EncodeKeyTable(const KeyTable& table) {
  WireWriter w(kKeyTableTag);
  w.Varint(table.size());
  for (const TableEntry& e : table) {
    w.Str(e.key);
    w.U8(static_cast<uint8_t>(e.kind));
    switch (e.kind) {
      case EntryKind::kTensor:
        w.U8(static_cast<uint8_t>(e.dtype));
        w.Ints(e.shape);
        w.Varint(static_cast<uint64_t>(e.step));
        break;
      case EntryKind::kScalar:
        w.U8(static_cast<uint8_t>(e.dtype));
        w.Str(e.value);
        break;
      case EntryKind::kBytes:
        break;
      case EntryKind::kJson:
        w.Str(e.value);
        break;
    }
  }
  return w.Take();
}

KeyTable DecodeKeyTable(std::span<const uint8_t> message, int world) {
  WireReader r(message, Who(0, "key table"), kKeyTableTag);
  KeyTable table(r.Count(2));  // a key and a kind each
  for (TableEntry& e : table) {
    e.key = r.Str();
    const uint8_t kind = r.U8();
    if (kind > static_cast<uint8_t>(EntryKind::kJson)) r.Fail("unknown entry kind " + std::to_string(kind));
    e.kind = static_cast<EntryKind>(kind);
    switch (e.kind) {
      case EntryKind::kTensor: {
        e.dtype = ReadDType(r);
        e.shape = r.Ints(MaxRank());
        const uint64_t step = r.Varint();
        // A step is some rows of dim 0, in at most `world` parts (FastEntries relies on it:
        // no overflow, no division by 0, no part without a rank).
        if (step > 0 && (e.shape.empty() || e.shape[0] <= 0 || step > static_cast<uint64_t>(e.shape[0]) ||
                         (static_cast<uint64_t>(e.shape[0]) - 1) / step >= static_cast<uint64_t>(world))) {
          r.Fail("key '" + e.key + "': a step of " + std::to_string(step) + " rows for " + std::to_string(world) +
                 " ranks");
        }
        e.step = static_cast<int64_t>(step);
        break;
      }
      case EntryKind::kScalar:
        e.dtype = ReadDType(r);
        e.value = r.Str();
        break;
      case EntryKind::kBytes:
        break;
      case EntryKind::kJson:
        e.value = r.Str();
        break;
    }
  }
  r.Finish();
  return table;
}

Message EncodeRequests(const std::vector<std::vector<ChunkRef>>& per_rank) {
  WireWriter w(kRequestsTag);
  bool any = false;
  for (const auto& refs : per_rank) any = any || !refs.empty();
  w.U8(any);
  w.Varint(per_rank.size());
  for (const auto& refs : per_rank) {
    w.Section([&](WireWriter& s) { WriteRefs(s, refs, [](const ChunkRef& c) -> const ChunkRef& { return c; }); });
  }
  return w.Take();
}

std::vector<ChunkRef> DecodeRequests(std::span<const uint8_t> message, int rank, int world, bool& any) {
  WireReader r(message, Who(0, "replica requests"), kRequestsTag);
  const uint8_t flag = r.U8();
  if (flag > 1) r.Fail("a flag of " + std::to_string(flag));
  any = flag == 1;
  WireReader mine = RankSection(r, rank, world);
  std::vector<ChunkRef> refs = ReadRefs(mine);
  mine.Finish();
  return refs;
}

Message EncodeDigests(const std::vector<std::string>& digests) {
  WireWriter w(kDigestsTag);
  w.Varint(digests.size());
  for (const std::string& d : digests) w.Str(d);
  return w.Take();
}

std::vector<std::string> DecodeDigests(std::span<const uint8_t> message, int rank) {
  WireReader r(message, Who(rank, "replica digests"), kDigestsTag);
  std::vector<std::string> digests(r.Count(1));
  for (std::string& d : digests) d = r.Str();
  r.Finish();
  return digests;
}

Message EncodePlan(const std::string& staging, uint32_t key_count, const std::vector<std::vector<Write>>& writes) {
  WireWriter w(kPlanTag);
  w.Str(staging);
  w.Varint(key_count);
  w.Varint(writes.size());
  for (const auto& mine : writes) {
    w.Section([&](WireWriter& s) {
      WriteRefs(s, mine, [](const Write& x) -> const ChunkRef& { return x.ref; });
      for (const Write& x : mine) s.Varint(x.key);
    });
  }
  return w.Take();
}

PlanMessage DecodePlan(std::span<const uint8_t> message, int rank, int world, std::span<const uint8_t> fast,
                       std::span<const Write> fast_writes) {
  WireReader r(message, Who(0, "plan"), kPlanTag);
  PlanMessage p;
  p.staging = r.Str();
  p.key_count = U32(r);
  WireReader mine = RankSection(r, rank, world);
  std::vector<ChunkRef> listed = ReadRefs(mine);
  std::vector<uint32_t> keys(listed.size());
  uint32_t last = 0;
  for (uint32_t& k : keys) {
    k = U32(mine);
    if (k >= p.key_count) mine.Fail("a write of key " + std::to_string(k) + " of " + std::to_string(p.key_count));
    if (k < fast.size() && fast[k]) mine.Fail("a write of key " + std::to_string(k) + ", which is on the fast path");
    if (k < last) mine.Fail("a write of key " + std::to_string(k) + " after one of key " + std::to_string(last));
    last = k;
  }
  mine.Finish();
  if (fast_writes.empty()) {
    p.writes = std::move(listed);
    p.keys = std::move(keys);
    return p;
  }
  // Both lists are in plan order, and no key is in both: merged by key.
  p.writes.reserve(listed.size() + fast_writes.size());
  p.keys.reserve(listed.size() + fast_writes.size());
  std::size_t i = 0, j = 0;
  while (i < listed.size() || j < fast_writes.size()) {
    if (j == fast_writes.size() || (i < listed.size() && keys[i] < fast_writes[j].key)) {
      p.writes.push_back(listed[i]);
      p.keys.push_back(keys[i++]);
    } else {
      if (fast_writes[j].key >= p.key_count) r.Fail("a fast-path key " + std::to_string(fast_writes[j].key) + " of " +
                                                     std::to_string(p.key_count));
      p.writes.push_back(fast_writes[j].ref);
      p.keys.push_back(fast_writes[j++].key);
    }
  }
  return p;
}

Message EncodeResult(const RankResult& result) {
  WireWriter w(kResultTag);
  w.Str(result.file);
  w.Varint(result.bytes);
  w.Str(result.index);
  w.Varint(result.chunks);
  w.Varint(result.index_offset);
  w.Varint(result.index_bytes);
  return w.Take();
}

RankResult DecodeResult(std::span<const uint8_t> message, int rank) {
  WireReader r(message, Who(rank, "result"), kResultTag);
  RankResult res;
  res.file = r.Str();
  res.bytes = r.Varint();
  res.index = r.Str();
  res.chunks = r.Varint();
  res.index_offset = r.Varint();
  res.index_bytes = r.Varint();
  r.Finish();
  return res;
}

}  // namespace ckpt::layout
