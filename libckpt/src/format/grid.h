// format/grid.h: a tensor's layout as a rule (FORMAT.md §3.3), so that metadata grows with
// keys and files, not with chunks. Pure functions: no files, no HDF5.
//
//   DescribeLayout(shape, chunks)   the compact layout of a tensor's stored chunks: a grid
//                                   (step rule or explicit part sizes per dim, an affine or
//                                   explicit cell→file map) when they form one, else the list
//   ForEachCell(layout, shape, r)   the chunks (box, file) that meet region r, found per
//                                   dimension by arithmetic or binary search
//   CellCount / CellBox             for walking every chunk in layout order
//
// Threading: plain values and functions; no shared state.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/metadata.h"

namespace ckpt::grid {

// A chunk as the layout sees it: its box and the position of its file in Metadata::files.
struct PlacedBox {
  Box box;
  int32_t file = 0;
};

// The compact layout of chunks that tile `shape` (REQUIRES: they do; CheckTiling). A grid
// when the distinct offsets of each dimension cut it into parts and every non-empty cell is
// one chunk; the step rule when all parts but the last have one size; an affine file map
// when one fits every cell.
TensorLayout DescribeLayout(const Shape& shape, const std::vector<PlacedBox>& chunks);

// Number of chunks the layout holds (a grid: its cells of non-zero volume; a tensor of zero
// volume: 1).
int64_t ChunkCount(const TensorLayout& layout, const Shape& shape);

// Calls fn(box, file) for every chunk of the layout meeting `region` (a region of zero
// volume meets nothing unless the tensor has zero volume), in layout order (row-major over
// the cells). Cost: the cells met, plus log(parts) per dimension.
void ForEachCell(const TensorLayout& layout, const Shape& shape, const Box& region,
                 const std::function<void(const Box&, int32_t)>& fn);

// Every chunk in layout order.
void ForEachChunk(const TensorLayout& layout, const Shape& shape,
                  const std::function<void(const Box&, int32_t)>& fn);

// Problems in a layout read from a file: parts that do not sum to the extent, a step that
// is not positive, a file position outside [0, num_files), a cell→file list of the wrong
// length, rank mismatches. Each message names `key`. Empty when valid. Explicit chunk lists
// are checked by CheckTiling.
std::vector<std::string> CheckLayout(const std::string& key, const TensorLayout& layout, const Shape& shape,
                                     std::size_t num_files);

}  // namespace ckpt::grid
