#include "router/api_key.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace tandem::router {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (b.empty()) return a.empty();
  // Every byte of `a` is compared (with b repeated), so the loop's length is a's, not b's.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = diff | static_cast<unsigned char>(a[i] ^ b[i % b.size()]);
  }
  return diff == 0;
}

bool ApiKeyMatches(absl::string_view authorization, absl::string_view key) {
  if (key.empty()) return false;
  authorization = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme) ||
      (authorization[kScheme.size()] != ' ' && authorization[kScheme.size()] != '\t')) {
    return false;
  }
  return ConstantTimeEquals(absl::StripAsciiWhitespace(authorization.substr(kScheme.size())), key);
}

}  // namespace tandem::router
