// A string-keyed hash map that can be probed with std::string_view without a copy (this
// Abseil's own heterogeneous lookup only knows absl::string_view).
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"

namespace tandem {

struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StringViewEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};
template <typename V>
using StringMap = absl::flat_hash_map<std::string, V, StringViewHash, StringViewEq>;

}  // namespace tandem
