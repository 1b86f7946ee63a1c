// A reference model of BlockAllocator's page-ownership state machine (block_allocator.h), written
// from its contract rather than its code: a page-by-page table, the eviction order and the hash
// index. block_allocator_random_test runs random calls on both and compares them after each.
//
// Only what the contract leaves open is learned from the allocator: which kFree page ids Take
// hands out (the model checks they were free, or the least recently freed cached ones).
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/kv/block_allocator.h"

namespace tandem {

// The allocator's num_in_state of every state, indexed by PageState
// ({free, reserved, receiving, owned, cached}).
std::array<int, kNumPageStates> Counts(const BlockAllocator& a);

class BlockAllocatorModel {
 public:
  struct Page {
    PageState state = PageState::kFree;
    int refs = 0;
    bool hashed = false;
    uint64_t hash = 0;
  };

  explicit BlockAllocatorModel(int num_pages) : pages_(num_pages) {}

  int num_pages() const { return static_cast<int>(pages_.size()); }
  const Page& page(int32_t p) const { return pages_[p]; }
  int Count(PageState state) const;
  std::array<int, kNumPageStates> Counts() const;
  const absl::flat_hash_map<uint64_t, int32_t>& index() const { return index_; }

  // The status the allocator must return for Take(n) (Allocate / Reserve).
  absl::StatusCode TakeCode(int n) const;
  // Checks that `taken` is a legal answer to an OK Take(n) and applies it: the pages were kFree
  // or, when too few were, the least recently freed kCached ones. False (model unchanged) if not.
  bool ApplyTake(absl::Span<const int32_t> taken, int n, PageState to);

  // The status the allocator must return for each call, and the call applied (only when OK).
  absl::StatusCode BeginReceive(absl::Span<const int32_t> pages);
  absl::StatusCode Commit(absl::Span<const int32_t> pages);
  absl::StatusCode AddRef(absl::Span<const int32_t> pages);
  absl::StatusCode Free(absl::Span<const int32_t> pages);
  absl::StatusCode Acquire(absl::Span<const int32_t> pages);
  // Register's code, and through `result` its value when OK.
  absl::StatusCode Register(int32_t page, uint64_t hash, bool* result);
  std::vector<int32_t> Lookup(absl::Span<const uint64_t> hashes) const;
  int ClearCache();

 private:
  // The code of the first page out of the pool or in none of `allowed` (a bit set), else kOk.
  absl::StatusCode Check(absl::Span<const int32_t> pages, uint32_t allowed) const;
  void Unhash(int32_t p);

  std::vector<Page> pages_;
  std::list<int32_t> lru_;  // kCached, least recently freed first
  absl::flat_hash_map<uint64_t, int32_t> index_;
};

}  // namespace tandem
