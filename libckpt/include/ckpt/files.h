// ckpt/files.h: the file steps of the commit protocol (FORMAT.md §2), for programs that keep
// files of their own beside checkpoints: a training runtime's `latest` pointer, its rotation.
// Every step goes through libckpt's file-system seam, so it gets the same guarantees (and the
// same fault injection in tests) as a checkpoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "ckpt/export.h"

namespace ckpt::files {

// Creates `dir` and its missing parents; kIO naming the directory that could not be made.
CKPT_API void MakeDirs(const std::filesystem::path& dir);
// Reads a small regular file (never a FIFO, device or symbolic link), refusing more than
// `max_bytes`; kNotFound if it is absent.
CKPT_API std::string ReadSmallFile(const std::filesystem::path& path, uint64_t max_bytes);
// Writes a small file atomically: staged beside `target`, fsynced, renamed into place, the
// parent fsynced. A reader sees the old content or the new, never a part.
CKPT_API void CommitFile(const std::filesystem::path& target, std::string_view data);
// Removes the checkpoint at `dir`: un-commits it first (renamed away, parent fsynced), then
// deletes its files, so no moment shows a `dir` that looks committed but has lost files.
CKPT_API void RemoveCheckpoint(const std::filesystem::path& dir);
// Removes in `parent` what killed saves left beside every target whose name satisfies
// `is_target`, unless another writer is at work in `parent` now. Returns how many it removed.
CKPT_API std::size_t CleanLeftovers(const std::filesystem::path& parent,
                                    const std::function<bool(std::string_view)>& is_target);

}  // namespace ckpt::files
