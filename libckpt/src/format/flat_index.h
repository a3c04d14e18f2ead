// format/flat_index.h: a hash index of positions in a sequence kept elsewhere (the keys of
// one JSON object, a checkpoint's entries): open addressing in one flat array, linear
// probing, at most half full. For 100,000 keys it takes a few MiB in one block, where a
// node-based std::unordered_map takes one allocation per key and a cache miss per step.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace ckpt::internal {

// Slots of (hash, position + 1); a second of 0 is a free slot. The table's size is zero or
// a power of two.
using IndexSlots = std::vector<std::pair<std::size_t, std::size_t>>;

// position + 1 of the element with `hash` for which same(position) holds, or 0.
template <class Same>
std::size_t IndexLookup(const IndexSlots& slots, std::size_t hash, Same&& same) {
  if (slots.empty()) return 0;
  const std::size_t mask = slots.size() - 1;
  for (std::size_t i = hash & mask;; i = (i + 1) & mask) {
    const auto& [h, p] = slots[i];
    if (p == 0) return 0;
    if (h == hash && same(p - 1)) return p;
  }
}

// Adds `position` (not in the index yet) with `hash`; `count` is the number of positions
// already in the index and is incremented.
inline void IndexInsert(IndexSlots& slots, std::size_t& count, std::size_t hash, std::size_t position) {
  if (2 * (count + 1) > slots.size()) {
    IndexSlots bigger(slots.empty() ? 16 : 2 * slots.size());
    const std::size_t mask = bigger.size() - 1;
    for (const auto& slot : slots) {
      if (slot.second == 0) continue;
      std::size_t i = slot.first & mask;
      while (bigger[i].second != 0) i = (i + 1) & mask;
      bigger[i] = slot;
    }
    slots.swap(bigger);
  }
  const std::size_t mask = slots.size() - 1;
  std::size_t i = hash & mask;
  while (slots[i].second != 0) i = (i + 1) & mask;
  slots[i] = {hash, position + 1};
  ++count;
}

}  // namespace ckpt::internal
