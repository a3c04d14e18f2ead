// format/metadata_internal.h: pieces of the metadata.json codec that the save protocol
// reuses to send chunk descriptions between ranks.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ckpt/metadata.h"

namespace ckpt::internal {

// One chunk as the JSON object metadata.json uses (FORMAT.md §3), and back.
std::string ChunkToJson(const ChunkMeta& chunk, bool tensor_chunk);
ChunkMeta ChunkFromJson(const nlohmann::json& chunk, bool tensor_chunk);

}  // namespace ckpt::internal
