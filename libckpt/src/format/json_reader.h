// format/json_reader.h: a pull reader over JSON text for the metadata.json parser (one
// pass, no document tree). Strings without escapes come back as views into the text.
// Nesting depth and duplicate keys are checked as the caller walks the document
// (FORMAT.md §8).
//
// The grammar is RFC 8259 exactly as nlohmann::json reads it, so that both accept the same
// documents: a UTF-8 byte order mark at the start is skipped; strings must be valid UTF-8
// with no control characters and paired surrogate escapes; integers that overflow 64 bits
// become doubles, doubles that overflow are errors.
#pragma once

#include <clocale>
#include <locale.h>

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <list>
#include <string>
#include <string_view>
#include <functional>
#include <vector>

#include "format/flat_index.h"

namespace ckpt::internal {

// A document that is not valid JSON, nests too deep or repeats a key. `syntax` problems
// carry no words (the caller explains them); the others are worded like the limits checker.
struct JsonError {
  bool syntax = true;
  std::size_t offset = 0;
  std::string what;
};

// The keys of one object, to refuse a duplicate (nlohmann::json would keep the last one).
class KeySet {
 public:
  // False if `key` is already in the set. `stable`: its bytes outlive the set.
  bool Insert(std::string_view key, bool stable) {
    if (keys_.empty()) {  // a few keys: compared one by one
      for (std::size_t i = 0; i < n_; ++i)
        if (few_[i] == key) return false;
      if (n_ < few_.size()) {
        few_[n_++] = stable ? key : owned_.emplace_back(key);
        return true;
      }
      for (std::string_view k : few_) Add(k);
    } else if (IndexLookup(slots_, Hash(key), [&](std::size_t p) { return keys_[p] == key; })) {
      return false;
    }
    Add(stable ? key : owned_.emplace_back(key));
    return true;
  }

 private:
  static std::size_t Hash(std::string_view key) { return std::hash<std::string_view>{}(key); }
  void Add(std::string_view key) {
    keys_.push_back(key);
    IndexInsert(slots_, count_, Hash(key), keys_.size() - 1);
  }

  std::array<std::string_view, 16> few_;
  std::size_t n_ = 0;                   // keys in few_, while keys_ is empty
  std::vector<std::string_view> keys_;  // all keys once there are more than few_ holds
  IndexSlots slots_;
  std::size_t count_ = 0;
  std::list<std::string> owned_;  // keys that had escapes
};

class JsonReader {
 public:
  enum class Next { kNull, kBool, kNumber, kString, kArray, kObject };
  // Number kinds as nlohmann::json tells them apart: kUint for an integer without a minus
  // sign, kInt for one with, kFloat for a fraction, an exponent or an integer that
  // overflows 64 bits.
  enum class NumberKind { kInt, kUint, kFloat };
  struct Number {
    NumberKind kind = NumberKind::kUint;
    int64_t i = 0;
    uint64_t u = 0;
    double d = 0;
    double AsDouble() const {
      return kind == NumberKind::kUint ? static_cast<double>(u)
             : kind == NumberKind::kInt ? static_cast<double>(i) : d;
    }
  };

  // `depth`: containers already open around `text` (when it is a piece of a document).
  JsonReader(std::string_view text, int max_depth, int depth = 0)
      : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()), max_depth_(max_depth), depth_(depth) {
    if (text.size() >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) p_ += 3;
  }

  std::size_t offset() const { return static_cast<std::size_t>(p_ - begin_); }
  const char* pos() const { return p_; }
  // Whether `s` (from ReadString or NextMember) points into the text, not a scratch buffer.
  bool InText(std::string_view s) const { return s.data() >= begin_ && s.data() <= end_; }

  // What the next value is. Throws on anything that cannot start a value.
  Next Peek() {
    SkipSpace();
    if (p_ == end_) Syntax();
    switch (*p_) {
      case '{': return Next::kObject;
      case '[': return Next::kArray;
      case '"': return Next::kString;
      case 't': case 'f': return Next::kBool;
      case 'n': return Next::kNull;
      case '-': case '0': case '1': case '2': case '3': case '4':
      case '5': case '6': case '7': case '8': case '9': return Next::kNumber;
      default: Syntax();
    }
  }

  void BeginObject() { Open('{'); }
  void BeginArray() { Open('['); }

  // The next member of the object whose '{' was read last at this level: its key (valid
  // until the next string is read) with the ':' after it consumed, or false at the '}'.
  // `first` starts true for each object. Checks the key against `keys`.
  bool NextMember(bool* first, KeySet& keys, std::string_view* key) {
    if (!NextItem(first, '}')) return false;
    if (p_ == end_ || *p_ != '"') Syntax();
    *key = ReadString();
    if (!keys.Insert(*key, InText(*key))) {
      throw JsonError{false, offset(), "duplicate key '" + std::string(*key) + "'"};
    }
    SkipSpace();
    if (p_ == end_ || *p_ != ':') Syntax();
    ++p_;
    return true;
  }

