// checkpoint/save.cc: the collective save (FORMAT.md §2).
//
// Protocol, every step ending in an agreement so that no rank is left waiting. The plan is
// pure (layout/save_plan.h), the messages binary (layout/save_messages.h):
//  1. describe: every rank sends rank 0 what it holds (keys, dtypes, shapes, boxes), but
//     for what rank 0's key table already says (the fast path: DescribeAndPlan);
//  2. plan: rank 0 merges and checks the claims (same dtype/shape everywhere, boxes either
//     identical replicas or disjoint, together tiling each tensor); if replicas exist it
//     asks their holders for digests of their copies and compares them;
//  3. rank 0 checks the target, picks one writer per region (replicas spread to balance
//     bytes), creates the staging directory and broadcasts the plan;
//  4. write: each writer streams its chunks into its shard, fsyncs it, and reports them;
//  5. totals: each key's statistics summed over the ranks (O(keys) per reduction);
//  6. commit: rank 0 writes metadata.json and renames the directory into place.
// Each rank times its phases; rank 0 gathers them into metadata.json (FORMAT.md §3.8).
#include "checkpoint/save.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "checkpoint/commit.h"
#include "checkpoint/device_io.h"
#include "checkpoint/object_save.h"
#include "ckpt/checkpoint.h"
#include "layout/save_messages.h"
#include "layout/save_plan.h"
#include "storage/digest.h"
#include "storage/fs.h"
#include "storage/shard_writer.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// The entry a message refers to by `ref`: a tensor and one of its chunks, or a bytes entry
// (chunk 0). Throws kComm for a reference outside this rank's state (a malformed plan).
const Entry& Referenced(const StateDict& state, const layout::ChunkRef& ref) {
  const auto bad = [&](const std::string& why) {
    return Error(ErrorCode::kComm, "save: the plan names chunk " + std::to_string(ref.chunk) + " of entry " +
                                       std::to_string(ref.entry) + " of this rank's state, " + why);
  };
  if (ref.entry >= state.size()) throw bad("which has " + std::to_string(state.size()) + " entries");
  const Entry& e = std::next(state.begin(), ref.entry)->second;
  if (const auto* t = std::get_if<Tensor>(&e)) {
    if (ref.chunk >= t->chunks.size()) throw bad("a tensor of " + std::to_string(t->chunks.size()) + " chunks");
  } else if (!std::holds_alternative<Bytes>(e) || ref.chunk != 0) {
    throw bad("which holds no such chunk");
  }
  return e;
}

// Where the bytes of bytes entries are (SaveContext::staged_bytes): empty, in their entries.
using StagedBytes = std::span<const std::span<const uint8_t>>;

// The bytes of bytes entry `b`, number `index` of the state.
std::span<const uint8_t> BytesOf(const Bytes& b, std::size_t index, StagedBytes staged) {
  return staged.empty() ? std::span<const uint8_t>(b.data) : staged[index];
}

// The box chunk `c` of `t` is stored as: its own, but for a tensor of zero volume, which is
// one chunk, the whole tensor (FORMAT.md §3.3; layout::Describe claims it so).
Box StoredBox(const Tensor& t, const Chunk& c) { return NumElements(t.shape) == 0 ? Box::Full(t.shape) : c.box; }

struct LocalBytes {
  const void* data;
  std::size_t n;
  int device;
};
LocalBytes LocalData(const StateDict& state, const layout::ChunkRef& ref, StagedBytes staged) {
  const Entry& e = Referenced(state, ref);
  if (const auto* t = std::get_if<Tensor>(&e)) {
    const Chunk& c = t->chunks[ref.chunk];
    return {c.data, static_cast<std::size_t>(c.box.NumElements()) * DTypeSize(t->dtype), c.device};
  }
  const std::span<const uint8_t> b = BytesOf(std::get<Bytes>(e), ref.entry, staged);
  return {b.data(), b.size(), kHostDevice};
}

// What step 1's fast path decided, on every rank: rank 0's key table and, per table
// entry, whether every rank's entry is on the fast path (both empty without it).
struct FastPath {
  layout::KeyTable table;
  std::vector<uint8_t> keys;
};

