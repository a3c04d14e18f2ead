// format/scalar.h: a scalar entry's value (FORMAT.md §3.2, §9.5) and a JSON entry's value as
// metadata.json holds them: one writer and one reader of each.
#pragma once

#include <string>
#include <string_view>

#include "ckpt/tensor.h"

namespace ckpt::format {

// The JSON text of a scalar: a bool as true/false, an integer dtype as an integer, a
// floating one as nlohmann writes a double. kInvalidArgument for a non-finite float.
std::string ScalarText(const Scalar& s);
// The scalar of `dtype` that `text` (as metadata.json holds it, checked by the parser) is.
Scalar ScalarFromText(DType dtype, const std::string& text);

// A JSON entry's value, normalised as dump() writes it; kInvalidArgument naming `key` when
// it is not JSON.
std::string JsonEntryText(const std::string& key, std::string_view text);

}  // namespace ckpt::format
