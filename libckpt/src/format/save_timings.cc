// format/save_timings.cc
#include "format/save_timings.h"

#include <cmath>
#include <iterator>

#include "format/names.h"

namespace ckpt::format {
namespace {

namespace n = names;

// Seconds to the microsecond: what a clock read twice tells, without digits of noise.
double Microseconds(double s) { return std::round(s * 1e6) / 1e6; }

[[noreturn]] void TimingsProblem(const Ctx& ctx, const std::string& what) {
  ctx.Fail(std::string(n::kSaveTimings) + ": " + what);
}

PhaseTiming ParsePhase(const Ctx& ctx, const Json& j, const std::string& name, int world_size) {
  const auto p = j.find(name);
  if (p == j.end() || !p->is_object()) TimingsProblem(ctx, "'" + name + "' must be an object");
  PhaseTiming out;
  double* values[] = {&out.min, &out.median, &out.max};
  const char* keys[] = {n::kMin, n::kMedian, n::kMax};
  for (int k = 0; k < 3; ++k) {
    const auto x = p->find(keys[k]);
    if (x == p->end() || !x->is_number() || !(x->get<double>() >= 0) || !std::isfinite(x->get<double>())) {
      TimingsProblem(ctx, "'" + name + "." + keys[k] + "' must be a non-negative number of seconds");
    }
    *values[k] = x->get<double>();
  }
  if (!(out.min <= out.median && out.median <= out.max)) TimingsProblem(ctx, "'" + name + "': min <= median <= max does not hold");
  const auto r = p->find(n::kSlowestRank);
  if (r == p->end() || !r->is_number_integer() || r->get<int64_t>() < 0 || r->get<int64_t>() >= world_size) {
    TimingsProblem(ctx, "'" + name + ".slowest_rank' must be a rank below world_size " + std::to_string(world_size));
  }
  out.slowest_rank = static_cast<int>(r->get<int64_t>());
  return out;
}

}  // namespace

OrderedJson TimingsJson(const SaveTimings& t) {
  OrderedJson j;
  j[n::kMode] = t.async ? n::kAsync : n::kSync;
  for (std::size_t i = 0; i < std::size(kSavePhaseNames); ++i) {
    const PhaseTiming& p = SavePhase(t, i);
    j[kSavePhaseNames[i]] = {{n::kMin, Microseconds(p.min)},
                             {n::kMedian, Microseconds(p.median)},
                             {n::kMax, Microseconds(p.max)},
                             {n::kSlowestRank, p.slowest_rank}};
  }
  return j;
}

SaveTimings ReadTimings(const Ctx& ctx, const Json& j, int world_size) {
  if (!j.is_object()) TimingsProblem(ctx, "must be an object");
  const auto mode = j.find(n::kMode);
  if (mode == j.end() || !mode->is_string() || (*mode != n::kSync && *mode != n::kAsync)) {
    TimingsProblem(ctx, "'mode' must be \"sync\" or \"async\"");
  }
  SaveTimings t;
  t.async = *mode == n::kAsync;
  for (std::size_t i = 0; i < std::size(kSavePhaseNames); ++i) {
    SavePhase(t, i) = ParsePhase(ctx, j, kSavePhaseNames[i], world_size);
  }
  return t;
}

}  // namespace ckpt::format
