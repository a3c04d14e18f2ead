// checkpoint/save.cc: the collective save (FORMAT.md §2).
//
// Protocol, every step ending in an agreement so that no rank is left waiting:
//  1. every rank describes what it holds (keys, dtypes, shapes, boxes) to rank 0;
//  2. rank 0 checks the claims (same dtype/shape everywhere, boxes either identical
//     replicas or disjoint, together tiling each tensor) and, if replicas exist, asks
//     their holders for hashes and compares them;
//  3. rank 0 picks one writer per region (replicas spread to balance bytes), creates the
//     staging directory and broadcasts the plan;
//  4. each writer streams its chunks into its shard and fsyncs it;
//  5. rank 0 writes metadata.json and renames the directory into place.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/commit.h"
#include "ckpt/checkpoint.h"
#include "format/metadata_internal.h"
#include "layout/box.h"
#include "storage/digest.h"
#include "storage/fs.h"
#include "storage/shard_writer.h"

namespace ckpt {
namespace {

using json = nlohmann::json;

ByteBuffer ToBuffer(const std::string& s) { return ByteBuffer(s.begin(), s.end()); }
std::string ToString(const ByteBuffer& b) { return std::string(b.begin(), b.end()); }

std::string ScalarJson(const Scalar& s) {
  if (s.dtype == DType::kBool) return s.AsInt() ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&s.value)) {
    if (IsFloating(s.dtype)) return json(static_cast<double>(*i)).dump();
    return json(*i).dump();
  }
  const double d = std::get<double>(s.value);
  if (!IsFloating(s.dtype)) return json(static_cast<int64_t>(d)).dump();
  if (!std::isfinite(d)) {
    throw Error(ErrorCode::kInvalidArgument, "scalar value " + std::to_string(d) + " is not finite; JSON cannot hold it");
  }
  return json(d).dump();
}

