// layout/save_plan.h: the plan of a collective save (FORMAT.md §2), as pure functions of
// what the ranks say they hold: no Comm, no files, so it is tested and measured with
// thousands of simulated ranks (tests/unit/save_plan_test.cc, bench/core/bench_plan.cc).
//
//   Describe(state)         each rank: its claims, checked on their own
//   MakeKeyTable, FastEntries, SlowClaims   the fast path: what rank 0 need not be told
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

  // REQUIRES: called once per rank, in rank order. `entries`: the position of each claim
  // in that rank's state (strictly increasing), for a description that leaves out the
  // entries of the fast path (below); empty: the claims are the whole state, in order.
  void Add(RankDescription description, std::vector<uint32_t> entries = {});
  // The fast path's keys (each k where fast[k]: FastEntries' minimum), which no rank but 0
  // describes: rank r holds part r of rank 0's step rule for key k (rank 0's entry k) as
  // its entry k, or none of it if there are r parts or fewer; a description naming such a
  // key later is kComm. REQUIRES: right after rank 0's Add; each such tensor regular.
  void AddFastParts(std::span<const uint8_t> fast);
  // REQUIRES: Add called `world` times. The planner is spent afterwards.
  SavePlan Finish();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

SavePlan PlanSave(std::vector<RankDescription> descriptions, bool compact = true);

// The fast path of a save's step 1 (checkpoint/save.cc), which keeps what rank 0 receives
// O(keys + ranks + irregular entries): rank 0 broadcasts the table of its own entries; each
// rank says, per table entry, whether its own entry is one the plan already knows from the
// table; a minimum over the ranks (an AllReduce of one byte per key) leaves the keys where
// every rank's is, and no rank describes those. A tensor entry k is on the fast path when
// rank 0's entry k is part 0 of a dim-0 step rule (one box at offset 0, whole in the other
// dims: `step` is its rows, in at most `world` parts so that every part is some rank's) and
// rank r's entry k has the same key, dtype and shape and is part r of that rule (one box,
// rows [r * step, min((r + 1) * step, shape[0])), whole in the others), or no chunk at all
// where r >= ceil(shape[0] / step): exactly what SavePlanner keeps as one run. A scalar or
// json entry is on it when it has rank 0's dtype and value. Bytes entries (replicas, each
// holder named) and keys rank 0 does not hold are always described.
struct TableEntry {
  std::string key;
  EntryKind kind = EntryKind::kTensor;
  DType dtype = DType::kUInt8;  // tensor, scalar
  Shape shape;                  // tensor
  int64_t step = 0;             // tensor: rank 0's rows, 0 if its entry is not part 0 of a rule
  std::string value;            // scalar, json
};
using KeyTable = std::vector<TableEntry>;

// A step is kept where ceil(shape[0] / step) <= world (every part a rank's).
KeyTable MakeKeyTable(const RankDescription& rank0, int world);
// Per table entry: 1 if rank `rank`'s entry is on the fast path, else 0 (also where it
// holds no such key).
std::vector<uint8_t> FastEntries(const KeyTable& table, const RankDescription& mine, int rank);
// The claims of `mine` not on the fast path (`fast`: FastEntries' minimum over the ranks),
// each with its position in `mine` (`entries`), for SavePlanner::Add.
RankDescription SlowClaims(const KeyTable& table, std::span<const uint8_t> fast, RankDescription mine,
                           std::vector<uint32_t>& entries);

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
// REQUIRES: AssignWriters. Per rank, its writes in plan order; without those of the plan
// keys k < omit.size() where omit[k] (the fast path's, which each rank knows: FastWrites).
std::vector<std::vector<Write>> WritesByRank(const SavePlan& plan, std::span<const uint8_t> omit = {});
// Per rank, how many chunks it writes (WritesByRank's sizes, without holding them).
std::vector<uint64_t> WriteCounts(const SavePlan& plan);
// Rank `rank`'s writes of the fast path's keys, in plan order: part `rank` of each fast
// tensor it holds a part of, as its entry k (= plan key k).
std::vector<Write> FastWrites(const KeyTable& table, std::span<const uint8_t> fast, int rank);

// What one rank wrote: its shard file (if it wrote anything) and how many chunks. The
// chunks' records are in the shard's index, which `index` proves; rank 0 never sees them
// one by one (its memory stays O(keys + ranks + plan), however many chunks there are).
struct RankResult {
  std::string file;
  uint64_t bytes = 0;
  std::string index;  // the digest of the shard's index (FORMAT.md §3.1 files[].index)
  uint64_t chunks = 0;
  uint64_t index_offset = 0, index_bytes = 0;  // where that index lies (files[].index_offset; 0 bytes: unknown)
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
// The same, from each rank's count of writes (WriteCounts) rather than the writes.
void Assemble(const SavePlan& plan, std::span<const uint64_t> write_counts, const std::vector<RankResult>& results,
              const std::vector<KeyTotals>& totals, const Compression& compression, Metadata& m);

}  // namespace ckpt::layout
