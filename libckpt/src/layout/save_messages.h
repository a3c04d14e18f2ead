// layout/save_messages.h: the messages of a collective save, in the binary encoding of
// format/wire.h. In protocol order:
//   key table    rank 0 -> every rank   its entries, for the fast path (save_plan.h)
//   description  every rank -> rank 0   its claims, or those not on the fast path
//   requests     rank 0 -> every rank   per rank, the chunks whose digests it sends
//   digests      every rank -> rank 0   one digest per requested chunk
//   plan         rank 0 -> every rank   the staging directory; per rank, the chunks it writes
//   totals       every rank, reduced     per key, stats and stored bytes (checkpoint/save.cc)
//   result       every rank -> rank 0   its shard file, index digest and chunk count
// Each decoder checks every length, count and enum and throws kComm naming the message
// ("rank 3's description") on a malformed one. The per-rank lists of a broadcast are
// sections of their own, so a rank decodes only its own list.
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "layout/save_plan.h"

namespace ckpt::layout {

using Message = std::vector<uint8_t>;

// `entries` (SlowClaims): the claims' positions in the rank's state; empty, the whole state.
Message EncodeDescription(const RankDescription& description, std::span<const uint32_t> entries = {});
RankDescription DecodeDescription(std::span<const uint8_t> message, int rank);
// Also the positions (0.. for a whole state); they are strictly increasing.
RankDescription DecodeDescription(std::span<const uint8_t> message, int rank, std::vector<uint32_t>& entries);

// The fast path's key table (save_plan.h), rank 0 -> every rank, before the descriptions.
Message EncodeKeyTable(const KeyTable& table);
KeyTable DecodeKeyTable(std::span<const uint8_t> message, int world);

// `any` is set on every rank when any rank has requests (then the digests are gathered).
Message EncodeRequests(const std::vector<std::vector<ChunkRef>>& per_rank);
std::vector<ChunkRef> DecodeRequests(std::span<const uint8_t> message, int rank, int world, bool& any);

Message EncodeDigests(const std::vector<std::string>& digests);
std::vector<std::string> DecodeDigests(std::span<const uint8_t> message, int rank);

struct PlanMessage {
  std::string staging;
  uint32_t key_count = 0;        // the plan's keys: the length of the reduced totals
  std::vector<ChunkRef> writes;  // this rank's, in order
  std::vector<uint32_t> keys;    // the plan key of each write (< key_count)
};
Message EncodePlan(const std::string& staging, uint32_t key_count, const std::vector<std::vector<Write>>& writes);
// `fast_writes` (FastWrites, of the plan keys k where fast[k]) are merged in, in plan order;
// a listed write of such a key is malformed.
PlanMessage DecodePlan(std::span<const uint8_t> message, int rank, int world, std::span<const uint8_t> fast = {},
                       std::span<const Write> fast_writes = {});

Message EncodeResult(const RankResult& result);
RankResult DecodeResult(std::span<const uint8_t> message, int rank);

}  // namespace ckpt::layout