// Steps 1 and 2: rank 0 returns the merged and checked plan, the others an empty one.
// `device` gets the backend for this rank's device chunks (null if it has none). With
// `fast_plan`, rank 0 first broadcasts its key table, one AllReduce finds the entries every
// rank holds as the table says, and only the rest is described (layout/save_plan.h).
layout::SavePlan DescribeAndPlan(const StateDict& state, StagedBytes staged, Comm& comm, bool fast_plan,
                                 std::shared_ptr<DeviceBackend>& device, FastPath& fast) {
  const bool root = comm.rank() == 0;
  layout::RankDescription mine;
  layout::Message message;  // rank 0 keeps its own description as it is
  internal::Phase(comm, [&] {
    device = internal::DeviceBackendFor(state, "save");
    mine = layout::Describe(state);
    for (std::size_t i = 0; i < staged.size(); ++i) {
      if (mine[i].kind == EntryKind::kBytes) mine[i].size = staged[i].size();
    }
    if (root && fast_plan) {
      fast.table = layout::MakeKeyTable(mine, comm.size());
      message = layout::EncodeKeyTable(fast.table);
    }
    if (!root && !fast_plan) message = layout::EncodeDescription(mine);
  });
  if (fast_plan) {
    comm.Broadcast(message, 0);
    internal::Phase(comm, [&] {
      if (!root) fast.table = layout::DecodeKeyTable(message, comm.size());
      fast.keys = layout::FastEntries(fast.table, mine, comm.rank());
    });
    // A key is on the fast path where it is on every rank.
    if (!fast.keys.empty()) comm.AllReduce(fast.keys.data(), fast.keys.size(), DType::kUInt8, ReduceOp::kMin);
    message.clear();
    internal::Phase(comm, [&] {
      if (root) return;
      std::vector<uint32_t> entries;
      const layout::RankDescription slow = layout::SlowClaims(fast.table, fast.keys, std::move(mine), entries);
      message = layout::EncodeDescription(slow, entries);
    });
  }
  std::vector<ByteBuffer> all = comm.Gather(message, 0);
  layout::SavePlan plan;
  internal::Phase(comm, [&] {
    if (!root) return;
    layout::SavePlanner planner(comm.size());
    planner.Add(std::move(mine));
    if (fast_plan) planner.AddFastParts(fast.keys);
    for (int r = 1; r < comm.size(); ++r) {
      std::vector<uint32_t> entries;
      layout::RankDescription d = layout::DecodeDescription(all[r], r, entries);
      ByteBuffer().swap(all[r]);
      planner.Add(std::move(d), std::move(entries));
    }
    plan = planner.Finish();
  }, /*name_ranks=*/false);
  return plan;
}

// Step 2, replicas: the holders of each replicated region send digests of their copies.
void CompareReplicas(const StateDict& state, StagedBytes staged, Comm& comm, const layout::SavePlan& plan,
                     bool check, DeviceBackend* device) {
  const bool root = comm.rank() == 0;
  ByteBuffer requests;
  if (root) {
    requests = layout::EncodeRequests(check ? layout::ReplicaRequests(plan)
                                            : std::vector<std::vector<layout::ChunkRef>>(comm.size()));
  }
  comm.Broadcast(requests, 0);
  bool any = false;
  layout::Message digests;
  internal::Phase(comm, [&] {
    std::vector<std::string> mine;
    std::unique_ptr<DeviceStaging> staging;
    for (const layout::ChunkRef& ref : layout::DecodeRequests(requests, comm.rank(), comm.size(), any)) {
      const LocalBytes b = LocalData(state, ref, staged);
      if (b.device == kHostDevice || b.n == 0) {
        mine.push_back(storage::ChecksumOf(b.data, b.n));
        continue;
      }
      if (!staging) staging = device->AcquireStaging();
      mine.push_back(internal::DeviceChecksum(*staging, b.data, b.n, b.device));
    }
    digests = layout::EncodeDigests(mine);
  });
  if (!any) return;
  std::vector<ByteBuffer> all = comm.Gather(digests, 0);
  internal::Phase(comm, [&] {
    if (!root) return;
    std::vector<std::vector<std::string>> by_rank;
    for (int r = 0; r < comm.size(); ++r) by_rank.push_back(layout::DecodeDigests(all[r], r));
    layout::CheckReplicas(plan, by_rank);
  }, /*name_ranks=*/false);
}

