// ops/json_schema.cc: see json_schema.h.
#include "ops/json_schema.h"

#include <cmath>
#include <map>
#include <memory>
#include <regex>

#include "ckpt/error.h"

namespace ckpt::ops::detail {
namespace {

using nlohmann::json;

enum TypeBit : unsigned {
  kNull = 1, kBoolean = 2, kObject = 4, kArray = 8, kString = 16, kNumber = 32, kInteger = 64,
};

unsigned TypeBitOf(const std::string& t) {
  if (t == "null") return kNull;
  if (t == "boolean") return kBoolean;
  if (t == "object") return kObject;
  if (t == "array") return kArray;
  if (t == "string") return kString;
  if (t == "number") return kNumber;
  if (t == "integer") return kInteger;
  return 0;  // matches nothing
}

bool HasType(const json& v, unsigned types) {
  if ((types & kNull) && v.is_null()) return true;
  if ((types & kBoolean) && v.is_boolean()) return true;
  if ((types & kObject) && v.is_object()) return true;
  if ((types & kArray) && v.is_array()) return true;
  if ((types & kString) && v.is_string()) return true;
  if ((types & kNumber) && v.is_number()) return true;
  if (types & kInteger) {
    if (v.is_number_integer()) return true;
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return std::isfinite(d) && std::floor(d) == d;
    }
  }
  return false;
}

std::string Escape(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string Short(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

[[noreturn]] void Malformed(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "schema: " + what);
}

}  // namespace

// One schema object, its keywords looked up once.
struct JsonSchema::Node {
  bool reject = false;  // the schema `false`
  const Node* ref = nullptr;
  bool has_type = false;
  unsigned types = 0;
  std::string type_text;
  const json* const_value = nullptr;
  const json* enum_values = nullptr;
  const json *minimum = nullptr, *maximum = nullptr;
  double minimum_value = 0, maximum_value = 0;
  const json *min_length = nullptr, *max_length = nullptr, *min_items = nullptr, *max_items = nullptr;
  std::size_t min_length_value = 0, max_length_value = 0, min_items_value = 0, max_items_value = 0;
  const json* pattern = nullptr;
  std::unique_ptr<std::regex> pattern_regex;
  const Node* items = nullptr;
  std::vector<std::string> required;
  bool has_properties = false;
  std::map<std::string, const Node*, std::less<>> properties;
  bool additional_false = false;
  const Node* additional = nullptr;
  const Node* property_names = nullptr;
  std::vector<const Node*> all_of, any_of, one_of;
  bool has_any_of = false, has_one_of = false;
  const Node *not_schema = nullptr, *if_schema = nullptr, *then_schema = nullptr, *else_schema = nullptr;
};

// Where a value is, as a chain of parents: rendered as a JSON pointer only when reported.
struct JsonSchema::Path {
  const Path* parent = nullptr;
  const std::string* key = nullptr;  // a member name, or
  std::size_t index = 0;             // an array index

