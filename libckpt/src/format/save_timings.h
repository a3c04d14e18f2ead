// format/save_timings.h: metadata.json's "save_timings" (FORMAT.md §3.8), one writer and one
// reader: {"mode": "sync" or "async", and per phase {"min", "median", "max", "slowest_rank"}}.
#pragma once

#include "ckpt/metadata.h"
#include "format/json_value.h"
#include "format/metadata_model.h"

namespace ckpt::format {

// The member's value, the seconds rounded to the microsecond.
OrderedJson TimingsJson(const SaveTimings& t);
// Reads it; members it does not know are ignored (§1.5). Problems name ctx's file.
SaveTimings ReadTimings(const Ctx& ctx, const Json& j, int world_size);

}  // namespace ckpt::format
