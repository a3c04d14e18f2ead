// layout/save_plan.h: the plan of a collective save (FORMAT.md §2), as pure functions of
// what the ranks say they hold: no Comm, no files, so it is tested and measured with
// thousands of simulated ranks (tests/unit/save_plan_test.cc, bench/core/bench_plan.cc).
//
//   Describe(state)         each rank: its claims, checked on their own
//   PlanSave(descriptions)  rank 0: merged and checked (kinds, dtypes, shapes, tiling)
//   ReplicaRequests(plan)   rank 0: which chunks each rank hashes; CheckReplicas compares them
//   AssignWriters(plan)     rank 0: one writer per region, replicas spread to balance bytes
//   WritesByRank(plan)      what each rank writes; Assemble turns what they wrote into entries
// save_messages.h carries these between ranks; checkpoint/save.cc runs the protocol.
//
// Threading: plain values and functions; no shared state.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ckpt/metadata.h"
#include "ckpt/tensor.h"

namespace ckpt::layout {

// One entry of one rank's state as that rank describes it.
struct EntryClaim {
  std::string key;
  EntryKind kind = EntryKind::kTensor;
  DType dtype = DType::kUInt8;  // tensor, scalar
  Shape shape;                  // tensor: the global shape
  std::vector<Box> boxes;       // tensor: this rank's chunks, in its order
  std::string value;            // scalar, json: the value as JSON text
  uint64_t size = 0;            // bytes: the blob's length
};
using RankDescription = std::vector<EntryClaim>;

// This rank's claims, in the state's order. Throws kInvalidArgument naming the key for
// what is wrong on this rank alone: more than 32 dimensions, a negative or overflowing
// shape, a chunk outside its tensor or without data, two of its chunks overlapping, a
// non-finite floating scalar, invalid JSON text.
RankDescription Describe(const StateDict& state);

// A rank's chunk: entry `entry` of its description (and of its state), chunk `chunk` of
// that entry (0 for bytes).
struct ChunkRef {
  uint32_t entry = 0;
  uint32_t chunk = 0;
  friend bool operator==(const ChunkRef&, const ChunkRef&) = default;
};

struct Holder {
  int rank = 0;
  ChunkRef ref;
};

// A region of one key held by one or more ranks (replicas of one box).
struct SaveRegion {
  Box box;  // bytes: [0, size)
  uint64_t bytes = 0;
  int writer = -1;  // set by AssignWriters
  uint32_t first_holder = 0, holder_count = 0;  // in SaveKey::holders
};

struct SaveKey {
  std::string key;
  EntryKind kind = EntryKind::kTensor;
  DType dtype = DType::kUInt8;
  Shape shape;
  std::string value;
  uint64_t size = 0;
  std::vector<SaveRegion> regions;  // tensor: by offsets (first claim first on ties); bytes: one
  std::vector<Holder> holders;      // grouped by region, each group in rank order

  std::span<const Holder> HoldersOf(const SaveRegion& r) const {
    return std::span<const Holder>(holders).subspan(r.first_holder, r.holder_count);
  }
};

struct SavePlan {
  int world = 0;
  std::vector<SaveKey> keys;  // rank 0's keys in its order, then keys only later ranks hold
};

// Merges the descriptions of ranks 0..n-1, checking that the ranks agree on each key's
// kind, dtype, shape, blob size and value, and that each tensor's distinct boxes tile it.
// Throws kInvalidArgument "save: the state cannot be saved as given:" listing (up to 50 of)
// the problems. Incremental, so rank 0 holds one decoded description at a time.
class SavePlanner {
 public:
  explicit SavePlanner(int world);
  ~SavePlanner();
  SavePlanner(const SavePlanner&) = delete;
  SavePlanner& operator=(const SavePlanner&) = delete;

  // REQUIRES: called once per rank, in rank order.
  void Add(RankDescription description);
  // REQUIRES: Add called `world` times. The planner is spent afterwards.
  SavePlan Finish();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

SavePlan PlanSave(std::vector<RankDescription> descriptions);

// Per rank, the chunks whose digests CheckReplicas needs: every holder of every region
// held by two or more ranks, in plan order. All empty if there are no replicas.
std::vector<std::vector<ChunkRef>> ReplicaRequests(const SavePlan& plan);
// `digests[r][i]` is rank r's digest of requests[r][i]. Throws kMismatch naming the key,
// region and groups of ranks for each region whose copies differ, and kComm if a rank
// answered with the wrong number of digests.
void CheckReplicas(const SavePlan& plan, const std::vector<std::vector<std::string>>& digests);

// Sole holders write their regions; each replicated region goes to its holder with the
// fewest bytes so far, largest regions first (ties: the lowest rank, the first region).
void AssignWriters(SavePlan& plan);

// What one rank writes: its chunk `ref`, which is region `region` of key `key`.
struct Write {
  ChunkRef ref;
  uint32_t key = 0, region = 0;
};
// REQUIRES: AssignWriters. Per rank, its writes in plan order.
std::vector<std::vector<Write>> WritesByRank(const SavePlan& plan);

// What one rank wrote: its shard file (if it wrote anything) and one ChunkMeta per
// planned write, in the order of its writes.
struct RankResult {
  std::string file;
  uint64_t bytes = 0;
  std::string index;  // the digest of the shard's index (FORMAT.md §3.1 files[].index)
  std::vector<ChunkMeta> chunks;
};
// Fills m.files and m.entries (in plan order, each tensor's chunks in region order).
// Throws kComm if a rank reports a different number of chunks than it was asked to write.
void Assemble(const SavePlan& plan, const std::vector<std::vector<Write>>& writes, std::vector<RankResult> results,
              Metadata& m);

}  // namespace ckpt::layout
