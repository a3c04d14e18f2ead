// ckpt/runtime/data.h: random numbers, the data set interface, and a data loader whose
// position (epoch, index, shuffle seed) resumes exactly.
//
// Threading: one object per rank (thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/runtime/module.h"
#include "ckpt/runtime/stateful.h"

namespace ckpt::runtime {

// A counter-based generator (SplitMix64 over seed and offset): its whole state is two
// integers, saved as the bytes entry `<prefix>.state`. Ranks that construct it with the
// same seed and draw the same numbers hold identical state, so the entry is a replica.
class Generator final : public Stateful {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t NextU64();
  double NextDouble();                 // [0, 1)
  float Uniform(float lo, float hi);
  float Normal();                      // standard normal (Box-Muller)
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void Skip(uint64_t draws) { offset_ += draws; }
  // The draws above as pure functions of (seed, counter): what NextDouble, Uniform and
  // Normal return when the offset is `counter`.
  static double DoubleAt(uint64_t seed, uint64_t counter);
  static float UniformAt(uint64_t seed, uint64_t counter, float lo, float hi);
  static float NormalAt(uint64_t seed, uint64_t counter);  // uses counter and counter + 1

  std::string Kind() const override { return "rng"; }
  void CollectState(const std::string& prefix, StateDict& sd) override;
  void RestoreState(const std::string& prefix, const StateDict& sd) override;

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// Stateless hash of (seed, a, b): deterministic per sample, independent of world size.
uint64_t Mix(uint64_t seed, uint64_t a, uint64_t b = 0);

// A data set of classification samples: sample i is sample_size() floats and a label.
// Get must be a pure function of the index (the loader resumes by position).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t sample_size() const = 0;
  virtual void Get(int64_t index, float* inputs, int32_t* label) const = 0;
};

struct Batch {
  Mat inputs;                   // [batch, sample_size]
  std::vector<int32_t> labels;  // [batch]
};

// Draws global batches of `global_batch` samples from a shuffled epoch order; under data
// parallelism each data-parallel rank takes its consecutive share of every global batch,
// so the global batch is the same whatever the world size. The last partial batch of an
// epoch is dropped. State: epoch, index (next sample of the epoch order), seed.
class DataLoader final : public Stateful {
 public:
  // REQUIRES: `data` outlives the loader.
  DataLoader(const Dataset& data, int64_t global_batch, uint64_t seed);
  // This rank's share of the next global batch. REQUIRES: global_batch divisible by
  // the data-parallel size.
  Batch Next();

  // Set by Accelerator::Prepare.
  void SetDataParallel(int rank, int size);
  int64_t epoch() const { return epoch_; }
  int64_t index() const { return index_; }
  int64_t global_batch() const { return global_batch_; }

  std::string Kind() const override { return "dataloader"; }
  void CollectState(const std::string& prefix, StateDict& sd) override;
  void RestoreState(const std::string& prefix, const StateDict& sd) override;

 private:
  void Shuffle();
  const Dataset* data_;
  int64_t global_batch_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
  int dp_rank_ = 0, dp_size_ = 1;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
};

}  // namespace ckpt::runtime
