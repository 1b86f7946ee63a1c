// The cluster token: the secret every process of one deployment shares, which every internal
// call (worker registry, worker RPCs, the KV-transfer handshake) must carry. The launcher makes
// a fresh one per deployment (RandomHex(32)) and hands it to its children in the environment
// ($TANDEM_CLUSTER_TOKEN), never on a command line; a process started by hand reads it from
// that variable or from a file (--cluster-token-file, readable by its owner only).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

inline constexpr char kClusterTokenEnv[] = "TANDEM_CLUSTER_TOKEN";
inline constexpr size_t kMinClusterTokenChars = 16;

// The token from `file` when it is non-empty (its contents without trailing whitespace), else
// from $TANDEM_CLUSTER_TOKEN; "" when neither is set. InvalidArgument for a token shorter than
// kMinClusterTokenChars, or a file that group or others may read (or that cannot be read).
absl::StatusOr<std::string> LoadClusterToken(const std::string& file);

// Whether `candidate` equals `secret`, in time that depends on candidate.size() only (not on
// where the first difference is, nor on the secret's length or bytes).
bool TokenMatches(std::string_view secret, std::string_view candidate);

}  // namespace tandem
