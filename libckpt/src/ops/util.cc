// ops/util.cc: see util.h.
#include "ops/util.h"

#include <unistd.h>

#include <bitset>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <fstream>
#include <limits>
#include <system_error>

#include "ckpt/files.h"

namespace ckpt::ops::detail {

namespace {

// One element of a glob: '*', or a set of bytes that matches one byte.
struct GlobElement {
  bool star = false;
  std::bitset<256> set;
};

// "[...]" at pattern[i] (i just past '['): the set, and i moved past its ']'; false (i
// unchanged) when no ']' closes it, so that the '[' is a literal, as fnmatch reads it.
// `never`: the bracket holds what fnmatch cannot match at all (an unknown [:class:], an
// unterminated or multi-character [.x.] or [=x=]).
bool ParseBracket(std::string_view pattern, std::size_t& i, std::bitset<256>& out, bool& never) {
  std::size_t p = i;
  bool negate = false;
  if (p < pattern.size() && (pattern[p] == '!' || pattern[p] == '^')) negate = true, ++p;
  std::bitset<256> set;
  bool first = true;
  for (;;) {
    if (p >= pattern.size()) return false;
    unsigned char c = static_cast<unsigned char>(pattern[p]);
    if (c == ']' && !first) break;
    first = false;
    if (c == '[' && p + 1 < pattern.size() && (pattern[p + 1] == '.' || pattern[p + 1] == '=')) {  // [.x.] [=x=]
      const char kind = pattern[p + 1];
      const std::size_t close = pattern.find(std::string{kind, ']'}, p + 2);
      if (close == std::string_view::npos || close != p + 3) {
        never = true;
        return true;  // consumed as far as fnmatch reads: the rest cannot match either
      }
      set.set(static_cast<unsigned char>(pattern[p + 2]));
      p = close + 2;
      continue;
    }
    if (c == '[' && p + 1 < pattern.size() && pattern[p + 1] == ':') {  // [:alpha:]
      const std::size_t close = pattern.find(":]", p + 2);
      if (close != std::string_view::npos) {
        const std::string_view name = pattern.substr(p + 2, close - p - 2);
        int (*is)(int) = name == "alpha" ? ::isalpha : name == "digit" ? ::isdigit : name == "alnum" ? ::isalnum
                       : name == "upper" ? ::isupper : name == "lower" ? ::islower : name == "space" ? ::isspace
                       : name == "punct" ? ::ispunct : name == "xdigit" ? ::isxdigit : name == "blank" ? ::isblank
                       : name == "cntrl" ? ::iscntrl : name == "print" ? ::isprint : name == "graph" ? ::isgraph
                       : nullptr;
        if (!is) {  // fnmatch: an unknown class makes the pattern fail to match
          never = true;
          return true;
        }
        for (int b = 0; b < 128; ++b)
          if (is(b)) set.set(static_cast<std::size_t>(b));
        p = close + 2;
        continue;
      }
    }
    if (c == '\\' && p + 1 < pattern.size()) c = static_cast<unsigned char>(pattern[++p]);
    ++p;
    unsigned char hi = c;
    if (p + 1 < pattern.size() && pattern[p] == '-' && pattern[p + 1] != ']') {
      hi = static_cast<unsigned char>(pattern[p + 1]);
      p += 2;
      if (hi == '\\' && p < pattern.size()) hi = static_cast<unsigned char>(pattern[p++]);
    }
    for (unsigned b = c; b <= hi; ++b) set.set(b);
  }
  out = negate ? ~set : set;
  i = p + 1;
  return true;
}

}  // namespace

// fnmatch(3) with no flags, in the C locale, without its recursion: the pattern is read
// into one-byte sets and '*'s, then matched greedily, going back only to the last '*'
// (enough, since every other element reads exactly one byte): time O(pattern x text)
// at worst, no recursion and no allocation proportional to the text.
bool GlobMatch(std::string_view pattern, std::string_view text) {
  std::vector<GlobElement> elems;
  bool never = false;
  for (std::size_t i = 0; i < pattern.size() && !never;) {
    GlobElement e;
    const char c = pattern[i++];
    if (c == '*') {
      if (!elems.empty() && elems.back().star) continue;
      e.star = true;
    } else if (c == '?') {
      e.set.set();
    } else if (c == '[' && ParseBracket(pattern, i, e.set, never)) {
    } else if (c == '\\' && i < pattern.size()) {
      e.set.set(static_cast<unsigned char>(pattern[i++]));
    } else {
      e.set.set(static_cast<unsigned char>(c));
    }
    elems.push_back(e);
  }
  if (never) return false;
  std::size_t p = 0, t = 0, star = SIZE_MAX, mark = 0;
  while (t < text.size()) {
    if (p < elems.size() && elems[p].star) {
      star = p++;
      mark = t;
    } else if (p < elems.size() && elems[p].set.test(static_cast<unsigned char>(text[t]))) {
      ++p, ++t;
    } else if (star != SIZE_MAX) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < elems.size() && elems[p].star) ++p;
  return p == elems.size();
}

bool MatchesAny(const std::vector<std::string>& patterns, std::string_view text) {
  for (const auto& p : patterns)
    if (GlobMatch(p, text)) return true;
  return false;
}

std::string FormatBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) bytes /= 1024, ++u;
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.2f %s", bytes, kUnits[u]);
  return buf;
}

