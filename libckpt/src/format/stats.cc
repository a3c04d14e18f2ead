// format/stats.cc
#include "format/stats.h"

#include <cmath>
#include <limits>

#include "format/names.h"

namespace ckpt::format {

void WriteStats(internal::JsonObjectText& parent, const ChunkStats& s) {
  parent.Name(names::kStats);
  internal::JsonObjectText o = parent.Child();
  const double real[] = {s.min, s.max, s.mean, s.l2};
  const int64_t count[] = {s.nan_count, s.inf_count, s.finite_count};
  for (int i = 0; i < 4; ++i) {
    o.Name(kStatReal[i]);
    o.RealOrNull(real[i]);
  }
  for (int i = 0; i < 3; ++i) {
    o.Name(kStatCount[i]);
    o.Integer(count[i]);
  }
  o.Close();
}

}  // namespace ckpt::format

namespace ckpt {

void StatsAccumulator::Add(const ChunkStats* s) {
  if (parts_++ == 0) {
    out_.min = std::numeric_limits<double>::infinity();
    out_.max = -std::numeric_limits<double>::infinity();
  }
  if (!s) {
    ++missing_;
    return;
  }
  out_.nan_count += s->nan_count;
  out_.inf_count += s->inf_count;
  out_.finite_count += s->finite_count;
  if (s->finite_count == 0) return;
  out_.min = std::min(out_.min, s->min);
  out_.max = std::max(out_.max, s->max);
  sum_ += s->mean * static_cast<double>(s->finite_count);
  sumsq_ += s->l2 * s->l2;
}

std::optional<ChunkStats> StatsAccumulator::Result() const {
  if (parts_ == 0 || missing_ > 0) return std::nullopt;
  ChunkStats out = out_;
  if (out.finite_count > 0) {
    out.mean = sum_ / static_cast<double>(out.finite_count);
    out.l2 = std::sqrt(sumsq_);
  } else {
    out.min = out.max = out.mean = std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

StatsAccumulator::Sums StatsAccumulator::sums() const {
  Sums s;
  s.sum = sum_;
  s.sumsq = sumsq_;
  if (parts_ > 0) {
    s.min = out_.min;
    s.max = out_.max;
  }
  s.nan_count = out_.nan_count;
  s.inf_count = out_.inf_count;
  s.finite_count = out_.finite_count;
  s.parts = parts_;
  s.missing = missing_;
  return s;
}

StatsAccumulator StatsAccumulator::FromSums(const Sums& s) {
  StatsAccumulator a;
  a.sum_ = s.sum;
  a.sumsq_ = s.sumsq;
  a.out_.min = s.min;
  a.out_.max = s.max;
  a.out_.nan_count = s.nan_count;
  a.out_.inf_count = s.inf_count;
  a.out_.finite_count = s.finite_count;
  a.parts_ = s.parts;
  a.missing_ = s.missing;
  return a;
}

std::optional<ChunkStats> CombineStats(const std::vector<const ChunkStats*>& parts) {
  StatsAccumulator acc;
  for (const ChunkStats* s : parts) acc.Add(s);
  return acc.Result();
}

}  // namespace ckpt
