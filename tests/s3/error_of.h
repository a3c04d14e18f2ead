// The message (and code) of the ckpt::Error that `f` throws, or "(no error)".
#pragma once

#include <functional>
#include <string>

#include "ckpt/error.h"

namespace s3_test {

inline std::string ErrorOf(const std::function<void()>& f, ckpt::ErrorCode* code = nullptr) {
  try {
    f();
  } catch (const ckpt::Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "(no error)";
}

}  // namespace s3_test
