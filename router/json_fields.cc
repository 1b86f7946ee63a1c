#include "router/json_fields.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "router/api_error.h"

namespace tandem::router {
namespace {

const nlohmann::json* Find(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status WrongType(const char* key, const char* what) {
  return InvalidParam(key, absl::StrCat("'", key, "' must be ", what));
}

}  // namespace

bool IsIntegral(const nlohmann::json& value) {
  if (value.is_number_integer()) return true;
  if (!value.is_number_float()) return false;
  const double d = value.get<double>();
  return std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15;
}

absl::StatusOr<std::optional<double>> GetNumber(const nlohmann::json& obj, const char* key) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return WrongType(key, "a number");
  return std::optional<double>(v->get<double>());
}

absl::StatusOr<std::optional<int64_t>> GetInt(const nlohmann::json& obj, const char* key) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<int64_t>();
  if (!IsIntegral(*v)) return WrongType(key, "an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
    return WrongType(key, "an integer that fits in 64 bits");
  }
  return std::optional<int64_t>(v->is_number_float() ? static_cast<int64_t>(v->get<double>())
                                                     : v->get<int64_t>());
}

absl::StatusOr<std::optional<bool>> GetBool(const nlohmann::json& obj, const char* key) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return WrongType(key, "a boolean");
  return std::optional<bool>(v->get<bool>());
}

absl::StatusOr<std::optional<std::string>> GetString(const nlohmann::json& obj, const char* key) {
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return std::optional<std::string>();
  if (!v->is_string()) return WrongType(key, "a string");
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<std::vector<std::string>> GetStringOrList(const nlohmann::json& obj,
                                                         const char* key) {
  std::vector<std::string> out;
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
    return out;
  }
  if (!v->is_array()) return WrongType(key, "a string or a list of strings");
  for (const nlohmann::json& item : *v) {
    if (!item.is_string()) return WrongType(key, "a string or a list of strings");
    out.push_back(item.get<std::string>());
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GetIntList(const nlohmann::json& obj, const char* key) {
  std::vector<int64_t> out;
  const nlohmann::json* v = Find(obj, key);
  if (v == nullptr) return out;
  if (!v->is_array()) return WrongType(key, "a list of integers");
  for (const nlohmann::json& item : *v) {
    if (!IsIntegral(item)) return WrongType(key, "a list of integers");
    out.push_back(item.is_number_float() ? static_cast<int64_t>(item.get<double>())
                                         : item.get<int64_t>());
  }
  return out;
}

}  // namespace tandem::router
