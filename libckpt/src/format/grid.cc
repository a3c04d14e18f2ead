// format/grid.cc
#include "format/grid.h"

#include <algorithm>
#include <limits>



namespace ckpt::grid {
namespace {

// Cells a grid may have (FORMAT.md §8.4): far more than any job writes of one tensor
// (16,384 ranks x 1,024 chunks), few enough that walking them cannot hang a reader.
constexpr int64_t kMaxCells = int64_t{1} << 24;

// Whether two boxes of the same rank share an element (format/ sits below layout/, whose
// ckpt::Overlaps it cannot call).
bool Meets(const Box& a, const Box& b) {
  for (std::size_t d = 0; d < a.offsets.size(); ++d)
    if (a.offsets[d] >= b.offsets[d] + b.sizes[d] || b.offsets[d] >= a.offsets[d] + a.sizes[d]) return false;
  return true;
}

bool ZeroVolume(const Shape& shape) {
  return std::any_of(shape.begin(), shape.end(), [](int64_t s) { return s == 0; });
}

int64_t Parts(const DimSplit& split, int64_t extent) {
  if (!split.sizes.empty()) return static_cast<int64_t>(split.sizes.size());
  if (split.step <= 0 || extent <= 0) return 1;  // extent 0: one empty part
  // ceil(extent / step) without extent + step - 1, which overflows for a step read from a
  // file near 2^63 (a step larger than the extent is one part, FORMAT.md §3.3)
  return (extent - 1) / split.step + 1;
}

int64_t PartBegin(const DimSplit& split, int64_t part, const std::vector<int64_t>& prefix) {
  return split.sizes.empty() ? part * split.step : prefix[static_cast<std::size_t>(part)];
}

int64_t PartSize(const DimSplit& split, int64_t part, int64_t extent) {
  if (!split.sizes.empty()) return split.sizes[static_cast<std::size_t>(part)];
  if (split.step <= 0) return 0;
  return std::min(split.step, extent - part * split.step);
}

// The split a dimension's sorted distinct offsets make: the step rule when every part but
// the last has one size (the last no larger), else the explicit sizes.
DimSplit SplitOf(const std::vector<int64_t>& starts, int64_t extent) {
  DimSplit split;
  std::vector<int64_t> sizes(starts.size());
  for (std::size_t i = 0; i < starts.size(); ++i) sizes[i] = (i + 1 < starts.size() ? starts[i + 1] : extent) - starts[i];
  const int64_t step = sizes[0];
  bool regular = step > 0 || extent == 0;
  for (std::size_t i = 0; regular && i < sizes.size(); ++i) {
    regular = i + 1 < sizes.size() ? sizes[i] == step : sizes[i] > 0 && sizes[i] <= step;
  }
  if (extent == 0) regular = sizes.size() == 1;
  if (regular) {
    split.step = step;
  } else {
    split.sizes = std::move(sizes);
  }
  return split;
}

TensorLayout Explicit(const std::vector<PlacedBox>& chunks) {
  TensorLayout l;
  l.kind = TensorLayout::Kind::kChunks;
  l.pieces.reserve(chunks.size());
  for (const PlacedBox& c : chunks) l.pieces.push_back({c.box, c.file});
  return l;
}

std::vector<int64_t> Prefix(const DimSplit& split) {
  std::vector<int64_t> p;
  if (split.sizes.empty()) return p;
  p.resize(split.sizes.size());
  int64_t at = 0;
  for (std::size_t i = 0; i < split.sizes.size(); ++i) {
    p[i] = at;
    at += split.sizes[i];
  }
  return p;
}

// Parts [lo, hi) of dimension d meeting [begin, end).
std::pair<int64_t, int64_t> PartsMeeting(const DimSplit& split, const std::vector<int64_t>& prefix, int64_t begin,
                                         int64_t end) {
  if (begin >= end) return {0, 0};
  if (split.sizes.empty()) {
    if (split.step <= 0) return {0, 0};
    return {begin / split.step, (end - 1) / split.step + 1};  // end > begin >= 0: no overflow
  }
  const auto lo = std::upper_bound(prefix.begin(), prefix.end(), begin) - prefix.begin() - 1;
  const auto hi = std::lower_bound(prefix.begin(), prefix.end(), end) - prefix.begin();
  return {std::max<int64_t>(lo, 0), hi};
}

int32_t CellFile(const TensorLayout& l, int64_t cell, const std::vector<int64_t>& idx) {
  if (!l.cell_files.empty()) return l.cell_files[static_cast<std::size_t>(cell)];
  int64_t f = l.file_base;
  for (std::size_t d = 0; d < idx.size(); ++d) f += idx[d] * l.file_strides[d];
  return static_cast<int32_t>(f);
}

// Walks the cells [lo_d, hi_d) of a grid row-major, calling fn(box, file).
void WalkCells(const TensorLayout& l, const Shape& shape, const std::vector<std::pair<int64_t, int64_t>>& ranges,
               const std::function<void(const Box&, int32_t)>& fn) {
  const std::size_t rank = shape.size();
  for (const auto& [lo, hi] : ranges)
    if (lo >= hi) return;
  std::vector<std::vector<int64_t>> prefix(rank);
  std::vector<int64_t> parts(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    prefix[d] = Prefix(l.grid[d]);
    parts[d] = Parts(l.grid[d], shape[d]);
  }
  std::vector<int64_t> idx(rank);
  for (std::size_t d = 0; d < rank; ++d) idx[d] = ranges[d].first;
  Box box{Shape(rank), Shape(rank)};
  for (;;) {
    int64_t cell = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      cell = cell * parts[d] + idx[d];
      box.offsets[d] = PartBegin(l.grid[d], idx[d], prefix[d]);
      box.sizes[d] = PartSize(l.grid[d], idx[d], shape[d]);
    }
    fn(box, CellFile(l, cell, idx));
    std::size_t d = rank;
    while (d > 0) {
      --d;
      if (++idx[d] < ranges[d].second) break;
      idx[d] = ranges[d].first;
      if (d == 0) return;
    }
    if (rank == 0) return;
  }
}

}  // namespace

