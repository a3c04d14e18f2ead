// Editing a written checkpoint as a buggy writer or an attacker would (format v2, FORMAT.md
// §3.6 and §5.5): metadata.json rewritten with its digest recomputed (or deliberately left
// stale), and a shard's ckpt_shard_index attribute rewritten through HDF5 with its digest in
// metadata.json's files[i].index updated. A lie made consistent this way gets past the digests,
// so what catches it is the check behind them (tiling, dataset shape, checksum, ...).
// The C++ twin of tests/pylib/ckpt_edit.py. Tests that include it link hdf5 and nlohmann_json.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "format/names.h"
#include "storage/digest.h"
#include "storage/h5.h"

namespace ckpt_test {

enum class Digests { kRecompute, kKeepStale };

inline std::string ReadText(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string DigestOf(const std::string& text) {
  return ckpt::storage::FormatChecksum(ckpt::storage::HashBlock(text.data(), text.size()));
}

// metadata.json parsed (its "digest" member included).
inline nlohmann::json ReadMetaJson(const std::filesystem::path& dir) {
  return nlohmann::json::parse(ReadText(dir / "metadata.json"));
}

// A metadata.json text (ending with its "digest" member) with that digest recomputed over
// every byte before the member's opening quote: any edit of the text made consistent.
inline std::string Redigest(const std::string& text) {
  const auto at = text.rfind("\"digest\"");
  if (at == std::string::npos) throw std::runtime_error("ckpt_edit: no \"digest\" member");
  const std::string body = text.substr(0, at);
  return body + "\"digest\": \"" + DigestOf(body) + "\"}\n";
}

inline void WriteMetaText(const std::filesystem::path& dir, const std::string& text) {
  std::ofstream(dir / "metadata.json", std::ios::binary | std::ios::trunc) << text;
}

// Writes `m` as metadata.json, the "digest" member last: recomputed over the text before
// its opening quote, or the one `m` carries (so that any change is a digest mismatch).
inline void WriteMetaJson(const std::filesystem::path& dir, nlohmann::json m, Digests d = Digests::kRecompute) {
  const std::string stale = m.contains("digest") ? m["digest"].get<std::string>() : "";
  m.erase("digest");
  std::string body = m.dump(1);  // "{\n ... \n}"
  body.resize(body.rfind('}'));
  while (!body.empty() && (body.back() == '\n' || body.back() == ' ')) body.pop_back();
  const std::string text = body + (m.empty() ? "\n " : ",\n ") + "\"digest\": \"" + stale + "\"}\n";
  WriteMetaText(dir, d == Digests::kRecompute ? Redigest(text) : text);
}

// The shard's index attribute: its text exactly, or parsed.
inline std::string ReadIndexText(const std::filesystem::path& shard) {
  ckpt::h5::Init();
  auto f = ckpt::h5::File(H5Fopen(shard.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f) throw std::runtime_error("ckpt_edit: cannot open " + shard.string());
  return ckpt::h5::ReadStringAttr(f.get(), ckpt::names::kShardIndexAttr);
}
inline nlohmann::json ReadIndexJson(const std::filesystem::path& shard) {
  return nlohmann::json::parse(ReadIndexText(shard));
}

// The position of file `name` in metadata.json's files.
inline int FileIndexOf(const std::filesystem::path& dir, const std::string& name) {
  const nlohmann::json m = ReadMetaJson(dir);
  for (std::size_t i = 0; i < m["files"].size(); ++i)
    if (m["files"][i]["name"] == name) return static_cast<int>(i);
  throw std::runtime_error("ckpt_edit: no file " + name);
}

// Replaces the index of files[file] by `text` (exact bytes) and, with kRecompute, records
// its digest in metadata.json (whose own digest is then recomputed too).
inline void WriteIndexText(const std::filesystem::path& dir, int file, const std::string& text,
                           Digests d = Digests::kRecompute) {
  nlohmann::json m = ReadMetaJson(dir);
  const std::filesystem::path shard = dir / m["files"][file]["name"].get<std::string>();
  ckpt::h5::Init();
  {
    auto f = ckpt::h5::File(H5Fopen(shard.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    if (!f) throw std::runtime_error("ckpt_edit: cannot open " + shard.string());
    if (H5Adelete(f.get(), ckpt::names::kShardIndexAttr) < 0) throw std::runtime_error("ckpt_edit: no index");
    ckpt::h5::WriteStringAttr(f.get(), ckpt::names::kShardIndexAttr, text);
    if (f.Close() < 0) throw std::runtime_error("ckpt_edit: cannot close " + shard.string());
  }
  if (d == Digests::kKeepStale) return;
  m["files"][file]["index"] = DigestOf(text);
  m["files"][file]["bytes"] = std::filesystem::file_size(shard);
  WriteMetaJson(dir, m);
}

// After something else rewrote the index of files[file] (tests/tools/hostile_shard.h):
// metadata.json records the digest of what the shard now holds.
inline void RecordIndexDigest(const std::filesystem::path& dir, int file) {
  const nlohmann::json m = ReadMetaJson(dir);
  WriteIndexText(dir, file, ReadIndexText(dir / m["files"][file]["name"].get<std::string>()));
}

inline void WriteIndexJson(const std::filesystem::path& dir, int file, const nlohmann::json& index,
                           Digests d = Digests::kRecompute) {
  WriteIndexText(dir, file, index.dump(), d);
}

}  // namespace ckpt_test
