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
#include <cstddef>
#include <functional>
#include <string>
#include <unordered_map>
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

// DescribeLayout for chunks that arrive one at a time (a writer), in memory that grows with
// the grid's cells, not with what each chunk carries: while the chunks seen form part of a
// grid, only the parts of each dimension (as runs of equal parts) and one file position per
// cell are kept, 4 bytes a chunk. A chunk that does not fit (zero volume, an overlap, a part
// that would make the cells far outnumber the chunks, too many reorderings) turns the
// builder into a plain list, losslessly: every chunk seen is still there.
// Finish() hands back the chunks (cells in row-major order, then any listed ones), for
// DescribeLayout and, when they are not a grid, CheckTiling.
class LayoutBuilder {
 public:
  explicit LayoutBuilder(std::size_t rank) : dims_(rank) {}
  void Add(const Box& box, int32_t file);
  std::vector<PlacedBox> Finish() const;
  bool listed() const { return listed_; }  // fell back to the plain list
  std::size_t HeapBytes() const;           // what it holds, for tests and benchmarks

 private:
  struct Run {  // parts [start + i * size, start + (i + 1) * size) for i < count
    int64_t start, size, count;
  };
  struct Dim {
    std::vector<Run> runs;       // sorted by start, not overlapping
    std::vector<int64_t> first;  // index of each run's first part
    int64_t parts = 0;
  };
  // The part of `d` at `offset` with `size`: its index, or -1 when it has to be inserted
  // (then *insert_at is where), or -2 when it cannot be a part (overlap, other size).
  int64_t FindPart(const Dim& d, int64_t offset, int64_t size, std::size_t* insert_at) const;
  void InsertPart(std::size_t dim, std::size_t at, int64_t offset, int64_t size);
  int64_t Cells() const;
  void ToList();
  Box CellBox(int64_t cell) const;

  std::vector<Dim> dims_;
  std::vector<int32_t> cell_files_;  // row-major over the parts; -1: no chunk yet
  int64_t seen_ = 0;
  int64_t remapped_ = 0;  // cells moved by insertions in the middle (bounded, else a list)
  bool listed_ = false;
  std::vector<PlacedBox> list_;
};

// Finds the chunk of a layout whose box is exactly `box`: per dimension by arithmetic or
// binary search (a grid), or through a hash of the offsets (an explicit list), so a
// reader checking every record of a shard index against the layout pays log(parts) each.
class CellLocator {
 public:
  CellLocator(const TensorLayout& layout, const Shape& shape);
  // The file of the chunk `box`, or -1 when `box` is not one of the layout's chunks.
  int32_t FileOf(const Box& box) const;

 private:
  const TensorLayout& layout_;  // REQUIRES: outlives the locator
  Shape shape_;
  std::vector<std::vector<int64_t>> prefix_;  // grid dims with explicit sizes: part starts
  std::vector<int64_t> parts_;
  std::unordered_multimap<std::string, std::size_t> pieces_;  // offsets (bytes) -> piece
};

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
