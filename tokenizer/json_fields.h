// Non-throwing field access for tokenizer.json / tokenizer_config.json: nlohmann's accessors
// throw on type mismatches, so every read goes through these, which return InvalidArgument
// naming the field's path ("where") instead.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::json_fields {

using Json = nlohmann::json;

// The member `key` of `obj`, or null if obj is not an object or has no such member.
const Json* Find(const Json& obj, std::string_view key);

absl::Status Error(std::string_view where, std::string_view what);

// Required string member.
absl::StatusOr<std::string> String(const Json& obj, std::string_view key, std::string_view where);
// String member that may be absent or null.
absl::StatusOr<std::optional<std::string>> OptionalString(const Json& obj, std::string_view key,
                                                          std::string_view where);
absl::StatusOr<bool> Bool(const Json& obj, std::string_view key, std::string_view where,
                          bool default_value);
absl::StatusOr<int64_t> Int(const Json& obj, std::string_view key, std::string_view where,
                            int64_t default_value);
// The "type" member of a component object.
absl::StatusOr<std::string> Type(const Json& obj, std::string_view where);

// A special-token field of tokenizer_config.json: a string or {"content": "..."}; nullopt when
// absent or null.
std::optional<std::string> TokenContent(const Json& config, std::string_view key);

}  // namespace tandem::json_fields
