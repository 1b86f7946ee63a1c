#include "tokenizer/json_fields.h"

#include "absl/strings/str_cat.h"

namespace tandem::json_fields {

const Json* Find(const Json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(std::string(key));
  return it == obj.end() ? nullptr : &*it;
}

absl::Status Error(std::string_view where, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer.json: ", std::string(where), ": ", std::string(what)));
}

absl::StatusOr<std::string> String(const Json& obj, std::string_view key, std::string_view where) {
  const Json* v = Find(obj, key);
  if (v == nullptr || !v->is_string()) {
    return Error(where, absl::StrCat("missing string field \"", std::string(key), "\""));
  }
  return v->get<std::string>();
}

absl::StatusOr<std::optional<std::string>> OptionalString(const Json& obj, std::string_view key,
                                                          std::string_view where) {
  const Json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return std::optional<std::string>();
  if (!v->is_string()) {
    return Error(where, absl::StrCat("field \"", std::string(key), "\" is not a string"));
  }
  return std::optional<std::string>(v->get<std::string>());
}

absl::StatusOr<bool> Bool(const Json& obj, std::string_view key, std::string_view where,
                          bool default_value) {
  const Json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return default_value;
  if (!v->is_boolean()) {
    return Error(where, absl::StrCat("field \"", std::string(key), "\" is not a boolean"));
  }
  return v->get<bool>();
}

absl::StatusOr<int64_t> Int(const Json& obj, std::string_view key, std::string_view where,
                            int64_t default_value) {
  const Json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return default_value;
  if (!v->is_number_integer()) {
    return Error(where, absl::StrCat("field \"", std::string(key), "\" is not an integer"));
  }
  return v->get<int64_t>();
}

absl::StatusOr<std::string> Type(const Json& obj, std::string_view where) {
  if (!obj.is_object()) return Error(where, "expected an object");
  return String(obj, "type", where);
}

std::optional<std::string> TokenContent(const Json& config, std::string_view key) {
  const Json* v = Find(config, key);
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  const Json* content = Find(*v, "content");
  if (content != nullptr && content->is_string()) return content->get<std::string>();
  return std::nullopt;
}

}  // namespace tandem::json_fields