// Step 3 on rank 0: the target checked, writers picked (each rank's count of writes into
// `write_counts`), the staging directory made (into `staging`). Every rank returns the
// broadcast plan, which lists no write of a fast-path key: each rank knows its own.
// On an s3:// target, rank 0 begins the object save (`object`) instead, and the plan carries
// its nonce where it carries the staging directory's path.
ByteBuffer Distribute(const fs::path& dir, Comm& comm, const SaveOptions& options, layout::SavePlan& plan,
                      const FastPath& fast, std::vector<uint64_t>& write_counts, fs::path& staging,
                      std::unique_ptr<internal::ObjectSave>& object) {
  ByteBuffer message;
  internal::Phase(comm, [&] {
    if (comm.rank() != 0) return;
    layout::AssignWriters(plan);
    write_counts = layout::WriteCounts(plan);
    if (internal::IsObjectUrl(dir)) {
      object = internal::ObjectSave::Begin(dir.string(), options.s3, options.overwrite);
      staging = object->nonce();
    } else {
      staging = internal::MakeStagingDir(dir, options.overwrite);
    }
    message = layout::EncodePlan(staging.string(), static_cast<uint32_t>(plan.keys.size()),
                                 layout::WritesByRank(plan, fast.keys));
  }, /*name_ranks=*/false);
  comm.Broadcast(message, 0);
  return message;
}

// Step 4: this rank's chunks streamed into its shard, which is fsynced. Device chunks come
// through one staging pipeline in write order, each copied while the one before is written.
// `check` runs before each chunk; the shard's fsync time goes to `fsync_seconds`. A
// `transient` shard (an s3:// save's local staging copy, uploaded then removed) is not
// fsynced and starts no writeback: 1.49 GB of gpt2s went to the disk for nothing; its
// upload hears of each range of final bytes (`on_final`: ShardWriter::OnFinalBytes) and sends
// the parts they fill while the rest is written.
layout::RankResult WriteShard(const fs::path& staging, const std::string& file, const layout::PlanMessage& plan,
                              const StateDict& state, StagedBytes staged, const Compression& compression,
                              uint64_t pack_bytes, DeviceBackend* device, const std::function<void()>& check,
                              std::vector<layout::KeyTotals>& totals, double& fsync_seconds, bool transient,
                              const storage::ShardWriter::FinalBytes& on_final) {
  const std::vector<layout::ChunkRef>& writes = plan.writes;
  layout::RankResult result;
  totals.assign(plan.key_count, {});
  if (writes.empty()) return result;
  result.file = file;
  storage::ShardWriter writer(staging, result.file, compression, storage::kDefaultBlockBytes, pack_bytes);
  if (transient) writer.SetTransient();
  if (on_final) writer.OnFinalBytes(on_final);
  auto written = [&](std::size_t i, const ChunkMeta& chunk) {
    totals[plan.keys[i]].Add(chunk);
    ++result.chunks;
  };
  std::vector<internal::DeviceReader::Source> sources;
  for (const layout::ChunkRef& ref : writes) {
    const LocalBytes b = LocalData(state, ref, staged);
    if (b.device != kHostDevice && b.n > 0) sources.push_back({b.data, b.n, b.device});
  }
  std::unique_ptr<DeviceStaging> device_staging;
  std::unique_ptr<internal::DeviceReader> pieces;
  if (!sources.empty()) {
    device_staging = device->AcquireStaging();
    pieces = std::make_unique<internal::DeviceReader>(*device_staging, std::move(sources));
  }
  // Host chunks are announced first, so that their datasets are made in batches
  // (storage/shard_writer.h). A shard with device chunks, written from staging buffers as
  // they arrive, is written chunk by chunk.
  if (!pieces) {
    for (const layout::ChunkRef& ref : writes) {
      if (const auto* t = std::get_if<Tensor>(&Referenced(state, ref))) {
        const Chunk& c = t->chunks[ref.chunk];
        writer.Reserve(std::next(state.begin(), ref.entry)->first, t->dtype, t->shape, StoredBox(*t, c), c.data);
      }
    }
  }
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const layout::ChunkRef& ref = writes[i];
    if (check) check();
    const Entry& e = Referenced(state, ref);
    const std::string& key = std::next(state.begin(), ref.entry)->first;
    if (const auto* t = std::get_if<Tensor>(&e)) {
      const Chunk& c = t->chunks[ref.chunk];
      if (c.device != kHostDevice && c.box.NumElements() > 0) {
        written(i, internal::WriteDeviceChunk(writer, *pieces, key, *t, c));
        continue;
      }
      written(i, writer.WriteChunk(key, t->dtype, t->shape, StoredBox(*t, c), c.data));
    } else {
      const std::span<const uint8_t> b = BytesOf(std::get<Bytes>(e), ref.entry, staged);
      written(i, writer.WriteBytes(key, b.data(), b.size()));
    }
  }
  const storage::ShardWriter::Written shard = writer.Finish();
  fsync_seconds = shard.fsync_seconds;
  result.bytes = shard.bytes;
  result.index = shard.index;
  result.index_offset = shard.index_offset;
  result.index_bytes = shard.index_bytes;
  return result;
}

