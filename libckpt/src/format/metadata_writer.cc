// format/metadata_writer.cc: Metadata -> metadata.json (FORMAT.md §3), written by hand at
// the top level so that entries keep their order and each takes one line (a 100,000-key
// checkpoint stays greppable and linear to write); each value is written as nlohmann's
// dump() writes it (format/json_text.h). Version 2 lists each file's index digest,
// describes tensors by layout, and ends with the document's digest (§3.6).
#include <cmath>
#include <iterator>

#include "ckpt/error.h"
#include "ckpt/metadata.h"
#include "format/checksum.h"
#include "format/chunk_record.h"
#include "format/compression.h"
#include "format/json_text.h"
#include "format/json_value.h"
#include "format/layout_record.h"
#include "format/metadata_model.h"
#include "format/names.h"
#include "format/save_timings.h"
#include "format/stats.h"

namespace ckpt {
namespace {

using format::FileIndex;
using format::OrderedJson;
using internal::JsonObjectText;
namespace n = names;


void Field(std::string& out, const char* key, const OrderedJson& value) {
  out += "  " + OrderedJson(key).dump() + ": " + value.dump() + ",\n";
}

// The members every version writes first, in this order.
std::string Head(const Metadata& m) {
  std::string out = "{\n";
  Field(out, n::kFormat, n::kFormatName);
  Field(out, n::kFormatVersion, m.format_version);
  Field(out, n::kStateDictType, StateDictTypeName(m.state_dict_type));
  Field(out, n::kWorldSize, m.world_size);
  Field(out, n::kLibraryVersion, m.library_version);
  Field(out, n::kCreated, m.created);
  Field(out, n::kMesh, OrderedJson::parse(m.mesh.empty() ? "null" : m.mesh));
  Field(out, n::kUser, OrderedJson::parse(m.user.empty() ? "{}" : m.user));
  if (m.save_timings && m.format_version >= 2) Field(out, n::kSaveTimings, format::TimingsJson(*m.save_timings));
  return out;
}

// A tensor entry's layout, stored bytes, compression and stats (version 2): resolved
// chunks (a save, a writer) have theirs derived here.
void TensorMembersV2(JsonObjectText& j, const EntryMeta& e, const FileIndex& file_index) {
  EntryMeta derived;
  const EntryMeta* from = &e;
  if (!e.chunks.empty()) {
    derived.kind = e.kind;
    derived.dtype = e.dtype;
    derived.shape = e.shape;
    format::DeriveLayout(derived, e.chunks, file_index);  // e's chunks read in place, not copied
    from = &derived;
  }
  j.Name(n::kLayout);
  format::WriteLayout(from->layout, j.out());
  j.Name(n::kStoredBytes);
  j.Integer(from->stored_bytes);
  format::WriteCompression(j, from->compression);
  if (from->stats) format::WriteStats(j, *from->stats);
}

// A bytes entry's file number and stored bytes (version 2).
void BytesMembersV2(JsonObjectText& j, const std::string& key, const EntryMeta& e, const FileIndex& file_index) {
  int32_t file = e.layout.pieces.empty() ? -1 : e.layout.pieces[0].file;
  if (!e.chunks.empty()) {
    const auto it = file_index.find(e.chunks[0].file);
    file = it == file_index.end() ? -1 : it->second;
  }
  if (file < 0) throw Error(ErrorCode::kInvalidArgument, "metadata: bytes entry '" + key + "' names no listed file");
  j.Name(n::kFile);
  j.Integer(file);
  j.Name(n::kStoredBytes);
  j.Integer(e.chunks.empty() ? e.stored_bytes : e.chunks[0].stored_bytes);
}

// One entry (FORMAT.md §3.2): version 1 lists a tensor's chunks, version 2 its layout.
void EntryText(const std::string& key, const EntryMeta& e, bool v2, const FileIndex& file_index, std::string& out) {
  JsonObjectText j(out);
  j.Name(n::kType);
  j.String(EntryKindName(e.kind));
  if (e.kind == EntryKind::kTensor || e.kind == EntryKind::kScalar) {
    j.Name(n::kDType);
    j.String(DTypeName(e.dtype));
  }
  switch (e.kind) {
    case EntryKind::kTensor:
      j.Name(n::kShape);
      j.Integers(e.shape);
      if (v2) {
        TensorMembersV2(j, e, file_index);
        break;
      }
      j.Name(n::kChunks);
      out += '[';
      for (std::size_t i = 0; i < e.chunks.size(); ++i) {
        if (i) out += ',';
        JsonObjectText c(out);
        format::WriteChunkMembers(c, e.chunks[i], format::ChunkForm::kMetadata, /*with_box=*/true);
        c.Close();
      }
      out += ']';
      break;
    case EntryKind::kBytes:
      j.Name(n::kSize);
      j.Integer(e.size);
      if (v2) {
        BytesMembersV2(j, key, e, file_index);
      } else {
        format::WriteChunkMembers(j, e.chunks.at(0), format::ChunkForm::kMetadata, /*with_box=*/false);
      }
      break;
    case EntryKind::kScalar:
    case EntryKind::kJson:
      j.Name(n::kValue);
      j.Raw(OrderedJson::parse(e.value).dump());
      break;
  }
  j.Close();
}

std::string Serialize(const Metadata& m) {
  const bool v2 = m.format_version >= 2;
  std::string out = Head(m);
  FileIndex file_index;
  out += "  \"" + std::string(n::kFiles) + "\": [";
  for (std::size_t i = 0; i < m.files.size(); ++i) {
    const FileMeta& f = m.files[i];
    file_index.emplace(f.name, static_cast<int32_t>(i));
    out += i ? ",\n    " : "\n    ";
    JsonObjectText j(out);
    j.Name(n::kName);
    j.String(f.name);
    j.Name(n::kRank);
    j.Integer(f.rank);
    j.Name(n::kBytes);
    j.Integer(f.bytes);
    if (v2) {
      j.Name(n::kIndex);
      j.String(f.index);
      if (f.index_bytes > 0) {
        j.Name(n::kIndexOffset);
        j.Integer(f.index_offset);
        j.Name(n::kIndexBytes);
        j.Integer(f.index_bytes);
      }
    }
    j.Close();
  }
  out += m.files.empty() ? "],\n" : "\n  ],\n";
  out += "  \"" + std::string(n::kEntries) + "\": {";
  bool first = true;
  for (const auto& [key, e] : m.entries) {
    out += first ? "\n    " : ",\n    ";
    JsonObjectText::String(out, key);
    out += ": ";
    EntryText(key, e, v2, file_index, out);
    first = false;
  }
  if (!v2) return out + (first ? "}\n}\n" : "\n  }\n}\n");
  out += first ? "},\n  " : "\n  },\n  ";
  const std::string digest = format::DigestOf(out);
  out += "\"" + std::string(n::kDigest) + "\": \"" + digest + "\"}\n";  // FORMAT.md §3.6: exactly this ending
  return out;
}

}  // namespace

std::string SerializeMetadata(const Metadata& m) { return Serialize(m); }

}  // namespace ckpt
