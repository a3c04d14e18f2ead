// format/wire.h: the binary encoding of the messages ranks send each other during a save:
// little-endian, integers as LEB128 varints (signed ones zigzagged), strings and lists
// length-prefixed, each message opening with a tag byte naming its kind.
//
// A WireReader never reads outside its bytes and never allocates more than the bytes it
// holds could describe: a truncated, overlong or garbage message is an Error (kComm)
// naming the message and the byte offset, never undefined behaviour.
// Threading: one writer or reader per thread; the reader does not own its bytes.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/error.h"

namespace ckpt::internal {

class WireWriter {
 public:
  explicit WireWriter(uint8_t tag) { out_.push_back(tag); }

  void U8(uint8_t v) { out_.push_back(v); }
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<uint8_t>(v | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<uint8_t>(v));
  }
  void Signed(int64_t v) {
    Varint((static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
  }
  void F64(double v) {
    uint64_t u = std::bit_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i, u >>= 8) out_.push_back(static_cast<uint8_t>(u));
  }
  void Str(std::string_view s) {
    Varint(s.size());
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void Ints(const std::vector<int64_t>& v) {
    Varint(v.size());
    for (int64_t x : v) Signed(x);
  }
  // A length-prefixed section: `fn` writes it into a writer of its own.
  template <typename Fn>
  void Section(Fn&& fn) {
    WireWriter inner;
    fn(inner);
    Str(std::string_view(reinterpret_cast<const char*>(inner.out_.data()), inner.out_.size()));
  }

  std::vector<uint8_t> Take() { return std::move(out_); }

 private:
  WireWriter() = default;  // a section: no tag
  std::vector<uint8_t> out_;
};

class WireReader {
 public:
  // `what` names the message in errors ("rank 3's description"). Checks the tag.
  WireReader(std::span<const uint8_t> bytes, std::string what, uint8_t tag) : bytes_(bytes), what_(std::move(what)) {
    if (U8() != tag) Fail("it is not a message of the expected kind");
  }

  uint8_t U8() {
    Need(1);
    return bytes_[pos_++];
  }
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      const uint8_t b = U8();
      if (shift == 63 && b > 1) Fail("a number overflows 64 bits");
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    Fail("a number overflows 64 bits");
  }
  int64_t Signed() {
    const uint64_t u = Varint();
    return static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1));
  }
  double F64() {
    Need(8);
    uint64_t u = 0;
    for (int i = 7; i >= 0; --i) u = (u << 8) | bytes_[pos_ + static_cast<std::size_t>(i)];
    pos_ += 8;
    return std::bit_cast<double>(u);
  }
  std::string_view StrView() {
    const uint64_t n = Varint();
    Need(n);
    std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::string Str() { return std::string(StrView()); }
  // A count of items that each take at least `min_bytes` of what is left: a count the
  // message cannot hold is refused before anything is allocated for it.
  std::size_t Count(std::size_t min_bytes = 1, uint64_t limit = UINT64_MAX) {
    const uint64_t n = Varint();
    if (n > limit) Fail("a count of " + std::to_string(n) + " exceeds the limit of " + std::to_string(limit));
    if (min_bytes > 0 && n > (bytes_.size() - pos_) / min_bytes) {
      Fail("a count of " + std::to_string(n) + " does not fit in the " + std::to_string(bytes_.size() - pos_) +
           " bytes left");
    }
    return static_cast<std::size_t>(n);
  }
  std::vector<int64_t> Ints(uint64_t limit) {
    std::vector<int64_t> v(Count(1, limit));
    for (int64_t& x : v) x = Signed();
    return v;
  }
  // The next length-prefixed section, as a reader of its own (no tag); or skips it.
  WireReader Section() {
    const std::string_view s = StrView();
    return WireReader(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()), what_);
  }
  void Skip() { StrView(); }

  // REQUIRES: the whole message has been read; trailing bytes are an error.
  void Finish() {
    if (pos_ != bytes_.size()) Fail(std::to_string(bytes_.size() - pos_) + " unexpected bytes at the end");
  }
  [[noreturn]] void Fail(const std::string& why) const {
    throw Error(ErrorCode::kComm, what_ + ": malformed message (" + why + ", at byte " + std::to_string(pos_) +
                                      " of " + std::to_string(bytes_.size()) + ")");
  }

 private:
  WireReader(std::span<const uint8_t> bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}
  void Need(uint64_t n) const {
    if (n > bytes_.size() - pos_) Fail("truncated: " + std::to_string(n) + " more bytes needed");
  }

  std::span<const uint8_t> bytes_;
  std::string what_;
  std::size_t pos_ = 0;
};

}  // namespace ckpt::internal