// Step 1: this rank's description of its state.
json Describe(const StateDict& state) {
  json entries = json::array();
  for (const auto& [key, entry] : state) {
    json e{{"key", key}, {"kind", EntryKindName(KindOf(entry))}};
    if (const auto* t = std::get_if<Tensor>(&entry)) {
      if (t->shape.size() > static_cast<std::size_t>(ParseLimits{}.max_rank)) {
        throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': more than 32 dimensions");
      }
      NumElements(t->shape);  // negative or overflowing shapes
      e["dtype"] = DTypeName(t->dtype);
      e["shape"] = t->shape;
      json boxes = json::array();
      std::vector<Box> mine;
      for (const Chunk& c : t->chunks) {
        if (!layout::Contains(Box::Full(t->shape), c.box)) {
          throw Error(ErrorCode::kInvalidArgument,
                      "key '" + key + "': chunk " + c.box.ToString() + " lies outside the tensor " +
                          Box::Full(t->shape).ToString());
        }
        if (c.box.NumElements() > 0 && c.data == nullptr) {
          throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': chunk " + c.box.ToString() + " has no data");
        }
        for (const Box& b : mine) {
          if (layout::Overlaps(b, c.box)) {
            throw Error(ErrorCode::kInvalidArgument,
                        "key '" + key + "': this rank's chunks " + b.ToString() + " and " + c.box.ToString() + " overlap");
          }
        }
        mine.push_back(c.box);
        boxes.push_back({c.box.offsets, c.box.sizes});
      }
      e["boxes"] = std::move(boxes);
    } else if (const auto* s = std::get_if<Scalar>(&entry)) {
      e["dtype"] = DTypeName(s->dtype);
      e["value"] = ScalarJson(*s);
    } else if (const auto* b = std::get_if<Bytes>(&entry)) {
      e["size"] = b->data.size();
    } else {
      const auto& j = std::get<Json>(entry);
      try {
        e["value"] = json::parse(j.text).dump();
      } catch (const json::exception& ex) {
        throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': invalid JSON value: " + ex.what());
      }
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

// A region of one key held by one or more ranks (replicas).
struct Region {
  Box box;
  std::vector<std::pair<int, int>> holders;  // (rank, index of the chunk in that rank's entry)
  uint64_t bytes = 0;
  int writer = -1;
};

struct KeyPlan {
  std::string key;
  std::string kind;
  std::string dtype;
  Shape shape;
  std::string value;  // scalar / json
  uint64_t size = 0;  // bytes
  std::vector<Region> regions;
  std::map<int, int> entry_index;  // rank -> index of the entry in that rank's description
};

// Step 2 on rank 0: merge all descriptions, checking that they agree.
std::vector<KeyPlan> MergeDescriptions(const std::vector<json>& all) {
  std::vector<KeyPlan> plans;
  std::map<std::string, std::size_t> by_key;
  std::vector<std::string> problems;
  for (std::size_t rank = 0; rank < all.size(); ++rank) {
    for (std::size_t i = 0; i < all[rank].size(); ++i) {
      const json& e = all[rank][i];
      const std::string key = e["key"];
      auto [it, inserted] = by_key.emplace(key, plans.size());
      if (inserted) {
        KeyPlan p;
        p.key = key;
        p.kind = e["kind"];
        if (e.contains("dtype")) p.dtype = e["dtype"];
        if (e.contains("shape")) p.shape = e["shape"].get<Shape>();
        if (e.contains("value")) p.value = e["value"];
        if (e.contains("size")) p.size = e["size"];
        plans.push_back(std::move(p));
      }
      KeyPlan& p = plans[it->second];
      p.entry_index[static_cast<int>(rank)] = static_cast<int>(i);
      const std::string who = "key '" + key + "': rank " + std::to_string(rank);
      if (e["kind"] != p.kind) {
        problems.push_back(who + " has a " + e["kind"].get<std::string>() + ", another rank a " + p.kind);
        continue;
      }
      if (p.kind == "tensor") {
        if (e["dtype"] != p.dtype || e["shape"].get<Shape>() != p.shape) {
          problems.push_back(who + " has " + e["dtype"].get<std::string>() + " " +
                             Box::Full(e["shape"].get<Shape>()).ToString() + ", another rank " + p.dtype + " " +
                             Box::Full(p.shape).ToString());
          continue;
        }
        const json& boxes = e["boxes"];
        for (std::size_t c = 0; c < boxes.size(); ++c) {
          Box b{boxes[c][0].get<Shape>(), boxes[c][1].get<Shape>()};
          auto r = std::find_if(p.regions.begin(), p.regions.end(), [&](const Region& x) { return x.box == b; });
          if (r == p.regions.end()) {
            p.regions.push_back(Region{b, {}, 0, -1});
            r = std::prev(p.regions.end());
          }
          r->holders.emplace_back(static_cast<int>(rank), static_cast<int>(c));
        }
      } else if (p.kind == "bytes") {
        if (e["size"] != p.size) {
          problems.push_back(who + " has " + e["size"].dump() + " bytes, another rank " + std::to_string(p.size));
          continue;
        }
        if (p.regions.empty()) p.regions.push_back(Region{Box{{0}, {static_cast<int64_t>(p.size)}}, {}, 0, -1});
        p.regions[0].holders.emplace_back(static_cast<int>(rank), 0);
      } else if (e["value"] != p.value || e.value("dtype", "") != p.dtype) {
        problems.push_back(who + " has value " + e["value"].get<std::string>() + ", another rank " + p.value);
      }
    }
  }
  for (KeyPlan& p : plans) {
    if (p.kind != "tensor") continue;
    std::stable_sort(p.regions.begin(), p.regions.end(),
                     [](const Region& a, const Region& b) { return a.box.offsets < b.box.offsets; });
    std::vector<Box> boxes;
    for (const Region& r : p.regions) boxes.push_back(r.box);
    for (std::string& problem : layout::TilingProblems(p.shape, boxes)) {
      problems.push_back("key '" + p.key + "': " + problem);
    }
    const auto item = DTypeSize(*DTypeFromName(p.dtype));
    for (Region& r : p.regions) r.bytes = static_cast<uint64_t>(r.box.NumElements()) * item;
  }
  if (!problems.empty()) {
    std::string msg = "save: the state cannot be saved as given:";
    for (std::size_t i = 0; i < problems.size() && i < 50; ++i) msg += "\n  " + problems[i];
    if (problems.size() > 50) msg += "\n  ... and " + std::to_string(problems.size() - 50) + " more";
    throw Error(ErrorCode::kInvalidArgument, msg);
  }
  for (KeyPlan& p : plans) {
    if (p.kind == "bytes") p.regions[0].bytes = p.size;
  }
  return plans;
}

// The memory of chunk `chunk` of this rank's entry `entry`.
std::pair<const void*, std::size_t> LocalData(const StateDict& state, int entry, int chunk) {
  const Entry& e = std::next(state.begin(), entry)->second;
  if (const auto* t = std::get_if<Tensor>(&e)) {
    const Chunk& c = t->chunks.at(static_cast<std::size_t>(chunk));
    return {c.data, static_cast<std::size_t>(c.box.NumElements()) * DTypeSize(t->dtype)};
  }
  const auto& b = std::get<Bytes>(e);
  return {b.data.data(), b.data.size()};
}

// Writers: sole holders write their regions; each replica group goes to its holder with
// the fewest bytes so far, largest groups first.
void AssignWriters(std::vector<KeyPlan>& plans, int world) {
  std::vector<uint64_t> load(static_cast<std::size_t>(world), 0);
  std::vector<Region*> replicated;
  for (KeyPlan& p : plans) {
    for (Region& r : p.regions) {
      if (r.holders.size() == 1) {
        r.writer = r.holders[0].first;
        load[r.writer] += r.bytes;
      } else {
        replicated.push_back(&r);
      }
    }
  }
  std::stable_sort(replicated.begin(), replicated.end(), [](const Region* a, const Region* b) { return a->bytes > b->bytes; });
  for (Region* r : replicated) {
    int best = r->holders[0].first;
    for (const auto& h : r->holders) {
      if (load[h.first] < load[best]) best = h.first;
    }
    r->writer = best;
    load[best] += r->bytes;
  }
}

}  // namespace

void Save(const std::filesystem::path& dir, const StateDict& state, Comm& comm, const SaveOptions& options) {
  const int rank = comm.rank();
  const int world = comm.size();
  const bool root = rank == 0;

  // Step 1: describe.
  std::string description;
  internal::Phase(comm, [&] { description = Describe(state).dump(); });
  std::vector<ByteBuffer> gathered = comm.Gather(ToBuffer(description), 0);

  // Step 2: merge and check on rank 0; ask for replica hashes.
  std::vector<KeyPlan> plans;
  json hash_requests = json::array();  // per rank: [[entry, chunk], ...]
  internal::Phase(comm, [&] {
    if (!root) return;
    std::vector<json> all;
    for (const ByteBuffer& b : gathered) all.push_back(json::parse(ToString(b)));
    plans = MergeDescriptions(all);
    hash_requests = json::array();
    for (int r = 0; r < world; ++r) hash_requests.push_back(json::array());
    if (options.check_replicas) {
      for (const KeyPlan& p : plans) {
        for (const Region& reg : p.regions) {
          if (reg.holders.size() < 2) continue;
          for (const auto& [r, c] : reg.holders) hash_requests[r].push_back({p.entry_index.at(r), c});
        }
      }
    }
  }, /*name_ranks=*/false);
  ByteBuffer requests = ToBuffer(root ? hash_requests.dump() : std::string());
  comm.Broadcast(requests, 0);
  const json all_requests = json::parse(ToString(requests));
  const bool any_replicas = std::any_of(all_requests.begin(), all_requests.end(),
                                        [](const json& r) { return !r.empty(); });
  if (any_replicas) {
    const json& my_requests = all_requests[rank];
    json hashes = json::array();
    internal::Phase(comm, [&] {
      for (const json& req : my_requests) {
        auto [data, n] = LocalData(state, req[0], req[1]);
        hashes.push_back(storage::ChecksumOf(data, n));
      }
    });
    std::vector<ByteBuffer> all_hashes = comm.Gather(ToBuffer(hashes.dump()), 0);
    internal::Phase(comm, [&] {
      if (!root) return;
      std::vector<json> h;
      std::vector<std::size_t> next(static_cast<std::size_t>(world), 0);
      for (const ByteBuffer& b : all_hashes) h.push_back(json::parse(ToString(b)));
      std::vector<std::string> problems;
      for (const KeyPlan& p : plans) {
        for (const Region& reg : p.regions) {
          if (reg.holders.size() < 2) continue;
          std::map<std::string, std::vector<int>> by_hash;
          for (const auto& holder : reg.holders) {
            by_hash[h[holder.first][next[holder.first]++]].push_back(holder.first);
          }
          if (by_hash.size() > 1) {
            std::string groups;
            for (const auto& [hash, ranks] : by_hash) {
              groups += groups.empty() ? "" : " vs ";
              groups += "ranks";
              for (int r : ranks) groups += " " + std::to_string(r);
            }
            problems.push_back("key '" + p.key + "' region " + reg.box.ToString() + ": replicas differ (" +
                               groups + ")");
          }
        }
      }
      if (!problems.empty()) {
        std::string msg = "save: replicated tensors differ between ranks (a data-parallel desync?):";
        for (const auto& s : problems) msg += "\n  " + s;
        throw Error(ErrorCode::kMismatch, msg);
      }
    }, /*name_ranks=*/false);
  }

  // Step 3: writers and staging directory.
  std::filesystem::path staging;
  json plan_msg;
  internal::Phase(comm, [&] {
    if (!root) return;
    internal::CheckTarget(dir, options.overwrite);
    AssignWriters(plans, world);
    staging = internal::MakeStagingDir(dir);
    json writes = json::array();
    for (int r = 0; r < world; ++r) writes.push_back(json::array());
    for (std::size_t k = 0; k < plans.size(); ++k) {
      for (std::size_t g = 0; g < plans[k].regions.size(); ++g) {
        const Region& reg = plans[k].regions[g];
        for (const auto& [r, c] : reg.holders) {
          if (r == reg.writer) writes[r].push_back({plans[k].entry_index.at(r), c, k, g});
        }
      }
    }
    plan_msg = {{"staging", staging.string()}, {"writes", writes}};
  }, /*name_ranks=*/false);
  ByteBuffer plan_buf = ToBuffer(root ? plan_msg.dump() : std::string());
  comm.Broadcast(plan_buf, 0);
  const json plan = json::parse(ToString(plan_buf));
  staging = plan["staging"].get<std::string>();

  // Step 4: write this rank's shard.
  struct Written {
    std::size_t key, region;
    ChunkMeta meta;
  };
  std::vector<Written> written;
  uint64_t file_bytes = 0;
  const std::string file_name = internal::ShardFileName(rank, world);
  std::string failure;
  try {
    const json& writes = plan["writes"][rank];
    if (!writes.empty()) {
      storage::ShardWriter writer(staging, file_name, options.compression);
      for (const json& w : writes) {
        const int entry = w[0], chunk = w[1];
        const auto& [key, e] = *std::next(state.begin(), entry);
        ChunkMeta meta;
        if (const auto* t = std::get_if<Tensor>(&e)) {
          const Chunk& c = t->chunks.at(static_cast<std::size_t>(chunk));
          meta = writer.WriteChunk(key, t->dtype, t->shape, c.box, c.data);
        } else {
          const auto& b = std::get<Bytes>(e);
          meta = writer.WriteBytes(key, b.data.data(), b.data.size());
        }
        written.push_back(Written{w[2], w[3], std::move(meta)});
      }
      file_bytes = writer.Finish();
    }
  } catch (...) {
    failure = internal::DescribeCurrentException();
  }
  try {
    internal::AgreeOrThrow(comm, failure);
  } catch (...) {
    if (root) storage::RemoveAllQuietly(staging);
    throw;
  }
  // Other ranks send what they wrote as one JSON document; rank 0 keeps its own as is.
  std::string my_result;
  if (!root) {
    my_result = "{\"file\":" + json(file_name).dump() + ",\"bytes\":" + std::to_string(file_bytes) + ",\"chunks\":[";
    for (std::size_t i = 0; i < written.size(); ++i) {
      const Written& w = written[i];
      my_result += (i ? ",[" : "[") + std::to_string(w.key) + "," + std::to_string(w.region) + "," +
                   internal::ChunkToJson(w.meta, /*tensor_chunk=*/true) + "]";
    }
    my_result += "]}";
  }
  std::vector<ByteBuffer> all_results = comm.Gather(ToBuffer(my_result), 0);

  // Step 5: metadata.json and the rename, on rank 0.
  internal::Phase(comm, [&] {
    if (!root) return;
    try {
      Metadata m;
      m.state_dict_type = options.state_dict_type;
      m.world_size = world;
      m.mesh = options.mesh;
      m.user = options.user_metadata;
      internal::StampMetadata(m);
      std::vector<std::vector<std::pair<std::size_t, ChunkMeta>>> placed(plans.size());
      if (!written.empty()) m.files.push_back(FileMeta{file_name, 0, file_bytes});
      for (Written& w : written) placed[w.key].emplace_back(w.region, std::move(w.meta));
      for (int r = 1; r < world; ++r) {
        const json res = json::parse(ToString(all_results[r]));
        const auto& cs = res["chunks"];
        if (!cs.empty()) m.files.push_back(FileMeta{res["file"], r, res["bytes"]});
        for (const json& c : cs) {
          const std::size_t k = c[0], g = c[1];
          ChunkMeta meta = internal::ChunkFromJson(c[2], plans[k].kind == "tensor");
          if (plans[k].kind != "tensor") meta.box = Box{{0}, {static_cast<int64_t>(plans[k].size)}};
          placed[k].emplace_back(g, std::move(meta));
        }
      }
      for (std::size_t k = 0; k < plans.size(); ++k) {
        const KeyPlan& p = plans[k];
        EntryMeta e;
        if (p.kind == "tensor") {
          e.kind = EntryKind::kTensor;
          e.dtype = *DTypeFromName(p.dtype);
          e.shape = p.shape;
          std::sort(placed[k].begin(), placed[k].end(), [](const auto& a, const auto& b) { return a.first < b.first; });
          for (auto& [g, c] : placed[k]) e.chunks.push_back(std::move(c));
        } else if (p.kind == "bytes") {
          e.kind = EntryKind::kBytes;
          e.dtype = DType::kUInt8;
          e.size = p.size;
          for (auto& [g, c] : placed[k]) e.chunks.push_back(std::move(c));
        } else if (p.kind == "scalar") {
          e.kind = EntryKind::kScalar;
          e.dtype = *DTypeFromName(p.dtype);
          e.value = p.value;
        } else {
          e.kind = EntryKind::kJson;
          e.value = p.value;
        }
        m.entries.emplace_back(p.key, std::move(e));
      }
      internal::CommitStaging(staging, dir, m);
    } catch (...) {
      storage::RemoveAllQuietly(staging);
      throw;
    }
  }, /*name_ranks=*/false);
}

}  // namespace ckpt
