// ops/json_schema.cc: see json_schema.h.
#include "ops/json_schema.h"

#include <bitset>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string_view>

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

// Appends v's JSON text to `out` until `out` holds more than `budget` bytes; the recursion
// is bounded by the budget (each level writes a bracket), not by v's depth or size.
void DumpSome(const json& v, std::string& out, std::size_t budget) {
  if (out.size() > budget) return;
  if (v.is_object() || v.is_array()) {
    out += v.is_object() ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= budget; ++it) {
      if (!first) out += ',';
      first = false;
      if (v.is_object()) out += json(it.key()).dump() + ':';
      DumpSome(it.value(), out, budget);
    }
    out += v.is_object() ? '}' : ']';
  } else if (v.is_string() && v.get_ref<const std::string&>().size() > budget) {
    out += json(v.get_ref<const std::string&>().substr(0, budget)).dump(-1, ' ', false, json::error_handler_t::replace);
  } else {
    out += v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

// The start of v's JSON text, for messages: at most 60 characters.
std::string Short(const json& v) {
  std::string s;
  DumpSome(v, s, 60);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

[[noreturn]] void Malformed(const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, "schema: " + what);
}

// A regular expression of JSON Schema's `pattern` (ECMAScript syntax, the subset schemas
// use), matched by simulating its Thompson automaton (a Pike VM without captures): time
// O(text length x pattern size), memory O(pattern size), no recursion and no backtracking
// over the text, so no input makes it slow or overflows the stack. (std::regex recursed
// once per character and overflowed the stack on strings of some 30,000 characters.)
//
// Supported: literals, '.', escapes (\d \D \w \W \s \S, \t \n \r \f \v \0, \xHH, and any
// punctuation escaped), classes [a-z0-9_] and [^...], groups (...) and (?:...),
// alternation, the quantifiers * + ? {n} {n,} {n,m} (lazy ones too: the same matches),
// and the anchors ^ and $. Matching is by byte, as std::regex over std::string did.
// Anything else (backreferences, lookaround, \b) is refused when the schema is compiled.
class Pattern {
 public:
  explicit Pattern(const std::string& source) : src_(source) {
    Node root = ParseAlternation(0);
    if (pos_ != src_.size()) Bad("unbalanced ')'");
    Emit(root);
    prog_.push_back(Inst{Inst::kMatch, {}, 0, 0});
  }

  // True if the pattern matches somewhere in `text` (JSON Schema: unanchored search).
  bool Search(std::string_view text) const {
    std::vector<std::size_t> cur, next;
    std::vector<std::size_t> mark(prog_.size(), SIZE_MAX);  // last step a state was added at
    std::vector<std::size_t> stack;
    std::size_t step = 0;
    auto add = [&](std::vector<std::size_t>& list, std::size_t start, std::size_t at) {
      // Adds `start` and every state reachable from it without reading a byte.
      stack.assign(1, start);
      while (!stack.empty()) {
        const std::size_t pc = stack.back();
        stack.pop_back();
        if (mark[pc] == step) continue;
        mark[pc] = step;
        const Inst& in = prog_[pc];
        switch (in.op) {
          case Inst::kSplit: stack.push_back(in.y); stack.push_back(in.x); break;
          case Inst::kJump: stack.push_back(in.x); break;
          case Inst::kBegin: if (at == 0) stack.push_back(pc + 1); break;
          case Inst::kEnd: if (at == text.size()) stack.push_back(pc + 1); break;
          default: list.push_back(pc);
        }
      }
    };
    for (std::size_t at = 0;; ++at) {
      add(cur, 0, at);  // a match may start at every position
      for (const std::size_t pc : cur)
        if (prog_[pc].op == Inst::kMatch) return true;
      if (at == text.size()) return false;
      ++step;
      next.clear();
      const auto c = static_cast<unsigned char>(text[at]);
      for (const std::size_t pc : cur)
        if (prog_[pc].op == Inst::kByte && prog_[pc].set.test(c)) add(next, pc + 1, at + 1);
      cur.swap(next);
    }
  }

 private:
  using Set = std::bitset<256>;
  struct Inst {
    enum Op { kByte, kSplit, kJump, kBegin, kEnd, kMatch } op;
    Set set;           // kByte: the bytes it reads
    std::size_t x, y;  // kSplit: both targets; kJump: x
  };
  struct Node {
    enum Kind { kEmpty, kSet, kBegin, kEnd, kConcat, kAlt, kRepeat } kind = kEmpty;
    Set set;
    std::vector<Node> kids;
    int min = 0, max = 0;  // kRepeat; max -1: unbounded
  };
  static constexpr int kMaxNesting = 64;
  static constexpr std::size_t kMaxProgram = 100000;
  static constexpr int kMaxCount = 1000;

  [[noreturn]] void Bad(const std::string& what) const {
    throw Error(ErrorCode::kInvalidArgument,
                "schema: pattern " + json(src_).dump() +
                    " is not a valid regular expression (of the subset supported): " + what);
  }
  bool More() const { return pos_ < src_.size(); }
  char Peek() const { return src_[pos_]; }

  Node ParseAlternation(int depth) {
    if (depth > kMaxNesting) Bad("groups nested deeper than " + std::to_string(kMaxNesting));
    Node alt;
    alt.kind = Node::kAlt;
    alt.kids.push_back(ParseConcat(depth));
    while (More() && Peek() == '|') {
      ++pos_;
      alt.kids.push_back(ParseConcat(depth));
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  Node ParseConcat(int depth) {
    Node cat;
    cat.kind = Node::kConcat;
    while (More() && Peek() != '|' && Peek() != ')') {
      Node atom = ParseAtom(depth);
      cat.kids.push_back(ParseQuantifier(std::move(atom)));
    }
    return cat;
  }

  Node ParseQuantifier(Node atom) {
    while (More()) {
      int lo, hi;
      const char c = Peek();
      if (c == '*') lo = 0, hi = -1, ++pos_;
      else if (c == '+') lo = 1, hi = -1, ++pos_;
      else if (c == '?') lo = 0, hi = 1, ++pos_;
      else if (c == '{' && ParseCount(lo, hi)) {}
      else break;
      if (atom.kind == Node::kBegin || atom.kind == Node::kEnd) Bad("a quantifier after an anchor");
      if (More() && Peek() == '?') ++pos_;  // lazy: matches the same strings
      Node rep;
      rep.kind = Node::kRepeat;
      rep.min = lo, rep.max = hi;
      rep.kids.push_back(std::move(atom));
      atom = std::move(rep);
    }
    return atom;
  }

  // {n}, {n,}, {n,m} at pos_; false (pos_ unchanged) when '{' starts no count, which
  // ECMAScript then reads as a literal '{'.
  bool ParseCount(int& lo, int& hi) {
    std::size_t p = pos_ + 1;
    auto number = [&](int& out) {
      const std::size_t start = p;
      long v = 0;
      while (p < src_.size() && src_[p] >= '0' && src_[p] <= '9') {
        v = std::min<long>(v * 10 + (src_[p] - '0'), kMaxCount + 1);
        ++p;
      }
      out = static_cast<int>(v);
      return p > start;
    };
    if (!number(lo)) return false;
    hi = lo;
    if (p < src_.size() && src_[p] == ',') {
      ++p;
      if (!number(hi)) hi = -1;
    }
    if (p >= src_.size() || src_[p] != '}') return false;
    if (lo > kMaxCount || hi > kMaxCount) Bad("a count above " + std::to_string(kMaxCount));
    if (hi >= 0 && hi < lo) Bad("a count {n,m} with m < n");
    pos_ = p + 1;
    return true;
  }

  Node ParseAtom(int depth) {
    Node n;
    const char c = src_[pos_++];
    switch (c) {
      case '^': n.kind = Node::kBegin; return n;
      case '$': n.kind = Node::kEnd; return n;
      case '(': {
        if (More() && Peek() == '?') {
          if (pos_ + 1 < src_.size() && src_[pos_ + 1] == ':') pos_ += 2;
          else Bad("lookaround and named groups are not supported");
        }
        n = ParseAlternation(depth + 1);
        if (!More() || Peek() != ')') Bad("unbalanced '('");
        ++pos_;
        return n;
      }
      case '[': n.kind = Node::kSet; n.set = ParseClass(); return n;
      case '.':
        n.kind = Node::kSet;
        n.set.set();
        n.set.reset('\n');
        n.set.reset('\r');
        return n;
      case '\\': n.kind = Node::kSet; n.set = ParseEscape(false); return n;
      case '*': case '+': case '?': Bad("nothing to repeat");
      case ')': Bad("unbalanced ')'");
      default:
        n.kind = Node::kSet;
        n.set.set(static_cast<unsigned char>(c));
        return n;
    }
  }

  // After a backslash: the bytes the escape stands for.
  Set ParseEscape(bool in_class) {
    if (!More()) Bad("a trailing backslash");
    const char c = src_[pos_++];
    Set s;
    auto range = [&](int lo, int hi) {
      for (int b = lo; b <= hi; ++b) s.set(static_cast<std::size_t>(b));
    };
    switch (c) {
      case 'd': range('0', '9'); return s;
      case 'D': range('0', '9'); return s.flip();
      case 'w': range('0', '9'), range('a', 'z'), range('A', 'Z'), s.set('_'); return s;
      case 'W': range('0', '9'), range('a', 'z'), range('A', 'Z'), s.set('_'); return s.flip();
      case 's': range('\t', '\r'), s.set(' '); return s;
      case 'S': range('\t', '\r'), s.set(' '); return s.flip();
      case 't': s.set('\t'); return s;
      case 'n': s.set('\n'); return s;
      case 'r': s.set('\r'); return s;
      case 'f': s.set('\f'); return s;
      case 'v': s.set('\v'); return s;
      case '0': s.set(0); return s;
      case 'b': if (in_class) { s.set('\b'); return s; } break;
      case 'x': {
        auto hex = [&](char h) -> int {
          if (h >= '0' && h <= '9') return h - '0';
          if (h >= 'a' && h <= 'f') return h - 'a' + 10;
          if (h >= 'A' && h <= 'F') return h - 'A' + 10;
          return -1;
        };
        if (pos_ + 2 > src_.size() || hex(src_[pos_]) < 0 || hex(src_[pos_ + 1]) < 0) Bad("a bad \\x escape");
        s.set(static_cast<std::size_t>(hex(src_[pos_]) * 16 + hex(src_[pos_ + 1])));
        pos_ += 2;
        return s;
      }
      default:
        if (std::ispunct(static_cast<unsigned char>(c))) {
          s.set(static_cast<unsigned char>(c));
          return s;
        }
    }
    Bad(std::string("the escape \\") + c + " is not supported");
  }

  Set ParseClass() {
    Set s;
    const bool negate = More() && Peek() == '^';
    if (negate) ++pos_;
    for (;;) {  // ECMAScript: "[]" matches nothing, "[^]" any byte
      if (!More()) Bad("unbalanced '['");
      if (Peek() == ']') break;
      int lo = -1;
      Set item;
      if (Peek() == '\\') {
        ++pos_;
        item = ParseEscape(true);
        if (item.count() == 1) lo = static_cast<int>(item._Find_first());
      } else {
        lo = static_cast<unsigned char>(src_[pos_++]);
        item.set(static_cast<std::size_t>(lo));
      }
      if (lo >= 0 && pos_ + 1 < src_.size() && Peek() == '-' && src_[pos_ + 1] != ']') {
        ++pos_;
        int hi;
        if (Peek() == '\\') {
          ++pos_;
          const Set h = ParseEscape(true);
          if (h.count() != 1) Bad("a class range ending in a class escape");
          hi = static_cast<int>(h._Find_first());
        } else {
          hi = static_cast<unsigned char>(src_[pos_++]);
        }
        if (hi < lo) Bad("a class range out of order");
        for (int b = lo; b <= hi; ++b) item.set(static_cast<std::size_t>(b));
      }
      s |= item;
    }
    ++pos_;  // ']'
    return negate ? s.flip() : s;
  }

  std::size_t Put(Inst in) {
    if (prog_.size() >= kMaxProgram) Bad("too large once its counts are expanded");
    prog_.push_back(in);
    return prog_.size() - 1;
  }

  void Emit(const Node& n) {
    switch (n.kind) {
      case Node::kEmpty: return;
      case Node::kSet: Put(Inst{Inst::kByte, n.set, 0, 0}); return;
      case Node::kBegin: Put(Inst{Inst::kBegin, {}, 0, 0}); return;
      case Node::kEnd: Put(Inst{Inst::kEnd, {}, 0, 0}); return;
      case Node::kConcat:
        for (const Node& k : n.kids) Emit(k);
        return;
      case Node::kAlt: {
        // split L1, next; L1: a; jump end; next: split L2, ...; last alternative
        std::vector<std::size_t> jumps;
        for (std::size_t i = 0; i + 1 < n.kids.size(); ++i) {
          const std::size_t split = Put(Inst{Inst::kSplit, {}, 0, 0});
          prog_[split].x = prog_.size();
          Emit(n.kids[i]);
          jumps.push_back(Put(Inst{Inst::kJump, {}, 0, 0}));
          prog_[split].y = prog_.size();
        }
        Emit(n.kids.back());
        for (const std::size_t j : jumps) prog_[j].x = prog_.size();
        return;
      }
      case Node::kRepeat: {
        const Node& k = n.kids[0];
        for (int i = 0; i < n.min; ++i) Emit(k);
        if (n.max < 0) {  // L: split body, end; body; jump L
          const std::size_t split = Put(Inst{Inst::kSplit, {}, 0, 0});
          prog_[split].x = prog_.size();
          Emit(k);
          Put(Inst{Inst::kJump, {}, split, 0});
          prog_[split].y = prog_.size();
          return;
        }
        std::vector<std::size_t> splits;  // each optional copy may be skipped to the end
        for (int i = n.min; i < n.max; ++i) {
          splits.push_back(Put(Inst{Inst::kSplit, {}, 0, 0}));
          prog_[splits.back()].x = prog_.size();
          Emit(k);
        }
        for (const std::size_t s : splits) prog_[s].y = prog_.size();
        return;
      }
    }
  }

  std::string src_;
  std::size_t pos_ = 0;
  std::vector<Inst> prog_;
};

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
  std::unique_ptr<Pattern> pattern_regex;
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
  std::size_t depth = 0;             // values around this one (across Valid too)

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

namespace {

// The value of size keyword `keyword` of schema `s` into `value` (`at`: where it is), if present.
void SizeKeyword(const json& s, const char* keyword, const json*& at, std::size_t& value) {
  auto it = s.find(keyword);
  if (it == s.end()) return;
  if (!it->is_number_unsigned()) Malformed(std::string("'") + keyword + "' is not a non-negative integer");
  at = &*it;
  value = it->get<std::size_t>();
}

// The value of number keyword `keyword` of schema `s` into `value` (`at`: where it is), if present.
void NumberKeyword(const json& s, const char* keyword, const json*& at, double& value) {
  auto it = s.find(keyword);
  if (it == s.end()) return;
  if (!it->is_number()) Malformed(std::string("'") + keyword + "' is not a number");
  at = &*it;
  value = it->get<double>();
}

}  // namespace

const JsonSchema::Node* JsonSchema::CompileRef(const json& r) {
  if (!r.is_string()) Malformed("'$ref' is not a string");
  const std::string ref = r.get<std::string>();
  if (ref.empty() || ref[0] != '#')
    throw Error(ErrorCode::kUnsupported, "schema: only local $ref are supported, found '" + ref + "'");
  const json* target = nullptr;
  try {
    target = &root_.at(json::json_pointer(ref.substr(1)));
  } catch (const json::exception&) {
    Malformed("$ref '" + ref + "' does not resolve");
  }
  return Compile(*target);
}

// The keywords on a value itself: type, const, enum, bounds, lengths, sizes and pattern.
void JsonSchema::CompileValueKeywords(const json& s, Node& n) {
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
  NumberKeyword(s, "minimum", n.minimum, n.minimum_value);
  NumberKeyword(s, "maximum", n.maximum, n.maximum_value);
  SizeKeyword(s, "minLength", n.min_length, n.min_length_value);
  SizeKeyword(s, "maxLength", n.max_length, n.max_length_value);
  SizeKeyword(s, "minItems", n.min_items, n.min_items_value);
  SizeKeyword(s, "maxItems", n.max_items, n.max_items_value);
  if (auto p = s.find("pattern"); p != s.end()) {
    if (!p->is_string()) Malformed("'pattern' is not a string");
    n.pattern = &*p;
    n.pattern_regex = std::make_unique<Pattern>(p->get<std::string>());
  }
}

// The keywords on an object's members: required, properties, additionalProperties.
void JsonSchema::CompileMemberKeywords(const json& s, Node& n) {
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
}

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
  if (auto r = s.find("$ref"); r != s.end()) n.ref = CompileRef(*r);
  CompileValueKeywords(s, n);
  n.items = sub("items");
  CompileMemberKeywords(s, n);
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

bool JsonSchema::Valid(const Node& n, const json& v, const Path* where) const {
  Errors errs{{}, 1};
  const Path root{nullptr, nullptr, 0, where->depth};
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
  if (where->depth > kMaxDepth) {  // a recursive schema over a deep document: no stack overflow
    fail("nested more than " + std::to_string(kMaxDepth) + " levels deep; not checked further");
    return;
  }
  if (n.ref) {  // counted as a level, so a $ref cycle that reads nothing ends too
    const Path same{where->parent, where->key, where->index, where->depth + 1};
    Check(*n.ref, v, &same, out);
  }
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
    if (n.pattern_regex && !n.pattern_regex->Search(str))
      fail("string " + Short(v) + " does not match " + n.pattern->dump());
  }
  if (v.is_array()) {
    if (n.max_items && v.size() > n.max_items_value) fail("array longer than " + n.max_items->dump());
    if (n.min_items && v.size() < n.min_items_value) fail("array shorter than " + n.min_items->dump());
    if (n.items)
      for (std::size_t i = 0; i < v.size(); ++i) {
        const Path child{where, nullptr, i, where->depth + 1};
        Check(*n.items, v[i], &child, out);
      }
  }
  if (v.is_object()) {
    for (const auto& k : n.required)
      if (!v.contains(k)) fail("missing required member " + json(k).dump());
    if (n.has_properties || n.additional || n.property_names) {
      for (auto it = v.begin(); it != v.end(); ++it) {
        const Path child{where, &it.key(), 0, where->depth + 1};
        if (n.property_names && !Valid(*n.property_names, json(it.key()), where))
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
    for (const Node* sub : n.any_of) ok = ok || Valid(*sub, v, where);
    if (!ok) fail("matches none of the anyOf alternatives");
  }
  if (n.has_one_of) {
    int count = 0;
    for (const Node* sub : n.one_of) count += Valid(*sub, v, where) ? 1 : 0;
    if (count != 1) fail("matches " + std::to_string(count) + " of the oneOf alternatives, expected 1");
  }
  if (n.not_schema && Valid(*n.not_schema, v, where)) fail("matches a schema it must not");
  if (n.if_schema) {
    if (Valid(*n.if_schema, v, where)) {
      if (n.then_schema) Check(*n.then_schema, v, where, out);
    } else if (n.else_schema) {
      Check(*n.else_schema, v, where, out);
    }
  }
}

}  // namespace ckpt::ops::detail