// ---- CellLocator

namespace {
std::string OffsetsKey(const Shape& offsets) {
  return std::string(reinterpret_cast<const char*>(offsets.data()), offsets.size() * sizeof(int64_t));
}
}  // namespace

CellLocator::CellLocator(const TensorLayout& layout, const Shape& shape) : layout_(layout), shape_(shape) {
  if (layout.kind == TensorLayout::Kind::kChunks) {
    pieces_.reserve(layout.pieces.size());
    for (std::size_t i = 0; i < layout.pieces.size(); ++i) pieces_.emplace(OffsetsKey(layout.pieces[i].box.offsets), i);
    return;
  }
  prefix_.resize(shape.size());
  parts_.resize(shape.size());
  for (std::size_t d = 0; d < shape.size() && d < layout.grid.size(); ++d) {
    prefix_[d] = Prefix(layout.grid[d]);
    parts_[d] = Parts(layout.grid[d], shape[d]);
  }
}

int32_t CellLocator::FileOf(const Box& box) const {
  if (box.offsets.size() != shape_.size() || box.sizes.size() != shape_.size()) return -1;
  if (layout_.kind == TensorLayout::Kind::kChunks) {
    // Pieces at the same offsets overlap (a tiling problem reported on its own): the
    // first one stands for them, so a list of identical pieces costs no more than one.
    const auto it = pieces_.find(OffsetsKey(box.offsets));
    if (it == pieces_.end()) return -1;
    const TensorLayout::Piece& p = layout_.pieces[it->second];
    return p.box.sizes == box.sizes ? p.file : -1;
  }
  if (layout_.grid.size() != shape_.size()) return -1;
  if (ZeroVolume(shape_)) return box == Box::Full(shape_) ? CellFile(layout_, 0, std::vector<int64_t>(shape_.size(), 0)) : -1;
  std::vector<int64_t> idx(shape_.size());
  int64_t cell = 0;
  for (std::size_t d = 0; d < shape_.size(); ++d) {
    const DimSplit& split = layout_.grid[d];
    const int64_t o = box.offsets[d];
    int64_t part;
    if (split.sizes.empty()) {
      if (split.step <= 0 || o < 0 || o % split.step != 0) return -1;
      part = o / split.step;
    } else {
      const auto& p = prefix_[d];
      const auto it = std::lower_bound(p.begin(), p.end(), o);
      if (it == p.end() || *it != o) return -1;
      part = it - p.begin();
    }
    if (part >= parts_[d] || PartSize(split, part, shape_[d]) != box.sizes[d]) return -1;
    idx[d] = part;
    cell = cell * parts_[d] + part;
  }
  return CellFile(layout_, cell, idx);
}

