// format/json_value.h: JSON values. Every JSON text the library reads goes through
// ReadJson, nlohmann-json's SAX parser under the reader's limits (FORMAT.md §8): nesting
// depth and duplicate keys (nlohmann::json would keep the last of two). A document's reader
// chooses, as each container begins, whether to take it as one tree (a record: small) or
// member by member (the long lists: a checkpoint's entries, a shard's chunk records), so no
// tree of a whole document is ever built.
//
// Speed: nlohmann's SAX parser reaches the metadata-scale target, so no hand-written parser
// is kept. 16,384 ranks x 1,000 tensors (the 2.4 MiB metadata.json of `ckpt-bench-scale
// --ranks 16384`) parse in 0.037 s CPU (best of 20 ParseMetadata calls; target <= 0.05 s),
// against 0.027 s for the hand-written pull reader this replaced; of it, nlohmann's lexer
// with a no-op handler takes 0.013 s and building the per-entry trees about as much again.
// The bench's own run: 0.045 s CPU (0.028 s before). A rank's shard indexes at that scale
// (1.1 MiB) parse in 0.022 s (0.005 s before), its load plan taking 0.03 s of its 0.2 s.
// (2026-12-07, the shared 2-core VM at load average 9-10, Release build.)
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::format {

// A tree: objects are std::maps, so dump() writes a value's members sorted (the text the
// model keeps for JSON values, and what messages quote).
using Json = nlohmann::json;
// Small objects written in the order their members are given.
using OrderedJson = nlohmann::ordered_json;

// Where a value stands: the keys of the members that lead to it from the root (an array's
// element: its array's path and an empty step).
using JsonPath = std::vector<std::string>;

// What a document's reader does with the values of one JSON text.
class JsonVisitor {
 public:
  virtual ~JsonVisitor() = default;
  // A container begins at `path`: true to be handed its members (elements) one by one,
  // false to be handed it whole, as one tree, when it ends.
  virtual bool Descend(const JsonPath& path, bool object) = 0;
  // A value at `path` that is not descended into: a scalar or a whole container.
  virtual void Value(const JsonPath& path, Json&& value) = 0;
};

// The first thing that makes a text not a JSON document within the limits.
struct JsonProblem {
  bool syntax = false;  // not JSON: `what` is nlohmann::json's words (with the place)
  std::string what;     // otherwise: "duplicate key 'k'", "JSON nesting deeper than N"
};

// Reads `text` (RFC 8259 as nlohmann::json reads it) into `visitor`; the problem that
// stopped it, if any. Exceptions the visitor throws pass through.
std::optional<JsonProblem> ReadJson(std::string_view text, int max_depth, JsonVisitor& visitor);

// A number's kinds as nlohmann tells them apart: an integer without a minus sign is
// unsigned, one with it signed, anything else (a fraction, an exponent, an integer beyond
// 64 bits) a float.
inline bool IsNonNegativeInt64(const Json& v) {
  return v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX);
}

// Member `key` of object `o`, or nullptr.
inline const Json* Member(const Json& o, const char* key) {
  const auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

}  // namespace ckpt::format
