// Random numbers and the resumable data loader.
#include "ckpt/runtime/data.h"

#include <cmath>
#include <cstring>

#include "ckpt/error.h"

namespace ckpt::runtime {
namespace {

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

int64_t IntAt(const StateDict& sd, const std::string& key) {
  return std::get<Scalar>(sd.At(key)).AsInt();
}

}  // namespace

uint64_t Mix(uint64_t seed, uint64_t a, uint64_t b) {
  return SplitMix(SplitMix(SplitMix(seed) ^ a) ^ (b * 0xd6e8feb86659fd93ull));
}

uint64_t Generator::NextU64() { return Mix(seed_, offset_++); }

double Generator::DoubleAt(uint64_t seed, uint64_t counter) {
  return static_cast<double>(Mix(seed, counter) >> 11) * 0x1.0p-53;
}

float Generator::UniformAt(uint64_t seed, uint64_t counter, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(DoubleAt(seed, counter));
}

float Generator::NormalAt(uint64_t seed, uint64_t counter) {
  const double u1 = 1.0 - DoubleAt(seed, counter), u2 = DoubleAt(seed, counter + 1);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

double Generator::NextDouble() { return DoubleAt(seed_, offset_++); }

float Generator::Uniform(float lo, float hi) { return UniformAt(seed_, offset_++, lo, hi); }

float Generator::Normal() {
  const float v = NormalAt(seed_, offset_);
  offset_ += 2;
  return v;
}

void Generator::CollectState(const std::string& prefix, StateDict& sd) {
  Bytes b;
  b.data.resize(16);
  std::memcpy(b.data.data(), &seed_, 8);
  std::memcpy(b.data.data() + 8, &offset_, 8);
  sd.Add(prefix + ".state", std::move(b));
}

void Generator::RestoreState(const std::string& prefix, const StateDict& sd) {
  const auto& b = std::get<Bytes>(sd.At(prefix + ".state"));
  if (b.data.size() != 16)
    throw Error(ErrorCode::kMismatch, "'" + prefix + ".state': generator state of " +
                                          std::to_string(b.data.size()) + " bytes, expected 16");
  std::memcpy(&seed_, b.data.data(), 8);
  std::memcpy(&offset_, b.data.data() + 8, 8);
}

DataLoader::DataLoader(const Dataset& data, int64_t global_batch, uint64_t seed)
    : data_(&data), global_batch_(global_batch), seed_(seed) {
  if (global_batch <= 0 || global_batch > data.size())
    throw Error(ErrorCode::kInvalidArgument, "DataLoader: global batch " +
                                                 std::to_string(global_batch) +
                                                 " must be in [1, data set size " +
                                                 std::to_string(data.size()) + "]");
}

void DataLoader::SetDataParallel(int rank, int size) {
  if (global_batch_ % size != 0)
    throw Error(ErrorCode::kInvalidArgument, "DataLoader: global batch " +
                                                 std::to_string(global_batch_) +
                                                 " is not divisible by the data-parallel size " +
                                                 std::to_string(size));
  dp_rank_ = rank;
  dp_size_ = size;
}

void DataLoader::Shuffle() {
  // Fisher-Yates driven by (seed, epoch): the order depends on nothing else.
  const int64_t n = data_->size();
  order_.resize(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) order_[static_cast<std::size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(Mix(seed_, static_cast<uint64_t>(epoch_) + 1,
                                            static_cast<uint64_t>(i)) %
                                        static_cast<uint64_t>(i + 1));
    std::swap(order_[static_cast<std::size_t>(i)], order_[static_cast<std::size_t>(j)]);
  }
  order_epoch_ = epoch_;
}

Batch DataLoader::Next() {
  if (index_ + global_batch_ > data_->size()) {  // drop the last partial batch
    ++epoch_;
    index_ = 0;
  }
  if (order_epoch_ != epoch_) Shuffle();
  const int64_t local = global_batch_ / dp_size_;
  Batch b;
  b.inputs = Mat(local, data_->sample_size());
  b.labels.resize(static_cast<std::size_t>(local));
  for (int64_t i = 0; i < local; ++i) {
    const int64_t sample = order_[static_cast<std::size_t>(index_ + dp_rank_ * local + i)];
    data_->Get(sample, b.inputs.data() + i * data_->sample_size(), &b.labels[static_cast<std::size_t>(i)]);
  }
  index_ += global_batch_;
  return b;
}

void DataLoader::CollectState(const std::string& prefix, StateDict& sd) {
  sd.Add(prefix + ".epoch", Scalar::Int(epoch_));
  sd.Add(prefix + ".index", Scalar::Int(index_));
  sd.Add(prefix + ".seed", Scalar::Int(static_cast<int64_t>(seed_)));
  sd.Add(prefix + ".global_batch", Scalar::Int(global_batch_));
}

void DataLoader::RestoreState(const std::string& prefix, const StateDict& sd) {
  if (IntAt(sd, prefix + ".global_batch") != global_batch_)
    throw Error(ErrorCode::kMismatch,
                "'" + prefix + ".global_batch': checkpoint has " +
                    std::to_string(IntAt(sd, prefix + ".global_batch")) + ", the loader uses " +
                    std::to_string(global_batch_) + " (the data position would not resume)");
  epoch_ = IntAt(sd, prefix + ".epoch");
  index_ = IntAt(sd, prefix + ".index");
  seed_ = static_cast<uint64_t>(IntAt(sd, prefix + ".seed"));
  order_epoch_ = -1;
}

}  // namespace ckpt::runtime