// Step 5, on every rank: each key's totals summed over the ranks (counts and sums added,
// min and max taken), so that rank 0 never holds a record per chunk. Three reductions of
// O(keys) each, whatever the number of chunks.
void ReduceTotals(Comm& comm, std::vector<layout::KeyTotals>& totals) {
  const std::size_t n = totals.size();
  constexpr std::size_t kInts = 7, kDoubles = 2;
  std::vector<int64_t> ints(n * kInts);
  std::vector<double> sums(n * kDoubles), mins(n * 2);  // mins: min and -max
  for (std::size_t k = 0; k < n; ++k) {
    const StatsAccumulator::Sums s = totals[k].stats.sums();
    const int64_t in[kInts] = {static_cast<int64_t>(totals[k].stored_bytes), totals[k].compressed, s.nan_count,
                               s.inf_count, s.finite_count, s.parts, s.missing};
    std::copy(std::begin(in), std::end(in), ints.begin() + static_cast<std::ptrdiff_t>(k * kInts));
    sums[k * kDoubles] = s.sum;
    sums[k * kDoubles + 1] = s.sumsq;
    mins[k * 2] = s.min;
    mins[k * 2 + 1] = -s.max;
  }
  comm.AllReduce(ints.data(), ints.size(), DType::kInt64, ReduceOp::kSum);
  comm.AllReduce(sums.data(), sums.size(), DType::kFloat64, ReduceOp::kSum);
  comm.AllReduce(mins.data(), mins.size(), DType::kFloat64, ReduceOp::kMin);
  for (std::size_t k = 0; k < n; ++k) {
    const int64_t* in = ints.data() + k * kInts;
    StatsAccumulator::Sums s;
    s.nan_count = in[2];
    s.inf_count = in[3];
    s.finite_count = in[4];
    s.parts = in[5];
    s.missing = in[6];
    s.sum = sums[k * kDoubles];
    s.sumsq = sums[k * kDoubles + 1];
    s.min = mins[k * 2];
    s.max = -mins[k * 2 + 1];
    totals[k].stored_bytes = static_cast<uint64_t>(in[0]);
    totals[k].compressed = in[1] > 0;
    totals[k].stats = StatsAccumulator::FromSums(s);
  }
}

// Step 6 on rank 0: metadata.json from every rank's result, and the rename. `finish` adds
// the timings to the assembled metadata (and may still stop the save) just before.
void Commit(const fs::path& dir, const fs::path& staging, const layout::SavePlan& plan,
            std::span<const uint64_t> write_counts, const std::vector<layout::RankResult>& results,
            const std::vector<layout::KeyTotals>& totals, int world, const SaveOptions& options,
            internal::ObjectSave* object, const std::function<void(Metadata&)>& finish) {
  Metadata m;
  m.state_dict_type = options.state_dict_type;
  m.world_size = world;
  m.mesh = options.mesh;
  m.user = options.user_metadata;
  internal::StampMetadata(m);
  layout::Assemble(plan, write_counts, results, totals, options.compression, m);
  finish(m);
  if (object) {
    object->Commit(m);
  } else {
    internal::CommitStaging(staging, dir, m);
  }
}

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0, Clock::time_point t1 = Clock::now()) {
  return std::chrono::duration<double>(t1 - t0).count();
}

layout::Message EncodeSeconds(const internal::PhaseSeconds& t) {
  layout::Message m(sizeof t);
  std::memcpy(m.data(), t.data(), sizeof t);
  return m;
}

internal::PhaseSeconds DecodeSeconds(const ByteBuffer& m, int rank) {
  internal::PhaseSeconds t{};
  if (m.size() != sizeof t) {
    throw Error(ErrorCode::kComm, "save: rank " + std::to_string(rank) + " sent " + std::to_string(m.size()) +
                                      " bytes of timings, not " + std::to_string(sizeof t));
  }
  std::memcpy(t.data(), m.data(), sizeof t);
  return t;
}

}  // namespace

void Save(const std::filesystem::path& dir, const StateDict& state, Comm& comm, const SaveOptions& options) {
  internal::SaveWithContext(dir, state, comm, options, {});
}