// ---- LayoutBuilder

int64_t LayoutBuilder::FindPart(const Dim& d, int64_t offset, int64_t size, std::size_t* insert_at) const {
  // The last run starting at or before `offset`.
  const auto it = std::upper_bound(d.runs.begin(), d.runs.end(), offset,
                                   [](int64_t o, const Run& r) { return o < r.start; });
  const std::size_t next = static_cast<std::size_t>(it - d.runs.begin());
  if (next > 0) {
    const Run& r = d.runs[next - 1];
    const int64_t end = r.start + r.size * r.count;
    if (offset < end) {
      if ((offset - r.start) % r.size != 0 || size != r.size) return -2;
      return d.first[next - 1] + (offset - r.start) / r.size;
    }
  }
  if (next < d.runs.size() && offset + size > d.runs[next].start) return -2;  // overlaps the next part
  *insert_at = next;
  return -1;
}

void LayoutBuilder::InsertPart(std::size_t dim, std::size_t at, int64_t offset, int64_t size) {
  Dim& d = dims_[dim];
  const int64_t index = at < d.runs.size() ? d.first[at] : d.parts;  // the new part's index
  // Row-major cells: a part appended to dimension 0 only adds cells at the end.
  const bool append = dim == 0 && index == d.parts;
  std::vector<int64_t> old_parts(dims_.size());
  for (std::size_t k = 0; k < dims_.size(); ++k) old_parts[k] = dims_[k].parts;
  if (at > 0 && d.runs[at - 1].size == size && d.runs[at - 1].start + size * d.runs[at - 1].count == offset) {
    ++d.runs[at - 1].count;  // extends the run before it
  } else {
    d.runs.insert(d.runs.begin() + static_cast<std::ptrdiff_t>(at), Run{offset, size, 1});
    d.first.insert(d.first.begin() + static_cast<std::ptrdiff_t>(at), index);
    ++at;
  }
  for (std::size_t k = at; k < d.runs.size(); ++k) ++d.first[k];
  ++d.parts;
  const int64_t cells = Cells();
  if (append) {
    cell_files_.resize(static_cast<std::size_t>(cells), -1);
    return;
  }
  // Renumber the cells: those at part >= index of this dimension move one up.
  std::vector<int32_t> moved(static_cast<std::size_t>(cells), -1);
  std::vector<int64_t> idx(dims_.size(), 0);
  for (std::size_t old = 0; old < cell_files_.size(); ++old) {
    int64_t rest = static_cast<int64_t>(old), cell = 0;
    for (std::size_t k = dims_.size(); k-- > 0;) {
      idx[k] = rest % old_parts[k];
      rest /= old_parts[k];
    }
    for (std::size_t k = 0; k < dims_.size(); ++k) {
      const int64_t i = k == dim && idx[k] >= index ? idx[k] + 1 : idx[k];
      cell = cell * dims_[k].parts + i;
    }
    moved[static_cast<std::size_t>(cell)] = cell_files_[old];
  }
  cell_files_ = std::move(moved);
  remapped_ += static_cast<int64_t>(cell_files_.size());
}

int64_t LayoutBuilder::Cells() const {
  int64_t n = 1;
  for (const Dim& d : dims_) n *= d.parts;
  return n;
}

