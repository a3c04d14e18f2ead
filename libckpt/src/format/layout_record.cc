// format/layout_record.cc
#include "format/layout_record.h"

#include <limits>

#include "format/grid.h"
#include "format/json_text.h"
#include "format/names.h"

namespace ckpt::format {
namespace {

namespace n = names;
using internal::JsonObjectText;

int64_t LayoutInt(const Ctx& ctx, const Json& v, const char* what) {
  if (!v.is_number_integer()) ctx.Fail(std::string("layout: '") + what + "' must be an integer");
  if (v.is_number_unsigned() && !IsNonNegativeInt64(v)) {
    ctx.Fail(std::string("layout: '") + what + "' is too large");
  }
  return v.get<int64_t>();
}

int32_t FileNumber(const Ctx& ctx, const Json& v, std::size_t num_files) {
  const int64_t f = LayoutInt(ctx, v, n::kFile);
  if (f < 0 || static_cast<uint64_t>(f) >= num_files) {
    ctx.Fail("file " + std::to_string(f) + " is not one of the " + std::to_string(num_files) + " in 'files'");
  }
  return static_cast<int32_t>(f);
}

std::vector<int64_t> LayoutDims(const Ctx& ctx, const Json& v, const char* what, int max_rank) {
  if (!v.is_array()) ctx.Fail(std::string("layout: '") + what + "' must be an array");
  if (v.size() > static_cast<std::size_t>(max_rank)) ctx.Fail(std::string("layout: '") + what + "' has too many dimensions");
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const Json& x : v) {
    const int64_t i = LayoutInt(ctx, x, what);
    if (i < 0) ctx.Fail(std::string("layout: an element of '") + what + "' is negative");
    out.push_back(i);
  }
  return out;
}

// An explicit layout: its pieces, each inside `shape`.
void LayoutChunks(const Ctx& ctx, const Json& chunks, const Shape& shape, std::size_t num_files, int max_rank,
                  TensorLayout& l) {
  l.kind = TensorLayout::Kind::kChunks;
  if (!chunks.is_array()) ctx.Fail("layout: 'chunks' must be an array");
  for (const Json& c : chunks) {
    if (!c.is_object() || !c.contains(n::kOffsets) || !c.contains(n::kSizes) || !c.contains(n::kFile)) {
      ctx.Fail("layout: a chunk must be an object with 'offsets', 'sizes' and 'file'");
    }
    TensorLayout::Piece p;
    p.box.offsets = LayoutDims(ctx, c.at(n::kOffsets), n::kOffsets, max_rank);
    p.box.sizes = LayoutDims(ctx, c.at(n::kSizes), n::kSizes, max_rank);
    p.file = FileNumber(ctx, c.at(n::kFile), num_files);
    if (p.box.offsets.size() != shape.size() || p.box.sizes.size() != shape.size()) {
      ctx.Fail("chunk " + p.box.ToString() + " has a different rank than shape " + DimsText(shape));
    }
    for (std::size_t d = 0; d < shape.size(); ++d) {
      int64_t end;
      if (__builtin_add_overflow(p.box.offsets[d], p.box.sizes[d], &end) || end > shape[d]) {
        ctx.Fail("chunk " + p.box.ToString() + " lies outside shape " + DimsText(shape));
      }
    }
    l.pieces.push_back(std::move(p));
  }
}

// A grid layout: one split per dimension, and the files of its cells.
void LayoutGrid(const Ctx& ctx, const Json& j, const Shape& shape, std::size_t num_files, TensorLayout& l) {
  l.kind = TensorLayout::Kind::kGrid;
  const Json& grid = j.at(n::kGrid);
  if (!grid.is_array() || grid.size() != shape.size()) {
    ctx.Fail("layout: 'grid' must have one split per dimension of shape " + DimsText(shape));
  }
  for (const Json& d : grid) {
    DimSplit split;
    if (!d.is_object() || d.contains(n::kStep) == d.contains(n::kSizes)) {
      ctx.Fail("layout: a split must be an object with either 'step' or 'sizes'");
    }
    if (d.contains(n::kStep)) split.step = LayoutInt(ctx, d.at(n::kStep), n::kStep);
    else split.sizes = LayoutDims(ctx, d.at(n::kSizes), n::kSizes, std::numeric_limits<int>::max());
    l.grid.push_back(std::move(split));
  }
  const Json* files = Member(j, n::kFiles);
  if (files && files->is_array()) {
    l.cell_files.reserve(files->size());
    for (const Json& f : *files) l.cell_files.push_back(FileNumber(ctx, f, num_files));
  } else if (files && files->is_object() && files->contains(n::kBase) && files->contains(n::kStrides)) {
    l.file_base = LayoutInt(ctx, files->at(n::kBase), n::kBase);
    const Json& strides = files->at(n::kStrides);
    if (!strides.is_array()) ctx.Fail("layout: 'strides' must be an array");
    for (const Json& t : strides) l.file_strides.push_back(LayoutInt(ctx, t, n::kStrides));
  } else {
    ctx.Fail("layout: 'files' must be an array of file numbers or {\"base\", \"strides\"}");
  }
}

}  // namespace

