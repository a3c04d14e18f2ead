// format/errors.cc: names of error codes.
#include "ckpt/error.h"

namespace ckpt {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kAlreadyExists: return "already exists";
    case ErrorCode::kIO: return "I/O error";
    case ErrorCode::kCorrupt: return "corrupt";
    case ErrorCode::kMismatch: return "mismatch";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kComm: return "communication error";
    case ErrorCode::kInternal: return "internal error";
    case ErrorCode::kCancelled: return "cancelled";
    case ErrorCode::kChanged: return "changed while reading";
  }
  return "unknown";
}

}  // namespace ckpt
