// BlockAllocator: hands out KV page ids of one pool and tracks each page's ownership state and
// reference count. It owns no memory (KvCache does); a page id names the same page in every
// layer (kernels/common/kv_layout.h).
//
// Page-ownership state machine (docs/architecture.md, "KV pages"), one owner at a time:
//
//   kFree ──Allocate──────────────────────────────▶ kOwned ──Free (last ref)──▶ kFree
//   kFree ──Reserve──▶ kReserved ──BeginReceive──▶ kReceiving ──Commit──▶ kOwned
//                      kReserved ──Commit─────────────────────────────────▶ kOwned
//                      kReserved / kReceiving ──Free──▶ kFree      (aborted transfer)
//
// kOwned pages are reference counted (AddRef) so prefix sharing and speculative rollback fit
// later; every other state has exactly one holder. A transition requested from the wrong state,
// or for a page id outside the pool, returns FailedPrecondition / OutOfRange: callers that can
// only hit this through a bug wrap the call in CHECK_OK.
//
// Thread-compatible: the engine loop owns it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem {

enum class PageState : uint8_t { kFree, kReserved, kReceiving, kOwned };

const char* PageStateName(PageState state);

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_pages);

  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  // kFree → kOwned with one reference each. ResourceExhausted (and nothing taken) if fewer than
  // `n` pages are free.
  absl::StatusOr<std::vector<int32_t>> Allocate(int n);
  // kFree → kReserved: pages an incoming KV transfer will write. ResourceExhausted as Allocate.
  absl::StatusOr<std::vector<int32_t>> Reserve(int n);
  // kReserved → kReceiving: a transfer has started writing the pages.
  absl::Status BeginReceive(absl::Span<const int32_t> pages);
  // kReserved or kReceiving → kOwned (one reference): the transferred KV is complete.
  absl::Status Commit(absl::Span<const int32_t> pages);
  // kOwned: one more reference (a second block table shares the page).
  absl::Status AddRef(absl::Span<const int32_t> pages);
  // Drops one reference of each kOwned page (kFree at zero), or frees kReserved/kReceiving
  // pages. Validates every page before changing any.
  absl::Status Free(absl::Span<const int32_t> pages);

  PageState state(int32_t page) const;
  int ref_count(int32_t page) const;

  int num_pages() const { return static_cast<int>(pages_.size()); }
  int num_free() const { return static_cast<int>(free_list_.size()); }
  int num_in_state(PageState state) const;

 private:
  struct Page {
    PageState state = PageState::kFree;
    int32_t ref_count = 0;
  };

  absl::StatusOr<std::vector<int32_t>> Take(int n, PageState to);
  // OK iff every page is in the pool and in one of `allowed` states (a bit set of PageState).
  absl::Status Validate(absl::Span<const int32_t> pages, uint32_t allowed, const char* op) const;

  std::vector<Page> pages_;
  // Free page ids; popped from the back. Initially in descending order, so a fresh allocator
  // hands out 0, 1, 2, ... (easier to read in tests and logs).
  std::vector<int32_t> free_list_;
};

// Pages needed to hold `num_tokens` tokens.
inline int PagesForTokens(int64_t num_tokens, int page_size) {
  return static_cast<int>((num_tokens + page_size - 1) / page_size);
}

}  // namespace tandem
