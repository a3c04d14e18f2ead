// format/stats.cc
#include "format/stats.h"

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