Box LayoutBuilder::CellBox(int64_t cell) const {
  const std::size_t rank = dims_.size();
  Box b{Shape(rank), Shape(rank)};
  for (std::size_t k = rank; k-- > 0;) {
    const Dim& d = dims_[k];
    const int64_t i = cell % d.parts;
    cell /= d.parts;
    const auto it = std::upper_bound(d.first.begin(), d.first.end(), i) - 1;
    const Run& r = d.runs[static_cast<std::size_t>(it - d.first.begin())];
    b.offsets[k] = r.start + (i - *it) * r.size;
    b.sizes[k] = r.size;
  }
  return b;
}

void LayoutBuilder::ToList() {
  std::vector<PlacedBox> cells = Finish();
  listed_ = true;
  list_ = std::move(cells);
  std::vector<int32_t>().swap(cell_files_);
  std::vector<Dim>(dims_.size()).swap(dims_);
}

void LayoutBuilder::Add(const Box& box, int32_t file) {
  ++seen_;
  auto list = [&] {
    if (!listed_) ToList();
    list_.push_back({box, file});
  };
  if (listed_ || box.offsets.size() != dims_.size() || box.sizes.size() != dims_.size() || box.NumElements() == 0 ||
      file < 0) {
    return list();
  }
  if (dims_.empty()) {  // a 0-D tensor: one cell
    if (!cell_files_.empty()) return list();
    cell_files_.push_back(file);
    return;
  }
  for (;;) {
    int64_t cell = 0;
    bool placed = true;
    for (std::size_t k = 0; k < dims_.size(); ++k) {
      std::size_t at = 0;
      const int64_t i = FindPart(dims_[k], box.offsets[k], box.sizes[k], &at);
      if (i == -2) return list();
      if (i == -1) {
        // New cells must stay near what is written, and reordering bounded: else a list.
        const int64_t grown = Cells() / std::max<int64_t>(dims_[k].parts, 1) * (dims_[k].parts + 1);
        if (grown > 4 * seen_ + 64 || grown > (int64_t{1} << 24) || remapped_ > 8 * seen_ + 4096) return list();
        InsertPart(k, at, box.offsets[k], box.sizes[k]);
        placed = false;
        break;
      }
      cell = cell * dims_[k].parts + i;
    }
    if (!placed) continue;  // the parts changed: find the cell again
    if (cell_files_.size() < static_cast<std::size_t>(Cells())) cell_files_.resize(static_cast<std::size_t>(Cells()), -1);
    int32_t& slot = cell_files_[static_cast<std::size_t>(cell)];
    if (slot != -1) return list();  // the same cell twice
    slot = file;
    return;
  }
}

std::vector<PlacedBox> LayoutBuilder::Finish() const {
  if (listed_) return list_;
  std::vector<PlacedBox> out;
  for (std::size_t c = 0; c < cell_files_.size(); ++c) {
    if (cell_files_[c] == -1) continue;
    out.push_back({dims_.empty() ? Box{} : CellBox(static_cast<int64_t>(c)), cell_files_[c]});
  }
  return out;
}

std::size_t LayoutBuilder::HeapBytes() const {
  std::size_t n = cell_files_.capacity() * sizeof(int32_t) + dims_.capacity() * sizeof(Dim) +
                  list_.capacity() * sizeof(PlacedBox);
  for (const Dim& d : dims_) n += d.runs.capacity() * sizeof(Run) + d.first.capacity() * sizeof(int64_t);
  for (const PlacedBox& p : list_) n += (p.box.offsets.capacity() + p.box.sizes.capacity()) * sizeof(int64_t);
  return n;
}

