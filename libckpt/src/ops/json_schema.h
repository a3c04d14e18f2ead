// ops/json_schema.h (internal): a small JSON Schema (draft 2020-12) validator, enough
// for schemas/metadata.schema.json: type, enum, const, required, properties,
// additionalProperties, propertyNames, items, min/maxItems, minimum/maximum,
// min/maxLength, pattern, local $ref, allOf/anyOf/oneOf/not, if/then/else. Unknown
// keywords are ignored, as the specification says for annotations.
//
// Thread-safety: a validator is immutable after construction except for its regex
// cache; use one per thread.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

namespace ckpt::ops::detail {

class JsonSchema {
 public:
  explicit JsonSchema(nlohmann::json schema) : root_(std::move(schema)) {}
  // Every violation as "<JSON pointer>: <message>", at most `limit` of them.
  std::vector<std::string> Validate(const nlohmann::json& doc, std::size_t limit = 100);

 private:
  void Check(const nlohmann::json& schema, const nlohmann::json& v, const std::string& where,
             std::vector<std::string>& out, std::size_t limit);
  bool Valid(const nlohmann::json& schema, const nlohmann::json& v);
  const nlohmann::json& Resolve(const std::string& ref);
  const std::regex& Regex(const std::string& pattern);

  nlohmann::json root_;
  std::map<std::string, std::regex> regex_cache_;
};

// schemas/metadata.schema.json, compiled into the library.
const char* EmbeddedMetadataSchema();

}  // namespace ckpt::ops::detail
