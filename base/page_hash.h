// Page hashes for prefix caching: the identity of one full KV page of tokens, chained over the
// prefix (vLLM's block hashing idea). Page i's hash covers every token before it and its own
// page_size tokens, so two sequences share page i's hash only if their first (i + 1) * page_size
// tokens are equal. The engine (engine/kv/block_allocator.h) keys cached pages by it and the
// router (router/routing_policy.h) computes the same values over a tokenized prompt to find the
// worker that holds the longest prefix, so the function lives here, in the one library both link.
//
// The values are a fixed function of (seed, page_size, tokens): stable across processes, builds
// and machines (no per-process seeding, unlike absl::Hash). 64 bits: two different prefixes
// share a hash with probability ~2^-64 per pair of pages.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tandem {

// What else the KV of a page depends on besides its tokens goes into the seed (nothing yet: one
// model and one KV dtype per worker; a LoRA adapter or a multimodal input would go here).
inline constexpr uint64_t kPageHashSeed = 0x74616e64656d3031ull;  // "tandem01"

// The hash of the page after `parent` (kPageHashSeed for page 0) holding `page_tokens`.
uint64_t ChainPageHash(uint64_t parent, absl::Span<const int32_t> page_tokens);

// Hashes of the full pages of `tokens`: floor(tokens.size() / page_size) values, page 0 first.
// page_size >= 1.
std::vector<uint64_t> PageHashes(absl::Span<const int32_t> tokens, int page_size);

}  // namespace tandem