TensorLayout DescribeLayout(const Shape& shape, const std::vector<PlacedBox>& chunks) {
  const std::size_t rank = shape.size();
  if (chunks.empty()) return Explicit(chunks);
  const bool zero = ZeroVolume(shape);
  if (zero && chunks.size() != 1) return Explicit(chunks);
  for (const PlacedBox& c : chunks) {
    if (c.box.offsets.size() != rank || c.box.sizes.size() != rank) return Explicit(chunks);
    if (!zero && c.box.NumElements() == 0) return Explicit(chunks);
  }
  TensorLayout l;
  l.kind = TensorLayout::Kind::kGrid;
  std::vector<std::vector<int64_t>> starts(rank);
  int64_t cells = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    auto& s = starts[d];
    s.reserve(chunks.size());
    for (const PlacedBox& c : chunks) s.push_back(c.box.offsets[d]);
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    if (s.front() != 0) return Explicit(chunks);
    if (__builtin_mul_overflow(cells, static_cast<int64_t>(s.size()), &cells) ||
        cells > static_cast<int64_t>(chunks.size())) {
      return Explicit(chunks);
    }
    l.grid.push_back(SplitOf(s, shape[d]));
  }
  if (cells != static_cast<int64_t>(chunks.size())) return Explicit(chunks);
  // Every chunk is exactly the cell at its offsets, each cell once.
  std::vector<int32_t> files(static_cast<std::size_t>(cells), -1);
  for (const PlacedBox& c : chunks) {
    int64_t cell = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      const auto& s = starts[d];
      const int64_t i = std::lower_bound(s.begin(), s.end(), c.box.offsets[d]) - s.begin();
      const int64_t size = (i + 1 < static_cast<int64_t>(s.size()) ? s[i + 1] : shape[d]) - s[i];
      if (c.box.sizes[d] != size) return Explicit(chunks);
      cell = cell * static_cast<int64_t>(s.size()) + i;
    }
    if (files[static_cast<std::size_t>(cell)] != -1 || c.file < 0) return Explicit(chunks);
    files[static_cast<std::size_t>(cell)] = c.file;
  }
  // An affine cell -> file map when one fits every cell.
  l.file_base = files[0];
  l.file_strides.assign(rank, 0);
  int64_t unit = 1;
  for (std::size_t d = rank; d-- > 0;) {
    if (starts[d].size() > 1) l.file_strides[d] = files[static_cast<std::size_t>(unit)] - l.file_base;
    unit *= static_cast<int64_t>(starts[d].size());
  }
  bool affine = true;
  std::vector<int64_t> idx(rank, 0);
  for (int64_t cell = 0; affine && cell < cells; ++cell) {
    int64_t rest = cell, f = l.file_base;
    for (std::size_t d = rank; d-- > 0;) {
      const int64_t n = static_cast<int64_t>(starts[d].size());
      f += (rest % n) * l.file_strides[d];
      rest /= n;
    }
    affine = f == files[static_cast<std::size_t>(cell)];
  }
  if (!affine) {
    l.file_base = 0;
    l.file_strides.clear();
    l.cell_files = std::move(files);
  }
  return l;
}

int64_t ChunkCount(const TensorLayout& l, const Shape& shape) {
  if (l.kind == TensorLayout::Kind::kChunks) return static_cast<int64_t>(l.pieces.size());
  if (ZeroVolume(shape)) return 1;
  int64_t n = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) n *= Parts(l.grid[d], shape[d]);
  return n;
}

void ForEachCell(const TensorLayout& l, const Shape& shape, const Box& region,
                 const std::function<void(const Box&, int32_t)>& fn) {
  if (l.kind == TensorLayout::Kind::kChunks) {
    for (const TensorLayout::Piece& p : l.pieces)
      if (p.box.offsets.size() == region.offsets.size() && Meets(p.box, region)) fn(p.box, p.file);
    return;
  }
  if (ZeroVolume(shape)) return;  // nothing to read
  std::vector<std::pair<int64_t, int64_t>> ranges(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) {
    ranges[d] = PartsMeeting(l.grid[d], Prefix(l.grid[d]), region.offsets[d],
                             region.offsets[d] + region.sizes[d]);
  }
  WalkCells(l, shape, ranges, fn);
}

