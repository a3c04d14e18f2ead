// format/layout_record.h: a tensor's layout (FORMAT.md §3.3) as a version 2 metadata.json
// entry holds it, one writer and one reader: {"chunks": [{"file", "offsets", "sizes"}...]}
// or {"files": [...] or {"base", "strides"}, "grid": [{"step"} or {"sizes"}...]}.
#pragma once

#include <string>

#include "ckpt/metadata.h"
#include "format/json_value.h"
#include "format/metadata_model.h"

namespace ckpt::format {

// Appends the layout's JSON, its members in sorted order (as nlohmann::json, a std::map,
// wrote them before), without a tree: a checkpoint of many small tensors has one per tensor.
void WriteLayout(const TensorLayout& l, std::string& out);

// The "layout" member of entry `e` (of `shape`, in a document of `num_files` files),
// checked (format/grid.h's CheckLayout too); problems name ctx's file and entry.
TensorLayout ReadLayout(const Ctx& ctx, const Json& e, const Shape& shape, std::size_t num_files, int max_rank);

}  // namespace ckpt::format