namespace internal {

SaveTimings SummarizeTimings(bool async, const std::vector<PhaseSeconds>& ranks) {
  SaveTimings out;
  out.async = async;
  if (ranks.empty()) return out;
  std::vector<double> v(ranks.size());
  for (std::size_t p = 0; p < std::size(kSavePhaseNames); ++p) {
    PhaseTiming& t = SavePhase(out, p);
    for (std::size_t r = 0; r < ranks.size(); ++r) v[r] = std::max(0.0, ranks[r][p]);
    t.slowest_rank = static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    t.min = v.front();
    t.max = v.back();
    t.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  }
  return out;
}

void SaveWithContext(const std::filesystem::path& dir, const StateDict& state, Comm& comm,
                     const SaveOptions& options, const SaveContext& context) {
  const Clock::time_point start = Clock::now();
  PhaseSeconds seconds{};  // kSavePhaseNames order: snapshot, plan, write, fsync, commit, blocked
  seconds[0] = context.snapshot_seconds;
  const int rank = comm.rank();
  const int world = comm.size();
  const bool root = rank == 0;

  std::shared_ptr<DeviceBackend> device;
  const StagedBytes staged = context.staged_bytes;  // one per entry of `state`, or none
  FastPath fast;
  layout::SavePlan plan = DescribeAndPlan(state, staged, comm, context.fast_plan, device, fast);
  CompareReplicas(state, staged, comm, plan, options.check_replicas, device.get());
  std::vector<uint64_t> write_counts;  // rank 0: every rank's
  fs::path staging;
  std::unique_ptr<internal::ObjectSave> object;  // an s3:// target's (object_save.h)
  const ByteBuffer plan_message = Distribute(dir, comm, options, plan, fast, write_counts, staging, object);
  const Clock::time_point planned = Clock::now();
  seconds[1] = Since(start, planned);

  layout::RankResult written;
  std::vector<layout::KeyTotals> totals;  // per plan key: this rank's chunks, then every rank's
  std::string failure;
  try {
    const std::vector<layout::Write> fast_writes = layout::FastWrites(fast.table, fast.keys, rank);
    const layout::PlanMessage mine = layout::DecodePlan(plan_message, rank, world, fast.keys, fast_writes);
    std::string file = internal::ShardFileName(rank, world);
    storage::ShardWriter::FinalBytes on_final;
    if (internal::IsObjectUrl(dir)) {
      // Each rank stages its shard locally, under the name unique to the save, and uploads
      // it: the parts of final bytes while it is written, the rest once it is complete.
      if (!root) object = internal::ObjectSave::Join(dir.string(), options.s3, mine.staging);
      staging = object->LocalStaging("r" + std::to_string(rank));
      file = object->ObjectName(file);
      on_final = object->StreamUpload(file);
    } else {
      staging = mine.staging;
    }
    written = WriteShard(staging, file, mine, state, staged, options.compression, options.pack_bytes,
                         device.get(), context.check, totals, seconds[3], /*transient=*/object != nullptr, on_final);
    if (object && !written.file.empty()) object->Upload(written.file);
    if (context.check) context.check();
  } catch (...) {
    failure = internal::DescribeCurrentException();
  }
  try {
    internal::AgreeOrThrow(comm, failure);
  } catch (...) {
    if (object) {
      object->DiscardUploads();
    } else if (root) {
      storage::RemoveAllQuietly(staging);
    }
    throw;
  }
  const Clock::time_point wrote = Clock::now();
  seconds[2] = std::max(0.0, Since(planned, wrote) - seconds[3]);
  ReduceTotals(comm, totals);
  // Rank 0 keeps its own result as it is.
  std::vector<ByteBuffer> all = comm.Gather(root ? layout::Message() : layout::EncodeResult(written), 0);
  // The others' timings end here; rank 0's when the metadata is assembled.
  seconds[4] = Since(wrote);
  seconds[5] = context.async ? context.blocked_seconds : Since(start);
  std::vector<ByteBuffer> timings = comm.Gather(root ? layout::Message() : EncodeSeconds(seconds), 0);

  internal::Phase(comm, [&] {
    if (!root) return;
    try {
      std::vector<layout::RankResult> results;
      results.reserve(static_cast<std::size_t>(world));
      results.push_back(std::move(written));
      for (int r = 1; r < world; ++r) results.push_back(layout::DecodeResult(all[r], r));
      std::vector<PhaseSeconds> per_rank(static_cast<std::size_t>(world));
      for (int r = 1; r < world; ++r) per_rank[r] = DecodeSeconds(timings[r], r);
      Commit(dir, staging, plan, write_counts, results, totals, world, options, object.get(), [&](Metadata& m) {
        const Clock::time_point now = Clock::now();
        seconds[4] = Since(wrote, now);
        if (!context.async) seconds[5] = Since(start, now);
        per_rank[0] = seconds;
        m.save_timings = SummarizeTimings(context.async, per_rank);
        if (context.check) context.check();
      });
    } catch (...) {
      if (!object) storage::RemoveAllQuietly(staging);
      throw;
    }
  }, /*name_ranks=*/false);
}

}  // namespace internal
}  // namespace ckpt