void ForEachChunk(const TensorLayout& l, const Shape& shape, const std::function<void(const Box&, int32_t)>& fn) {
  if (l.kind == TensorLayout::Kind::kChunks) {
    for (const TensorLayout::Piece& p : l.pieces) fn(p.box, p.file);
    return;
  }
  std::vector<std::pair<int64_t, int64_t>> ranges(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) ranges[d] = {0, Parts(l.grid[d], shape[d])};
  WalkCells(l, shape, ranges, fn);
}

std::vector<std::string> CheckLayout(const std::string& key, const TensorLayout& l, const Shape& shape,
                                     std::size_t num_files) {
  std::vector<std::string> problems;
  const auto bad = [&](const std::string& why) { problems.push_back("entry '" + key + "': layout: " + why); };
  const auto file_ok = [&](int64_t f) { return f >= 0 && static_cast<uint64_t>(f) < num_files; };
  if (l.kind == TensorLayout::Kind::kChunks) {
    for (const TensorLayout::Piece& p : l.pieces) {
      if (!file_ok(p.file)) {
        bad("chunk " + p.box.ToString() + " names file " + std::to_string(p.file) + " of " + std::to_string(num_files));
        break;
      }
    }
    return problems;
  }
  if (l.grid.size() != shape.size()) {
    bad("a grid of " + std::to_string(l.grid.size()) + " dimensions for a tensor of " + std::to_string(shape.size()));
    return problems;
  }
  int64_t cells = 1;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const DimSplit& s = l.grid[d];
    const std::string dim = "dimension " + std::to_string(d) + " (extent " + std::to_string(shape[d]) + ")";
    if (s.sizes.empty()) {
      if (shape[d] == 0 ? s.step != 0 : s.step <= 0) {
        bad(dim + ": step " + std::to_string(s.step) + " is invalid");
        return problems;
      }
    } else {
      int64_t sum = 0;
      bool ok = true;
      for (int64_t v : s.sizes) ok = ok && v > 0 && !__builtin_add_overflow(sum, v, &sum);
      if (shape[d] == 0) ok = s.sizes.size() == 1 && s.sizes[0] == 0;
      if (!ok || (shape[d] != 0 && sum != shape[d])) {
        bad(dim + ": part sizes must be positive and sum to the extent");
        return problems;
      }
    }
    if (__builtin_mul_overflow(cells, Parts(s, shape[d]), &cells) || cells > kMaxCells) {
      bad("more than " + std::to_string(kMaxCells) + " cells");
      return problems;
    }
  }
  if (cells != 1 && ZeroVolume(shape)) {  // FORMAT.md §3.3, §8.7: one chunk, the whole tensor
    bad("a grid of " + std::to_string(cells) + " cells for a tensor of zero volume (it has exactly one chunk)");
    return problems;
  }
  if (!l.cell_files.empty()) {
    if (static_cast<int64_t>(l.cell_files.size()) != cells) {
      bad(std::to_string(l.cell_files.size()) + " cell files for " + std::to_string(cells) + " cells");
      return problems;
    }
    for (int32_t f : l.cell_files) {
      if (!file_ok(f)) {
        bad("a cell names file " + std::to_string(f) + " of " + std::to_string(num_files));
        return problems;
      }
    }
    return problems;
  }
  if (l.file_strides.size() != shape.size()) {
    bad("'strides' has " + std::to_string(l.file_strides.size()) + " elements for " + std::to_string(shape.size()) +
        " dimensions");
    return problems;
  }
  // The map is affine: its smallest and largest values are at corners of the grid.
  int64_t lo = l.file_base, hi = l.file_base;
  bool overflow = false;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    int64_t reach = 0;
    const int64_t parts = Parts(l.grid[d], shape[d]);
    overflow |= __builtin_mul_overflow(parts - 1, l.file_strides[d], &reach);
    overflow |= __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
  }
  if (overflow || !file_ok(lo) || !file_ok(hi)) {
    bad("cells name files outside the " + std::to_string(num_files) + " listed");
  }
  return problems;
}

}  // namespace ckpt::grid

int64_t ckpt::EntryMeta::ChunkCount() const { return grid::ChunkCount(layout, shape); }
