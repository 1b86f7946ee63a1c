// Typed, optional access to fields of a JSON request object. A field that is absent or null reads
// as std::nullopt; a field of the wrong type is InvalidArgument naming it ("'temperature' must be
// a number"), never an exception.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::router {

absl::StatusOr<std::optional<double>> GetNumber(const nlohmann::json& obj, const char* key);
// Integers only (a JSON number with a fraction is rejected; 2.0 is accepted as 2).
absl::StatusOr<std::optional<int64_t>> GetInt(const nlohmann::json& obj, const char* key);
absl::StatusOr<std::optional<bool>> GetBool(const nlohmann::json& obj, const char* key);
absl::StatusOr<std::optional<std::string>> GetString(const nlohmann::json& obj, const char* key);
// A string or a list of strings.
absl::StatusOr<std::vector<std::string>> GetStringOrList(const nlohmann::json& obj,
                                                         const char* key);
// A list of integers.
absl::StatusOr<std::vector<int64_t>> GetIntList(const nlohmann::json& obj, const char* key);

// True if `value` is a JSON integer, or a float with no fractional part.
bool IsIntegral(const nlohmann::json& value);

}  // namespace tandem::router