std::string FormatShape(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

uint64_t TensorBytes(const Shape& shape, std::size_t itemsize, std::string_view what) {
  uint64_t n = itemsize;
  for (int64_t s : shape) {
    if (s < 0)
      throw Error(ErrorCode::kCorrupt,
                  std::string(what) + ": negative extent in shape " + FormatShape(shape));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(s), &n) || n > (uint64_t{1} << 62))
      throw Error(ErrorCode::kCorrupt, std::string(what) + ": shape " + FormatShape(shape) +
                                           " is absurd: its byte size overflows 64 bits");
  }
  return n;
}

Progress::Progress(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total), active_(enabled && ::isatty(2)) {
  start_ = last_ = std::chrono::steady_clock::now();
}

Progress::~Progress() { Done(); }

void Progress::Add(uint64_t bytes) {
  done_ += bytes;
  if (active_) Draw(false);
}

void Progress::Draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  const double secs = std::chrono::duration<double>(now - start_).count();
  const double rate = secs > 0 ? static_cast<double>(done_) / secs : 0;
  std::string eta = "--:--";
  if (rate > 0 && total_ >= done_) {
    const auto left = static_cast<long>(static_cast<double>(total_ - done_) / rate);
    char b[32];
    std::snprintf(b, sizeof b, "%ld:%02ld", left / 60, left % 60);
    eta = b;
  }
  std::fprintf(stderr, "\r%s %s / %s  %s/s  ETA %s\033[K", label_.c_str(),
               FormatBytes(static_cast<double>(done_)).c_str(),
               FormatBytes(static_cast<double>(total_)).c_str(), FormatBytes(rate).c_str(),
               eta.c_str());
  std::fflush(stderr);
}

void Progress::Done() {
  if (!active_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  active_ = false;
}

std::string ReadFileText(const std::filesystem::path& path, uint64_t max_bytes) {
  return files::ReadSmallFile(path, max_bytes, /*follow_symlinks=*/true);
}

std::vector<std::jthread> StartThreads(std::size_t count, const std::function<void(std::size_t)>& fn) {
  std::vector<std::jthread> started;
  started.reserve(count);
  for (std::size_t i = 0; i < count; ++i) {
    try {
      started.emplace_back(fn, i);
    } catch (const std::system_error&) {
      break;  // no more threads now: run on those started
    }
  }
  return started;
}

}  // namespace ckpt::ops::detail
