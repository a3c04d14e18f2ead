// comm/comm.cc: the generic collectives of Comm, built on Gather and Broadcast, and the
// single-process backend.
#include <algorithm>
#include <bit>
#include <cstring>

#include "ckpt/comm.h"
#include "ckpt/error.h"
#include "comm/reduce.h"

namespace ckpt {
namespace internal {
namespace {

template <typename T>
void ReduceTyped(T* acc, const T* in, std::size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(acc[i] + in[i]);
      break;
    case ReduceOp::kMax:
      for (std::size_t i = 0; i < n; ++i) acc[i] = std::max(acc[i], in[i]);
      break;
    case ReduceOp::kMin:
      for (std::size_t i = 0; i < n; ++i) acc[i] = std::min(acc[i], in[i]);
      break;
  }
}

float Bf16ToFloat(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }
uint16_t FloatToBf16(float f) {  // round to nearest even
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

void ReduceInto(void* acc, const void* in, std::size_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat64: return ReduceTyped(static_cast<double*>(acc), static_cast<const double*>(in), n, op);
    case DType::kFloat32: return ReduceTyped(static_cast<float*>(acc), static_cast<const float*>(in), n, op);
    case DType::kInt8: return ReduceTyped(static_cast<int8_t*>(acc), static_cast<const int8_t*>(in), n, op);
    case DType::kInt16: return ReduceTyped(static_cast<int16_t*>(acc), static_cast<const int16_t*>(in), n, op);
    case DType::kInt32: return ReduceTyped(static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), n, op);
    case DType::kInt64: return ReduceTyped(static_cast<int64_t*>(acc), static_cast<const int64_t*>(in), n, op);
    case DType::kUInt8: return ReduceTyped(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(in), n, op);
    case DType::kBFloat16: {
      auto* a = static_cast<uint16_t*>(acc);
      const auto* b = static_cast<const uint16_t*>(in);
      for (std::size_t i = 0; i < n; ++i) {
        float x = Bf16ToFloat(a[i]), y = Bf16ToFloat(b[i]);
        ReduceTyped(&x, &y, 1, op);
        a[i] = FloatToBf16(x);
      }
      return;
    }
    default:
      throw Error(ErrorCode::kUnsupported,
                  "reduction over dtype " + std::string(DTypeName(dtype)) + " is not supported");
  }
}

}  // namespace internal

std::vector<ByteBuffer> Comm::AllGather(std::span<const uint8_t> mine) {
  std::vector<ByteBuffer> all = Gather(mine, 0);
  // Root packs [count][len, bytes]... and broadcasts.
  ByteBuffer packed;
  if (rank() == 0) {
    for (const ByteBuffer& b : all) {
      const uint64_t len = b.size();
      const auto* l = reinterpret_cast<const uint8_t*>(&len);
      packed.insert(packed.end(), l, l + sizeof len);
      packed.insert(packed.end(), b.begin(), b.end());
    }
  }
  Broadcast(packed, 0);
  all.assign(static_cast<std::size_t>(size()), {});
  std::size_t pos = 0;
  for (int r = 0; r < size(); ++r) {
    uint64_t len;
    std::memcpy(&len, packed.data() + pos, sizeof len);
    pos += sizeof len;
    all[r].assign(packed.begin() + static_cast<std::ptrdiff_t>(pos),
                  packed.begin() + static_cast<std::ptrdiff_t>(pos + len));
    pos += len;
  }
  return all;
}

void Comm::AllReduce(void* data, std::size_t count, DType dtype, ReduceOp op) {
  const std::size_t bytes = count * DTypeSize(dtype);
  std::vector<ByteBuffer> all = AllGather({static_cast<const uint8_t*>(data), bytes});
  // Reduce in rank order on every rank so the result is bit-identical everywhere.
  std::memcpy(data, all[0].data(), bytes);
  for (int r = 1; r < size(); ++r) internal::ReduceInto(data, all[r].data(), count, dtype, op);
}

void Comm::ReduceScatter(const void* send, void* recv, std::size_t block_count, DType dtype, ReduceOp op) {
  const std::size_t item = DTypeSize(dtype);
  std::vector<uint8_t> all(static_cast<const uint8_t*>(send),
                           static_cast<const uint8_t*>(send) + block_count * item * size());
  AllReduce(all.data(), block_count * size(), dtype, op);
  std::memcpy(recv, all.data() + block_count * item * rank(), block_count * item);
}

void Comm::AllGatherInto(const void* send, void* recv, std::size_t block_bytes) {
  std::vector<ByteBuffer> all = AllGather({static_cast<const uint8_t*>(send), block_bytes});
  for (int r = 0; r < size(); ++r) {
    std::memcpy(static_cast<uint8_t*>(recv) + block_bytes * r, all[r].data(), block_bytes);
  }
}

std::unique_ptr<Comm> Comm::Dup() { return Split(0, rank()); }

bool Comm::AllOk(bool ok) {
  uint8_t v = ok ? 1 : 0;
  AllReduce(&v, 1, DType::kUInt8, ReduceOp::kMin);
  return v == 1;
}

std::string Comm::AgreeOnErrors(const std::string& my_error) {
  if (size() == 1) return my_error;
  std::vector<ByteBuffer> all =
      AllGather({reinterpret_cast<const uint8_t*>(my_error.data()), my_error.size()});
  std::string joined;
  for (int r = 0; r < size(); ++r) {
    if (all[r].empty()) continue;
    if (!joined.empty()) joined += "\n";
    joined += "rank " + std::to_string(r) + ": " + std::string(all[r].begin(), all[r].end());
  }
  return joined;
}

std::vector<ByteBuffer> SingleComm::Gather(std::span<const uint8_t> mine, int) {
  return {ByteBuffer(mine.begin(), mine.end())};
}

}  // namespace ckpt
