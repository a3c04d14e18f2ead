// ckpt/verify.h: checks a checkpoint (a directory or s3://) as a whole and reports every
// problem found, each naming its file and key, instead of failing at the first:
//   metadata   metadata.json is a regular file, parses, and its digest matches (v2)
//   files      every listed file exists, is a regular file of the recorded size, is HDF5
//   index      (v2) every shard index hashes to the digest metadata.json records and holds
//              exactly the chunks the layouts place in its file; each entry's stored_bytes
//              is its records' sum
//   tiling     every tensor's chunks tile its shape: no gap, overlap or out-of-bounds chunk
//   datasets   every chunk's dataset exists with the dtype and extent the metadata says, and
//              (v2) its HDF5 header agrees with the index on where its data lies; no object
//              in a shard that no record names
//   checksums  every chunk's checksum and (v2) block digests, recomputed from the data
//              (skipped with `quick`)
//   finite     no NaN/Inf in floating tensors (with `check_finite`)
// A directory is pinned (FORMAT.md §2.7): the verdict is of one checkpoint, never a mix.
// On object storage ("ranged" mode) what needs no local file is checked: metadata.json,
// each object's size and index, the tiling and, unless `quick`, every chunk's checksum and
// block digests by ranged GETs; not the HDF5 headers. A checkpoint ranged reads cannot check
// (format v1, compressed chunks, saved before files[].index_offset), and any with
// `check_finite`, is checked whole on a downloaded copy ("downloaded" mode: a cache
// directory under options.s3.staging_dir bounded by options.s3.cache_max_bytes, removed
// after; problems name the s3:// URL).
//
// Thread-safety: VerifyCheckpoint is reentrant; it reads data on threads of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "ckpt/export.h"
#include "ckpt/metadata.h"

namespace ckpt {

struct VerifyProblem {
  std::string check;  // "metadata", "files", "index", "tiling", "datasets", "checksums", "finite", or a caller's
  std::string file;   // may be empty
  std::string key;    // may be empty
  std::string message;
};

struct VerifyReport {
  std::string path;
  std::vector<VerifyProblem> problems;
  std::size_t keys = 0, chunks = 0, files = 0;
  int format_version = 0;  // of the metadata.json read (0: not read)
  uint64_t bytes_read = 0;
  double seconds = 0;
  bool quick = false;
  std::string mode;  // "" (a local checkpoint: every check), "ranged" or "downloaded" (s3://, see above)
  bool ok() const { return problems.empty(); }
};

struct CheckOptions {
  bool quick = false;         // metadata, files, index, tiling and datasets only: no data read
  bool check_finite = false;  // a problem for NaN / Inf in floating tensors (local only)
  int threads = 4;            // data-reading threads, at most (never more than the cores)
  // Format v2: the shard indexes are read and checked a group of files at a time, each
  // group holding about this many chunks (a file with more is a group of its own), so
  // memory is bounded by a group, not by the checkpoint.
  int64_t group_chunks = int64_t{1} << 15;
  // Called now and then on the calling thread with the data bytes hashed so far and the
  // bytes to hash, of the files being checked now (v2 checks its groups one after another,
  // each counted from 0); last with done == total.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Checks of metadata.json beyond the library's (a JSON Schema): called once with its text
  // as read from the pinned checkpoint, on a thread of its own beside the other checks;
  // its problems are reported first. An exception from it propagates.
  std::function<std::vector<VerifyProblem>(const std::string& text)> check_text;
  // Checks of the parsed metadata beyond the library's (keys, dtypes and shapes against a
  // reference): called after the other checks; its problems are reported last.
  std::function<std::vector<VerifyProblem>(const Metadata& metadata)> check_metadata;
  // For an s3:// path: how to reach the store (unset fields: the AWS environment, as
  // LoadOptions::s3), and for the downloaded mode its staging_dir and cache_max_bytes.
  ObjectStoreOptions s3;
};

// Problems in the checkpoint are reported, not thrown. Throws kNotFound when nothing is at
// `path`, kIO (or, on s3://, a failed request) when it cannot be read, kChanged where the
// checkpoint was replaced while it was checked and problems were found (they may be only
// its files removed meanwhile: run again), kInvalidArgument for an s3:// checkpoint that
// only a download can check and whose files are larger than the download cache's bound.
CKPT_API VerifyReport VerifyCheckpoint(const std::filesystem::path& path, const CheckOptions& options);

}  // namespace ckpt
