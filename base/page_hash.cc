#include "base/page_hash.h"

#include "base/check.h"

namespace tandem {
namespace {

// SplitMix64's finalizer: a bijection on 64 bits with full avalanche.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t ChainPageHash(uint64_t parent, absl::Span<const int32_t> page_tokens) {
  // The length goes in first so that pages of different sizes never collide by construction.
  uint64_t h = Mix(parent ^ Mix(0x9e3779b97f4a7c15ull + page_tokens.size()));
  for (int32_t t : page_tokens) {
    h = Mix(h + 0x9e3779b97f4a7c15ull + static_cast<uint32_t>(t));
  }
  return h;
}

std::vector<uint64_t> PageHashes(absl::Span<const int32_t> tokens, int page_size) {
  CHECK_GE(page_size, 1);
  std::vector<uint64_t> out;
  out.reserve(tokens.size() / page_size);
  uint64_t parent = kPageHashSeed;
  for (size_t start = 0; start + page_size <= tokens.size(); start += page_size) {
    parent = ChainPageHash(parent, tokens.subspan(start, page_size));
    out.push_back(parent);
  }
  return out;
}

}  // namespace tandem
