// format/metadata_model.h: what metadata.json's reader and writer share of the model.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/metadata.h"

namespace ckpt::format {

// A file's name -> its position in 'files'.
using FileIndex = std::unordered_map<std::string, int32_t>;

// The layout of `chunks` (a v1 entry's, or a save's resolved ones) into m, and the
// aggregate of their stats and stored bytes.
void DeriveLayout(EntryMeta& m, const std::vector<ChunkMeta>& chunks, const FileIndex& files);

// Where a problem is: the file, and the entry's key when in an entry.
struct Ctx {
  std::string_view source;
  const std::string* key = nullptr;

  std::string Where() const { return key ? "entry '" + *key + "'" : std::string(); }
  Error Problem(const std::string& what) const {
    const std::string where = Where();
    return Error(ErrorCode::kCorrupt, std::string(source) + ": " + (where.empty() ? what : where + ": " + what));
  }
  [[noreturn]] void Fail(const std::string& what) const { throw Problem(what); }
  [[noreturn]] void Unsupported(const std::string& what) const {
    throw Error(ErrorCode::kUnsupported, std::string(source) + ": " + Where() + ": " + what);
  }
};

// "[d0, d1, ...]" for messages.
inline std::string DimsText(const Shape& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Ranks and world sizes beyond this are corruption, not a job (FORMAT.md §8).
inline constexpr int64_t kMaxRanks = int64_t{1} << 30;

}  // namespace ckpt::format