  std::string Render() const {
    std::string s = parent ? parent->Render() : std::string();
    if (!parent && !key) return s;  // the root
    return s + "/" + (key ? Escape(*key) : std::to_string(index));
  }
};

struct JsonSchema::Errors {
  std::vector<std::string> list;
  std::size_t limit;
  bool full() const { return list.size() >= limit; }
};

JsonSchema::JsonSchema(json schema) : root_(std::move(schema)) { root_node_ = Compile(root_); }
JsonSchema::~JsonSchema() = default;

const JsonSchema::Node* JsonSchema::Compile(const json& s) {
  if (auto it = compiled_.find(&s); it != compiled_.end()) return it->second;
  Node& n = nodes_.emplace_back();
  compiled_.emplace(&s, &n);  // before the children: a $ref may lead back here
  if (s.is_boolean()) {
    n.reject = !s.get<bool>();
    return &n;
  }
  if (!s.is_object()) return &n;
  auto sub = [&](const char* keyword) -> const Node* {
    auto it = s.find(keyword);
    return it == s.end() ? nullptr : Compile(*it);
  };
  auto subs = [&](const char* keyword, std::vector<const Node*>& out) {
    auto it = s.find(keyword);
    if (it == s.end()) return false;
    if (!it->is_array()) Malformed(std::string("'") + keyword + "' is not an array");
    for (const auto& x : *it) out.push_back(Compile(x));
    return true;
  };
  auto size_keyword = [&](const char* keyword, const json*& at, std::size_t& value) {
    auto it = s.find(keyword);
    if (it == s.end()) return;
    if (!it->is_number_unsigned()) Malformed(std::string("'") + keyword + "' is not a non-negative integer");
    at = &*it;
    value = it->get<std::size_t>();
  };
  auto number_keyword = [&](const char* keyword, const json*& at, double& value) {
    auto it = s.find(keyword);
    if (it == s.end()) return;
    if (!it->is_number()) Malformed(std::string("'") + keyword + "' is not a number");
    at = &*it;
    value = it->get<double>();
  };

  if (auto r = s.find("$ref"); r != s.end()) {
    if (!r->is_string()) Malformed("'$ref' is not a string");
    const std::string ref = r->get<std::string>();
    if (ref.empty() || ref[0] != '#')
      throw Error(ErrorCode::kUnsupported, "schema: only local $ref are supported, found '" + ref + "'");
    const json* target = nullptr;
    try {
      target = &root_.at(json::json_pointer(ref.substr(1)));
    } catch (const json::exception&) {
      Malformed("$ref '" + ref + "' does not resolve");
    }
    n.ref = Compile(*target);
  }
  if (auto t = s.find("type"); t != s.end()) {
    n.has_type = true;
    n.type_text = t->dump();
    if (t->is_string()) {
      n.types = TypeBitOf(t->get<std::string>());
    } else if (t->is_array()) {
      for (const auto& x : *t) {
        if (!x.is_string()) Malformed("'type' lists a non-string");
        n.types |= TypeBitOf(x.get<std::string>());
      }
    } else {
      Malformed("'type' is neither a string nor an array");
    }
  }
  if (auto c = s.find("const"); c != s.end()) n.const_value = &*c;
  if (auto e = s.find("enum"); e != s.end()) {
    if (!e->is_array()) Malformed("'enum' is not an array");
    n.enum_values = &*e;
  }
  number_keyword("minimum", n.minimum, n.minimum_value);
  number_keyword("maximum", n.maximum, n.maximum_value);
  size_keyword("minLength", n.min_length, n.min_length_value);
  size_keyword("maxLength", n.max_length, n.max_length_value);
  size_keyword("minItems", n.min_items, n.min_items_value);
  size_keyword("maxItems", n.max_items, n.max_items_value);
  if (auto p = s.find("pattern"); p != s.end()) {
    if (!p->is_string()) Malformed("'pattern' is not a string");
    n.pattern = &*p;
    try {
      n.pattern_regex = std::make_unique<std::regex>(p->get<std::string>(), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      Malformed("pattern " + p->dump() + " is not a valid regular expression: " + e.what());
    }
  }
  n.items = sub("items");
  if (auto r = s.find("required"); r != s.end()) {
    if (!r->is_array()) Malformed("'required' is not an array");
    for (const auto& k : *r) {
      if (!k.is_string()) Malformed("'required' lists a non-string");
      n.required.push_back(k.get<std::string>());
    }
  }
  if (auto p = s.find("properties"); p != s.end()) {
    if (!p->is_object()) Malformed("'properties' is not an object");
    n.has_properties = true;
    for (auto it = p->begin(); it != p->end(); ++it) n.properties.emplace(it.key(), Compile(it.value()));
  }
  if (auto a = s.find("additionalProperties"); a != s.end()) {
    n.additional_false = a->is_boolean() && !a->get<bool>();
    n.additional = Compile(*a);
  }
  n.property_names = sub("propertyNames");
  subs("allOf", n.all_of);
  n.has_any_of = subs("anyOf", n.any_of);
  n.has_one_of = subs("oneOf", n.one_of);
  n.not_schema = sub("not");
  n.if_schema = sub("if");
  n.then_schema = sub("then");
  n.else_schema = sub("else");
  return &n;
}

std::vector<std::string> JsonSchema::Validate(const json& doc, std::size_t limit) const {
  Errors out{{}, limit};
  const Path root;
  Check(*root_node_, doc, &root, out);
  return std::move(out.list);
}

bool JsonSchema::Valid(const Node& n, const json& v) const {
  Errors errs{{}, 1};
  const Path root;
  Check(n, v, &root, errs);
  return errs.list.empty();
}

void JsonSchema::Check(const Node& n, const json& v, const Path* where, Errors& out) const {
  if (out.full()) return;
  auto fail = [&](const std::string& msg) {
    if (out.full()) return;
    std::string at = where->Render();
    out.list.push_back((at.empty() ? "/" : at) + ": " + msg);
  };
  if (n.reject) {
    fail("not allowed here");
    return;
  }
  if (n.ref) Check(*n.ref, v, where, out);
  if (n.has_type && !HasType(v, n.types)) {
    fail("expected type " + n.type_text + ", found " + Short(v));
    return;
  }
  if (n.const_value && *n.const_value != v) fail("expected " + n.const_value->dump() + ", found " + Short(v));
  if (n.enum_values) {
    bool ok = false;
    for (const auto& x : *n.enum_values) ok = ok || x == v;
    if (!ok) fail("expected one of " + n.enum_values->dump() + ", found " + Short(v));
  }
  if (v.is_number()) {
    const double d = v.get<double>();
    if (n.minimum && d < n.minimum_value) fail("expected a number >= " + n.minimum->dump() + ", found " + Short(v));
    if (n.maximum && d > n.maximum_value) fail("expected a number <= " + n.maximum->dump() + ", found " + Short(v));
  }
  if (v.is_string()) {
    const auto& str = v.get_ref<const std::string&>();
    if (n.min_length && str.size() < n.min_length_value) fail("string shorter than " + n.min_length->dump());
    if (n.max_length && str.size() > n.max_length_value) fail("string longer than " + n.max_length->dump());
    if (n.pattern_regex && !std::regex_search(str, *n.pattern_regex))
      fail("string " + Short(v) + " does not match " + n.pattern->dump());
  }
  if (v.is_array()) {
    if (n.max_items && v.size() > n.max_items_value) fail("array longer than " + n.max_items->dump());
    if (n.min_items && v.size() < n.min_items_value) fail("array shorter than " + n.min_items->dump());
    if (n.items)
      for (std::size_t i = 0; i < v.size(); ++i) {
        const Path child{where, nullptr, i};
        Check(*n.items, v[i], &child, out);
      }
  }
  if (v.is_object()) {
    for (const auto& k : n.required)
      if (!v.contains(k)) fail("missing required member " + json(k).dump());
    if (n.has_properties || n.additional || n.property_names) {
      for (auto it = v.begin(); it != v.end(); ++it) {
        const Path child{where, &it.key(), 0};
        if (n.property_names && !Valid(*n.property_names, json(it.key())))
          fail("member name " + json(it.key()).dump() + " is not allowed");
        const auto p = n.has_properties ? n.properties.find(it.key()) : n.properties.end();
        if (p != n.properties.end()) {
          Check(*p->second, it.value(), &child, out);
        } else if (n.additional) {
          if (n.additional_false) fail("unknown member " + json(it.key()).dump());
          else Check(*n.additional, it.value(), &child, out);
        }
      }
    }
  }
  for (const Node* sub : n.all_of) Check(*sub, v, where, out);
  if (n.has_any_of) {
    bool ok = false;
    for (const Node* sub : n.any_of) ok = ok || Valid(*sub, v);
    if (!ok) fail("matches none of the anyOf alternatives");
  }
  if (n.has_one_of) {
    int count = 0;
    for (const Node* sub : n.one_of) count += Valid(*sub, v) ? 1 : 0;
    if (count != 1) fail("matches " + std::to_string(count) + " of the oneOf alternatives, expected 1");
  }
  if (n.not_schema && Valid(*n.not_schema, v)) fail("matches a schema it must not");
  if (n.if_schema) {
    if (Valid(*n.if_schema, v)) {
      if (n.then_schema) Check(*n.then_schema, v, where, out);
    } else if (n.else_schema) {
      Check(*n.else_schema, v, where, out);
    }
  }
}

}  // namespace ckpt::ops::detail
