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
  int writer = -1;  // set by AssignWriters (a regular key's: its holder, always)
  uint32_t first_holder = 0, holder_count = 0;  // in SaveKey::holders (explicit keys only)
};

// Regular keys (the FSDP rule, kept compact: memory per run, not per chunk): part p of a
// tensor is rows [p * step, min((p + 1) * step, shape[0])) of dim 0, whole in the others, and
// is held by exactly one rank. A run says ranks first_rank .. first_rank + count - 1 hold
// parts first_part .. first_part + count - 1, each as chunk 0 of its entry `entry`.
struct RegularRun {
  int first_rank = 0;
  uint32_t first_part = 0, count = 0;
  uint32_t entry = 0;
};

struct SaveKey {
  std::string key;
  EntryKind kind = EntryKind::kTensor;
  DType dtype = DType::kUInt8;
  Shape shape;
  std::string value;
  uint64_t size = 0;
  // Explicit form: tensor regions by offsets (first claim first on ties), bytes: one; each
  // region's holders grouped, each group in rank order.
  std::vector<SaveRegion> regions;
  std::vector<Holder> holders;
  // Regular form (a tensor, when step > 0; regions and holders are then empty): the runs
  // in part order, covering parts [0, ceil(shape[0] / step)) once each.
  int64_t step = 0;
  uint64_t row_bytes = 0;  // bytes of one index of dim 0 (set by Finish)
  std::vector<RegularRun> runs;

  std::span<const Holder> HoldersOf(const SaveRegion& r) const {
    return std::span<const Holder>(holders).subspan(r.first_holder, r.holder_count);
  }
  bool regular() const { return step > 0; }
  // Either form, region g < RegionCount(): its box, bytes and writer (first_holder and
  // holder_count as in `regions`, or 0 and 1), and its holders. O(log runs).
  std::size_t RegionCount() const;
  SaveRegion Region(std::size_t g) const;
  std::vector<Holder> RegionHolders(std::size_t g) const;
  // A regular key: bytes of part p.
  uint64_t PartBytes(uint64_t part) const;
};

struct SavePlan {
  int world = 0;
  std::vector<SaveKey> keys;  // rank 0's keys in its order, then keys only later ranks hold
};

// Merges the descriptions of ranks 0..n-1, checking that the ranks agree on each key's
// kind, dtype, shape, blob size and value, and that each tensor's distinct boxes tile it.
// Throws kInvalidArgument "save: the state cannot be saved as given:" listing (up to 50 of)
// the problems. Incremental, so rank 0 holds one decoded description at a time.
// Memory: O(keys + ranks + chunks of irregular keys). A tensor whose every claim is one
// part of a dim-0 step rule, each part held by one rank, is kept as runs (SaveKey::step);
// the first claim that breaks the rule (another box, a second chunk, an empty box) turns
// the key explicit, claims so far included, and so does Finish for runs that do not cover
// every part exactly once (a replica, a gap). Either way the plan is the same, region for
// region, as with `compact = false`, which keeps every key explicit (for tests).
class SavePlanner {
 public:
  explicit SavePlanner(int world, bool compact = true);
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

SavePlan PlanSave(std::vector<RankDescription> descriptions, bool compact = true);

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

// What one rank wrote: its shard file (if it wrote anything) and how many chunks. The
// chunks' records are in the shard's index, which `index` proves; rank 0 never sees them
// one by one (its memory stays O(keys + ranks + plan), however many chunks there are).
struct RankResult {
  std::string file;
  uint64_t bytes = 0;
  std::string index;  // the digest of the shard's index (FORMAT.md §3.1 files[].index)
  uint64_t chunks = 0;
};

// Per key, what metadata.json aggregates over its chunks (FORMAT.md §3.3): totals that
// every rank adds its own chunks to and that are then reduced across ranks.
struct KeyTotals {
  uint64_t stored_bytes = 0;
  bool compressed = false;  // some chunk is stored compressed
  StatsAccumulator stats;
  void Add(const ChunkMeta& chunk);
};

// Fills m.files (the ranks that wrote, in rank order) and m.entries (in plan order) in the
// unresolved version 2 form: each tensor's layout from its regions and their writers'
// files, its stats, stored bytes and compression (`compression`, where some chunk is
// compressed) from `totals` (one per plan key, reduced over every rank).
// Throws kComm if a rank reports a different number of chunks than it was asked to write.
void Assemble(const SavePlan& plan, const std::vector<std::vector<Write>>& writes,
              const std::vector<RankResult>& results, const std::vector<KeyTotals>& totals,
              const Compression& compression, Metadata& m);

}  // namespace ckpt::layout