  // True if another element follows in the array whose '[' was read last at this level,
  // false at the ']'. `first` starts true for each array.
  bool NextElement(bool* first) { return NextItem(first, ']'); }

  // A string's contents, unescaped; valid until the next string is read.
  std::string_view ReadString() {
    SkipSpace();
    if (p_ == end_ || *p_ != '"') Syntax();
    const char* s = ++p_;
    while (p_ != end_) {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        const std::string_view v(s, static_cast<std::size_t>(p_ - s));
        ++p_;
        return v;
      }
      if (c == '\\') return ReadEscapedString(s);
      if (c < 0x20) Syntax();
      if (c < 0x80) {
        ++p_;
      } else {
        p_ += Utf8Length();
      }
    }
    Syntax();
  }

  Number ReadNumber() {
    SkipSpace();
    const char* s = p_;
    Number n;
    const bool negative = p_ != end_ && *p_ == '-';
    if (negative) ++p_;
    if (p_ == end_ || !IsDigit(*p_)) Syntax();
    uint64_t magnitude = 0;
    bool overflow = false;
    if (*p_ == '0') {
      ++p_;
    } else {
      while (p_ != end_ && IsDigit(*p_)) {
        overflow |= __builtin_mul_overflow(magnitude, uint64_t{10}, &magnitude);
        overflow |= __builtin_add_overflow(magnitude, static_cast<uint64_t>(*p_ - '0'), &magnitude);
        ++p_;
      }
    }
    bool integral = true;
    if (p_ != end_ && *p_ == '.') {
      ++p_;
      if (p_ == end_ || !IsDigit(*p_)) Syntax();
      while (p_ != end_ && IsDigit(*p_)) ++p_;
      integral = false;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (p_ == end_ || !IsDigit(*p_)) Syntax();
      while (p_ != end_ && IsDigit(*p_)) ++p_;
      integral = false;
    }
    if (integral && !overflow) {
      if (!negative) {
        n.kind = NumberKind::kUint;
        n.u = magnitude;
        return n;
      }
      if (magnitude <= uint64_t{1} << 63) {
        n.kind = NumberKind::kInt;
        n.i = magnitude == uint64_t{1} << 63 ? INT64_MIN : -static_cast<int64_t>(magnitude);
        return n;
      }
    }
    n.kind = NumberKind::kFloat;
    const auto r = std::from_chars(s, p_, n.d);
    if (r.ec == std::errc::result_out_of_range) {
      // Below the smallest double (strtod rounds to zero, as nlohmann::json did) or above
      // the largest (an error there too). strtod_l with the C locale: '.' as the point.
      static const locale_t c_locale = newlocale(LC_ALL_MASK, "C", locale_t{});
      const std::string copy(s, p_);
      n.d = strtod_l(copy.c_str(), nullptr, c_locale);
    } else if (r.ec != std::errc() || r.ptr != p_) {
      Syntax();
    }
    if (!std::isfinite(n.d)) Syntax();
    return n;
  }

  bool ReadBool() {
    SkipSpace();
    if (Literal("true")) return true;
    if (Literal("false")) return false;
    Syntax();
  }

  void ReadNull() {
    SkipSpace();
    if (!Literal("null")) Syntax();
  }

  // Reads and checks any value; returns its text.
  std::string_view Skip() {
    struct Frame {
      bool object;
      bool first = true;
      KeySet keys;
    };
    std::vector<Frame> open;
    SkipSpace();
    const char* start = p_;
    for (;;) {
      // A value begins here: a scalar, or a container whose first member we move into.
      switch (Peek()) {
        case Next::kObject:
          BeginObject();
          open.push_back(Frame{true, true, {}});
          break;
        case Next::kArray:
          BeginArray();
          open.push_back(Frame{false, true, {}});
          break;
        case Next::kString: ReadString(); break;
        case Next::kNumber: ReadNumber(); break;
        case Next::kBool: ReadBool(); break;
        case Next::kNull: ReadNull(); break;
      }
      // Close every container that ends here; stop where another value follows.
      for (;;) {
        if (open.empty()) return std::string_view(start, static_cast<std::size_t>(p_ - start));
        Frame& f = open.back();
        std::string_view key;
        if (f.object ? NextMember(&f.first, f.keys, &key) : NextElement(&f.first)) break;
        open.pop_back();
      }
    }
  }

  // After the document's value: nothing but white space may follow, up to the end or a
  // NUL byte (nlohmann::json's lexer takes a NUL outside a string for the end of input).
  void Finish() {
    SkipSpace();
    if (p_ != end_ && *p_ != '\0') Syntax();
  }

  [[noreturn]] void Syntax() const { throw JsonError{true, offset(), ""}; }

 private:
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }

  void SkipSpace() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  // Past the ',' before the next item of the open container, or past its `close` (false).
  bool NextItem(bool* first, char close) {
    SkipSpace();
    if (p_ == end_) Syntax();
    if (*p_ == close) {
      ++p_;
      --depth_;
      return false;
    }
    if (*first) {
      *first = false;
    } else {
      if (*p_ != ',') Syntax();
      ++p_;
      SkipSpace();
    }
    return true;
  }

  void Open(char bracket) {
    SkipSpace();
    if (p_ == end_ || *p_ != bracket) Syntax();
    ++p_;
    if (++depth_ > max_depth_) {
      throw JsonError{false, offset(), "JSON nesting deeper than " + std::to_string(max_depth_)};
    }
  }

  bool Literal(std::string_view word) {
    if (static_cast<std::size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word) return false;
    p_ += word.size();
    return true;
  }

  // Length of the well-formed UTF-8 sequence at p_ (RFC 3629: no overlong forms, no
  // surrogates, nothing above U+10FFFF); throws if there is none.
  std::size_t Utf8Length() const {
    const auto at = [&](std::size_t i) -> unsigned {
      return p_ + i < end_ ? static_cast<unsigned char>(p_[i]) : 0u;
    };
    const auto in = [](unsigned c, unsigned lo, unsigned hi) { return c >= lo && c <= hi; };
    const unsigned c = at(0);
    if (in(c, 0xC2, 0xDF) && in(at(1), 0x80, 0xBF)) return 2;
    if (c == 0xE0 && in(at(1), 0xA0, 0xBF) && in(at(2), 0x80, 0xBF)) return 3;
    if ((in(c, 0xE1, 0xEC) || in(c, 0xEE, 0xEF)) && in(at(1), 0x80, 0xBF) && in(at(2), 0x80, 0xBF)) return 3;
    if (c == 0xED && in(at(1), 0x80, 0x9F) && in(at(2), 0x80, 0xBF)) return 3;
    if (c == 0xF0 && in(at(1), 0x90, 0xBF) && in(at(2), 0x80, 0xBF) && in(at(3), 0x80, 0xBF)) return 4;
    if (in(c, 0xF1, 0xF3) && in(at(1), 0x80, 0xBF) && in(at(2), 0x80, 0xBF) && in(at(3), 0x80, 0xBF)) return 4;
    if (c == 0xF4 && in(at(1), 0x80, 0x8F) && in(at(2), 0x80, 0xBF) && in(at(3), 0x80, 0xBF)) return 4;
    Syntax();
  }

  unsigned Hex4() {
    if (end_ - p_ < 4) Syntax();
    unsigned v = 0;
    for (int i = 0; i < 4; ++i, ++p_) {
      const char c = *p_;
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else Syntax();
    }
    return v;
  }

  // The slow path of ReadString, from the first backslash on; `s` is after the quote.
  std::string_view ReadEscapedString(const char* s) {
    scratch_.assign(s, p_);
    while (p_ != end_) {
      const auto c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        ++p_;
        return scratch_;
      }
      if (c < 0x20) Syntax();
      if (c >= 0x80) {
        const std::size_t n = Utf8Length();
        scratch_.append(p_, n);
        p_ += n;
        continue;
      }
      ++p_;
      if (c != '\\') {
        scratch_ += static_cast<char>(c);
        continue;
      }
      if (p_ == end_) Syntax();
      const char e = *p_++;
      switch (e) {
        case '"': scratch_ += '"'; break;
        case '\\': scratch_ += '\\'; break;
        case '/': scratch_ += '/'; break;
        case 'b': scratch_ += '\b'; break;
        case 'f': scratch_ += '\f'; break;
        case 'n': scratch_ += '\n'; break;
        case 'r': scratch_ += '\r'; break;
        case 't': scratch_ += '\t'; break;
        case 'u': {
          unsigned cp = Hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) Syntax();  // a low surrogate alone
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') Syntax();
            p_ += 2;
            const unsigned low = Hex4();
            if (low < 0xDC00 || low > 0xDFFF) Syntax();
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp);
          break;
        }
        default: Syntax();
      }
    }
    Syntax();
  }

  void AppendUtf8(unsigned cp) {
    if (cp < 0x80) {
      scratch_ += static_cast<char>(cp);
    } else if (cp < 0x800) {
      scratch_ += static_cast<char>(0xC0 | (cp >> 6));
      scratch_ += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      scratch_ += static_cast<char>(0xE0 | (cp >> 12));
      scratch_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      scratch_ += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      scratch_ += static_cast<char>(0xF0 | (cp >> 18));
      scratch_ += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      scratch_ += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      scratch_ += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  int max_depth_;
  int depth_;
  std::string scratch_;
};

}  // namespace ckpt::internal
