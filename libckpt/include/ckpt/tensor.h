// ckpt/tensor.h: state dicts. Tensors are views over the caller's memory: saving copies
// nothing, loading writes straight into the caller's buffers.
//
// Thread-safety: a StateDict is a plain value; do not mutate one from several threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "ckpt/dtype.h"

namespace ckpt {

using Shape = std::vector<int64_t>;

// Number of elements of a shape; throws kInvalidArgument on a negative extent or overflow.
CKPT_API int64_t NumElements(const Shape& shape);

// A box in the index space of a tensor: offsets[d] <= i[d] < offsets[d] + sizes[d].
// A 0-D tensor has one box with empty offsets and sizes (one element).
struct CKPT_API Box {
  Shape offsets;
  Shape sizes;

  static Box Full(const Shape& shape) { return Box{Shape(shape.size(), 0), shape}; }
  int64_t NumElements() const { return ckpt::NumElements(sizes); }
  std::string ToString() const;  // "[0:4, 8:16]"
  friend bool operator==(const Box&, const Box&) = default;
};

// ---- Box geometry (pure: no I/O, deterministic) ---------------------------------------
// The intersection of two boxes of the same rank; nullopt if it is empty. A 0-D box
// intersects another 0-D box in its one element.
CKPT_API std::optional<Box> Intersect(const Box& a, const Box& b);
// True if `inner` lies inside `outer` (same rank).
CKPT_API bool Contains(const Box& outer, const Box& inner);
// True if the boxes share at least one element.
CKPT_API bool Overlaps(const Box& a, const Box& b);

// A run of `count` consecutive elements at element offset `src` of a row-major buffer laid
// out over one box and at offset `dst` of a buffer laid out over another.
struct BoxRun {
  int64_t src = 0;
  int64_t dst = 0;
  int64_t count = 0;
  friend bool operator==(const BoxRun&, const BoxRun&) = default;
};
// Calls `fn` for each maximal contiguous run of `region` between a row-major buffer over
// `src_box` and one over `dst_box`, in row-major order of `region`: copying `region` from
// one buffer to the other is one memcpy per run. Trailing dimensions whole in both boxes
// are merged (a block of whole rows is one run). REQUIRES: `region` lies inside both
// boxes, all three of the same rank.
CKPT_API void ForEachRun(const Box& src_box, const Box& dst_box, const Box& region,
                         const std::function<void(const BoxRun&)>& fn);
// The number of runs ForEachRun would produce, without producing them.
CKPT_API int64_t CountRuns(const Box& src_box, const Box& dst_box, const Box& region);
// Splits `box` into boxes of at most `max_bytes` each (at least one element each) for
// elements of `itemsize` bytes, cutting along the outermost dimensions first, so that each
// piece is a run of whole rows where one fits: for streaming a tensor in bounded memory.
// The pieces tile `box`, in row-major order; a box that fits (or is empty) is returned whole.
CKPT_API std::vector<Box> SplitBox(const Box& box, std::size_t itemsize, uint64_t max_bytes);

// One part of a balanced split: the items [begin, begin + count).
struct SplitPart {
  int64_t begin = 0;
  int64_t count = 0;
  friend bool operator==(const SplitPart&, const SplitPart&) = default;
};

// Part `part` of `n` items split over `parts` in order and as evenly as possible: the first
// n % parts parts get one item more than the others, as FSDP splits a parameter's rows (and
// as Tensor::Slice takes them: `auto [begin, count] = BalancedSplit(rows, world, rank)`).
// REQUIRES: n >= 0, parts >= 1, 0 <= part < parts.
constexpr SplitPart BalancedSplit(int64_t n, int parts, int part) {
  const int64_t base = n / parts, extra = n % parts;
  return {part * base + (part < extra ? part : extra), base + (part < extra ? 1 : 0)};
}

// Chunk::device of a chunk in host memory.
inline constexpr int kHostDevice = -1;

// One rank's piece of a tensor: `data` holds box.NumElements() elements in row-major
// order over box.sizes. For Save the memory is only read. With `device` >= 0, `data` is in
// the memory of that accelerator, copied through the registered backend (ckpt/device.h).
struct Chunk {
  Box box;
  void* data = nullptr;
  int device = kHostDevice;
};

struct CKPT_API Tensor {
  DType dtype = DType::kFloat32;
  Shape shape;                // global shape
  std::vector<Chunk> chunks;  // what this rank holds (save) or wants (load)

  // The whole tensor held by this rank. Several ranks may hold the same tensor
  // (data parallel): it is written once, after checking that the copies agree.
  static Tensor Full(DType dtype, Shape shape, void* data);
  // Some regions of a tensor of global shape `shape`.
  static Tensor Sharded(DType dtype, Shape shape, std::vector<Chunk> chunks);
  // The rows [begin, begin + count) along dimension `dim` of a tensor of global shape `shape`.
  static Tensor Slice(DType dtype, Shape shape, int dim, int64_t begin, int64_t count, void* data);
};

// A number: step, learning rate. Stored in metadata.json, not in a shard.
struct CKPT_API Scalar {
  DType dtype = DType::kInt64;
  std::variant<int64_t, double> value = int64_t{0};

  static Scalar Int(int64_t v, DType dtype = DType::kInt64) { return Scalar{dtype, v}; }
  static Scalar Float(double v, DType dtype = DType::kFloat64) { return Scalar{dtype, v}; }
  int64_t AsInt() const;
  double AsDouble() const;
};

// An opaque byte blob: RNG state, a data-loader position.
struct Bytes {
  std::vector<uint8_t> data;
};

// A small JSON value (configuration), as JSON text.
struct Json {
  std::string text = "null";
};

using Entry = std::variant<Tensor, Scalar, Bytes, Json>;

// Keys are non-empty UTF-8 without NUL bytes (FORMAT.md §3). Returns "" for a valid key,
// else what is wrong with it.
CKPT_API std::string KeyProblem(std::string_view key);
// The key with bytes that cannot be printed shown as \xNN, for error messages.
CKPT_API std::string PrintableKey(std::string_view key);

enum class EntryKind { kTensor, kScalar, kBytes, kJson };
CKPT_API EntryKind KindOf(const Entry& entry);
CKPT_API std::string_view EntryKindName(EntryKind kind);  // "tensor", "scalar", "bytes", "json"

// An ordered map from global fully-qualified key to entry. Keys are the same whether the
// state is full or sharded: sharding lives in each tensor's chunks, never in the key.
class CKPT_API StateDict {
 public:
  using Item = std::pair<std::string, Entry>;

  // Throws kInvalidArgument if the key is already present or not a valid key.
  Entry& Add(std::string key, Entry entry);
  Entry* Find(std::string_view key);
  const Entry* Find(std::string_view key) const;
  bool Contains(std::string_view key) const { return Find(key) != nullptr; }
  // Throws kNotFound naming the key.
  Entry& At(std::string_view key);
  const Entry& At(std::string_view key) const;

  std::size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace ckpt
