// ckpt/error.h: the one error type of libckpt.
//
// Every fallible call throws ckpt::Error. Collective calls (marked COLLECTIVE) agree on
// the outcome before returning, so either every rank returns or every rank throws: an
// error on one rank never leaves the others waiting in a collective.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "ckpt/export.h"

namespace ckpt {

enum class ErrorCode {
  kInvalidArgument,  // the caller asked for something impossible (bad shape, overlapping claims)
  kNotFound,         // a checkpoint, file or key that is not there
  kAlreadyExists,    // saving over a committed checkpoint without SaveOptions::overwrite
  kIO,               // the operating system or HDF5 failed to read or write
  kCorrupt,          // data or metadata that contradicts itself (checksum, bounds, tiling)
  kMismatch,         // checkpoint and target disagree (keys, dtypes, shapes, state-dict types)
  kUnsupported,      // a newer format version, an unknown dtype or filter
  kComm,             // a collective failed or another rank failed
  kInternal,
  kCancelled,        // SaveHandle::Cancel stopped the save before it committed
  kChanged,          // the checkpoint was replaced or removed while it was being read (no
                     // damage: read it again; FORMAT.md §2.7)
};

CKPT_API std::string_view ErrorCodeName(ErrorCode code);

class CKPT_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace ckpt
