// ops/json_schema.cc: see json_schema.h.
#include "ops/json_schema.h"

#include <cmath>

#include "ckpt/error.h"

namespace ckpt::ops::detail {
namespace {

using nlohmann::json;

bool IsType(const json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") {
    if (v.is_number_integer()) return true;
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return std::isfinite(d) && std::floor(d) == d;
    }
    return false;
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

}  // namespace

std::vector<std::string> JsonSchema::Validate(const json& doc, std::size_t limit) {
  std::vector<std::string> out;
  Check(root_, doc, "", out, limit);
  return out;
}

const json& JsonSchema::Resolve(const std::string& ref) {
  if (ref.empty() || ref[0] != '#')
    throw Error(ErrorCode::kUnsupported, "schema: only local $ref are supported, found '" + ref + "'");
  return root_.at(json::json_pointer(ref.substr(1)));
}

const std::regex& JsonSchema::Regex(const std::string& pattern) {
  auto it = regex_cache_.find(pattern);
  if (it == regex_cache_.end()) it = regex_cache_.emplace(pattern, std::regex(pattern, std::regex::ECMAScript)).first;
  return it->second;
}

bool JsonSchema::Valid(const json& schema, const json& v) {
  std::vector<std::string> errs;
  Check(schema, v, "", errs, 1);
  return errs.empty();
}

void JsonSchema::Check(const json& s, const json& v, const std::string& where,
                       std::vector<std::string>& out, std::size_t limit) {
  if (out.size() >= limit) return;
  if (s.is_boolean()) {
    if (!s.get<bool>()) out.push_back((where.empty() ? "/" : where) + ": not allowed here");
    return;
  }
  if (!s.is_object()) return;
  const std::string at = where.empty() ? "/" : where;
  auto fail = [&](const std::string& msg) {
    if (out.size() < limit) out.push_back(at + ": " + msg);
  };
  if (auto r = s.find("$ref"); r != s.end()) Check(Resolve(r->get<std::string>()), v, where, out, limit);
  if (auto t = s.find("type"); t != s.end()) {
    bool ok = false;
    if (t->is_string()) ok = IsType(v, t->get<std::string>());
    else
      for (const auto& x : *t) ok = ok || IsType(v, x.get<std::string>());
    if (!ok) {
      fail("expected type " + t->dump() + ", found " + Short(v));
      return;
    }
  }
  if (auto c = s.find("const"); c != s.end() && *c != v) fail("expected " + c->dump() + ", found " + Short(v));
  if (auto e = s.find("enum"); e != s.end()) {
    bool ok = false;
    for (const auto& x : *e) ok = ok || x == v;
    if (!ok) fail("expected one of " + e->dump() + ", found " + Short(v));
  }
  if (v.is_number()) {
    const double d = v.get<double>();
    if (auto m = s.find("minimum"); m != s.end() && d < m->get<double>())
      fail("expected a number >= " + m->dump() + ", found " + Short(v));
    if (auto m = s.find("maximum"); m != s.end() && d > m->get<double>())
      fail("expected a number <= " + m->dump() + ", found " + Short(v));
  }
  if (v.is_string()) {
    const auto& str = v.get_ref<const std::string&>();
    if (auto m = s.find("minLength"); m != s.end() && str.size() < m->get<std::size_t>())
      fail("string shorter than " + m->dump());
    if (auto m = s.find("maxLength"); m != s.end() && str.size() > m->get<std::size_t>())
      fail("string longer than " + m->dump());
    if (auto p = s.find("pattern"); p != s.end() &&
        !std::regex_search(str, Regex(p->get<std::string>())))
      fail("string " + Short(v) + " does not match " + p->dump());
  }
  if (v.is_array()) {
    if (auto m = s.find("maxItems"); m != s.end() && v.size() > m->get<std::size_t>())
      fail("array longer than " + m->dump());
    if (auto m = s.find("minItems"); m != s.end() && v.size() < m->get<std::size_t>())
      fail("array shorter than " + m->dump());
    if (auto it = s.find("items"); it != s.end())
      for (std::size_t i = 0; i < v.size(); ++i) Check(*it, v[i], where + "/" + std::to_string(i), out, limit);
  }
  if (v.is_object()) {
    if (auto r = s.find("required"); r != s.end())
      for (const auto& k : *r)
        if (!v.contains(k.get<std::string>())) fail("missing required member " + k.dump());
    const json* props = s.contains("properties") ? &s["properties"] : nullptr;
    const json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    const json* names = s.contains("propertyNames") ? &s["propertyNames"] : nullptr;
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string child = where + "/" + Escape(it.key());
      if (names) {
        std::vector<std::string> e;
        Check(*names, json(it.key()), "", e, 1);
        if (!e.empty()) fail("member name " + json(it.key()).dump() + " is not allowed");
      }
      if (props && props->contains(it.key())) {
        Check((*props)[it.key()], it.value(), child, out, limit);
      } else if (extra) {
        if (extra->is_boolean() && !extra->get<bool>())
          fail("unknown member " + json(it.key()).dump());
        else
          Check(*extra, it.value(), child, out, limit);
      }
    }
  }
  if (auto a = s.find("allOf"); a != s.end())
    for (const auto& sub : *a) Check(sub, v, where, out, limit);
  if (auto a = s.find("anyOf"); a != s.end()) {
    bool ok = false;
    for (const auto& sub : *a) ok = ok || Valid(sub, v);
    if (!ok) fail("matches none of the anyOf alternatives");
  }
  if (auto a = s.find("oneOf"); a != s.end()) {
    int n = 0;
    for (const auto& sub : *a) n += Valid(sub, v) ? 1 : 0;
    if (n != 1) fail("matches " + std::to_string(n) + " of the oneOf alternatives, expected 1");
  }
  if (auto n = s.find("not"); n != s.end() && Valid(*n, v)) fail("matches a schema it must not");
  if (auto i = s.find("if"); i != s.end()) {
    if (Valid(*i, v)) {
      if (auto t = s.find("then"); t != s.end()) Check(*t, v, where, out, limit);
    } else if (auto e = s.find("else"); e != s.end()) {
      Check(*e, v, where, out, limit);
    }
  }
}

}  // namespace ckpt::ops::detail
