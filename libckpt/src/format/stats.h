// format/stats.h: a chunk's or tensor's statistics object (FORMAT.md §7.3), one writer and
// one reader, wherever it stands (metadata.json v1 chunks, v2 entries, shard index records):
// {"min", "max", "mean", "l2": number, or null where not finite; "nan_count", "inf_count",
// "finite_count": non-negative integers}.
#pragma once

#include "ckpt/metadata.h"
#include "format/json_text.h"
#include "format/json_value.h"
#include "format/names.h"

namespace ckpt::format {

// The members, in the order they are written.
inline constexpr const char* kStatReal[] = {names::kMin, names::kMax, names::kMean, names::kL2};
inline constexpr const char* kStatCount[] = {names::kNanCount, names::kInfCount, names::kFiniteCount};

// The object, as dump() writes it.
void WriteStats(internal::JsonObjectText& parent, const ChunkStats& s);

// Reads a stats object. `fail(member, value)` is called on the first member that does not
// hold (value: nullptr when it is missing) and must throw. A count must be a non-negative
// 64-bit integer. A real must be a number or null (NaN) when `strict`; otherwise a real
// that is missing or not a number reads as NaN.
template <class Fail>
ChunkStats ReadStats(const Json& o, bool strict, Fail&& fail) {
  ChunkStats s;
  double* real[] = {&s.min, &s.max, &s.mean, &s.l2};
  int64_t* count[] = {&s.nan_count, &s.inf_count, &s.finite_count};
  for (int i = 0; i < 4; ++i) {
    const auto v = o.find(kStatReal[i]);
    if (strict && v == o.end()) fail(kStatReal[i], nullptr);
    const bool number = v != o.end() && v->is_number();
    if (strict && v != o.end() && !number && !v->is_null()) fail(kStatReal[i], &*v);
    *real[i] = number ? v->get<double>() : std::numeric_limits<double>::quiet_NaN();
  }
  for (int i = 0; i < 3; ++i) {
    const auto v = o.find(kStatCount[i]);
    if (v == o.end()) fail(kStatCount[i], nullptr);
    if (!IsNonNegativeInt64(*v)) fail(kStatCount[i], &*v);
    *count[i] = static_cast<int64_t>(v->get<uint64_t>());
  }
  return s;
}

}  // namespace ckpt::format
