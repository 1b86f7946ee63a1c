// The API key check both front ends share (HTTP `Authorization` header, gRPC `authorization`
// metadata): "Bearer <key>", the scheme case-insensitive (RFC 9110: auth schemes are), spaces
// around the token ignored. The comparison takes time that depends on the length of what the
// client sent only: neither the key's bytes nor its length can be learnt from timing.
#pragma once

#include "absl/strings/string_view.h"

namespace tandem::router {

// True if `authorization` carries `key`. False for an empty key (callers skip the check when
// no key is configured).
bool ApiKeyMatches(absl::string_view authorization, absl::string_view key);

// Equal contents, in time that depends on a.size() only.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace tandem::router
