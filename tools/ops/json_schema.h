// ops/json_schema.h (internal): a small JSON Schema (draft 2020-12) validator, enough
// for schemas/metadata.schema.json: type, enum, const, required, properties,
// additionalProperties, propertyNames, items, min/maxItems, minimum/maximum,
// min/maxLength, pattern, local $ref, allOf/anyOf/oneOf/not, if/then/else. Unknown
// keywords are ignored, as the specification says for annotations.
//
// The schema is compiled once, at construction, into a graph of nodes (keywords looked
// up, $ref resolved, patterns compiled), so validating a large document does no keyword
// lookups and builds no JSON pointer unless it reports a violation. A malformed schema
// (a $ref that does not resolve, a bad pattern, a keyword of the wrong type) throws
// Error(kInvalidArgument) from the constructor.
//
// Patterns are matched in time linear in the string (a Thompson automaton, no backtracking
// and no recursion over the text); values nested deeper than kMaxDepth are reported, not
// descended into, so no document overflows the stack.
//
// Thread-safety: immutable after construction; Validate may be called from any thread.
#pragma once

#include <cstddef>
#include <deque>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

namespace ckpt::ops::detail {

class JsonSchema {
 public:
  explicit JsonSchema(nlohmann::json schema);
  ~JsonSchema();
  JsonSchema(const JsonSchema&) = delete;
  JsonSchema& operator=(const JsonSchema&) = delete;

  // Every violation as "<JSON pointer>: <message>", at most `limit` of them.
  std::vector<std::string> Validate(const nlohmann::json& doc, std::size_t limit = 100) const;

 private:
  struct Node;
  struct Path;
  struct Errors;
  const Node* Compile(const nlohmann::json& schema);
  const Node* CompileRef(const nlohmann::json& ref);
  void CompileValueKeywords(const nlohmann::json& schema, Node& n);
  void CompileMemberKeywords(const nlohmann::json& schema, Node& n);
  void Check(const Node& n, const nlohmann::json& v, const Path* where, Errors& out) const;
  bool Valid(const Node& n, const nlohmann::json& v, const Path* where) const;
  static constexpr std::size_t kMaxDepth = 256;  // deeper values are reported, not checked

  nlohmann::json root_;
  std::deque<Node> nodes_;
  std::unordered_map<const nlohmann::json*, const Node*> compiled_;
  const Node* root_node_ = nullptr;
};

// schemas/metadata.schema.json, compiled into the library.
const char* EmbeddedMetadataSchema();

}  // namespace ckpt::ops::detail
