// Unguessable values from the kernel's CSPRNG (getrandom(2)): request ids, instance nonces and
// cluster tokens. Thread-safe.
#pragma once

#include <string>

namespace tandem {

// 2 * num_bytes lowercase hex characters of fresh randomness (128 bits: RandomHex(16)).
std::string RandomHex(int num_bytes);

}  // namespace tandem