void WriteLayout(const TensorLayout& l, std::string& out) {
  using internal::JsonObjectText;
  JsonObjectText j(out);
  if (l.kind == TensorLayout::Kind::kChunks) {
    j.Name(n::kChunks);
    out += '[';
    for (std::size_t i = 0; i < l.pieces.size(); ++i) {
      if (i) out += ',';
      JsonObjectText c(out);
      c.Name(n::kFile);
      c.Integer(l.pieces[i].file);
      c.Name(n::kOffsets);
      c.Integers(l.pieces[i].box.offsets);
      c.Name(n::kSizes);
      c.Integers(l.pieces[i].box.sizes);
      c.Close();
    }
    out += ']';
    j.Close();
    return;
  }
  j.Name(n::kFiles);
  if (!l.cell_files.empty()) {
    out += '[';
    for (std::size_t i = 0; i < l.cell_files.size(); ++i) {
      if (i) out += ',';
      JsonObjectText::Integer(out, l.cell_files[i]);
    }
    out += ']';
  } else {
    JsonObjectText f(out);
    f.Name(n::kBase);
    f.Integer(l.file_base);
    f.Name(n::kStrides);
    f.Integers(l.file_strides);
    f.Close();
  }
  j.Name(n::kGrid);
  out += '[';
  for (std::size_t i = 0; i < l.grid.size(); ++i) {
    if (i) out += ',';
    JsonObjectText d(out);
    if (l.grid[i].sizes.empty()) {
      d.Name(n::kStep);
      d.Integer(l.grid[i].step);
    } else {
      d.Name(n::kSizes);
      d.Integers(l.grid[i].sizes);
    }
    d.Close();
  }
  out += ']';
  j.Close();
}

TensorLayout ReadLayout(const Ctx& ctx, const Json& e, const Shape& shape, std::size_t num_files, int max_rank) {
  const Json* j = Member(e, n::kLayout);
  if (!j) ctx.Fail("missing field 'layout'");
  if (!j->is_object()) ctx.Fail("'layout' must be an object");
  TensorLayout l;
  try {
    if (j->contains(n::kGrid) == j->contains(n::kChunks)) ctx.Fail("'layout' must hold either 'grid' or 'chunks'");
    if (j->contains(n::kChunks)) {
      LayoutChunks(ctx, j->at(n::kChunks), shape, num_files, max_rank, l);
    } else {
      LayoutGrid(ctx, *j, shape, num_files, l);
    }
  } catch (const Json::exception& ex) {
    ctx.Fail(std::string("layout: ") + ex.what());
  }
  if (const auto problems = grid::CheckLayout(ctx.key ? *ctx.key : std::string(), l, shape, num_files);
      !problems.empty()) {
    throw Error(ErrorCode::kCorrupt, std::string(ctx.source) + ": " + problems.front());
  }
  return l;
}

}  // namespace ckpt::format
