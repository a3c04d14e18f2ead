// format/scalar.cc
#include "format/scalar.h"

#include <cmath>

#include "ckpt/error.h"
#include "format/json_value.h"

namespace ckpt::format {

std::string ScalarText(const Scalar& s) {
  if (s.dtype == DType::kBool) return s.AsInt() ? "true" : "false";
  if (const auto* i = std::get_if<int64_t>(&s.value)) {
    if (IsFloating(s.dtype)) return Json(static_cast<double>(*i)).dump();
    return Json(*i).dump();
  }
  const double d = std::get<double>(s.value);
  if (!IsFloating(s.dtype)) return Json(static_cast<int64_t>(d)).dump();
  if (!std::isfinite(d)) {
    throw Error(ErrorCode::kInvalidArgument, "scalar value " + std::to_string(d) + " is not finite; JSON cannot hold it");
  }
  return Json(d).dump();
}

Scalar ScalarFromText(DType dtype, const std::string& text) {
  const Json v = Json::parse(text);
  if (v.is_boolean()) return Scalar::Int(v.get<bool>() ? 1 : 0, dtype);
  if (IsFloating(dtype)) return Scalar::Float(v.get<double>(), dtype);
  if (v.is_number_integer()) return Scalar::Int(v.get<int64_t>(), dtype);
  return Scalar::Int(static_cast<int64_t>(v.get<double>()), dtype);
}

std::string JsonEntryText(const std::string& key, std::string_view text) {
  try {
    return Json::parse(text).dump();
  } catch (const Json::exception& ex) {
    throw Error(ErrorCode::kInvalidArgument, "key '" + key + "': invalid JSON value: " + ex.what());
  }
}

}  // namespace ckpt::format
