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
//   prefix caching (engine/engine.h, enable_prefix_caching):
//   kOwned ──Register(hash)──▶ kOwned, hashed (its KV is complete and never written again)
//   kOwned, hashed ──Free (last ref)──▶ kCached ──Acquire (a prefix hit)──▶ kOwned, hashed
//   kCached ──Allocate / Reserve when no page is kFree (evicted, LRU)──▶ kOwned / kReserved
//   kCached ──ClearCache──▶ kFree
//
// kOwned pages are reference counted (AddRef, Acquire): block tables share them (prefix hits,
// n > 1) and the page goes back only when its last holder frees it; every other state has
// exactly one holder (kCached: none, the cache keeps it). A hashed page is full: every one of its
// slots holds the KV of the tokens its hash names, so sharing it is read-only; a page is hashed
// only after the step that wrote its last slot, and the hash is dropped only when the page is
// evicted (taken for new contents) or the cache is cleared, so Lookup never returns a page that
// is being written. At most one page holds a given hash (Register of a hash another page holds
// leaves the page unhashed). kCached pages are evicted least recently freed first; Free pushes a
// block table's pages last page first, so a prefix loses its tail before its head.
//
// A transition requested from the wrong state, or for a page id outside the pool, returns
// FailedPrecondition / OutOfRange: callers that can only hit this through a bug wrap the call in
// CHECK_OK.
//
// Every query is O(1) except Lookup (O(hashes)), Hashes (O(hashed pages)) and CheckConsistency
// (O(pages)): the engine reads the counts every step, and a pool holds hundreds of thousands of
// pages. Every state change goes through one function (SetState) that keeps a count per state,
// so num_in_state never scans.
//
// Thread-compatible: the engine loop owns it.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem {

enum class PageState : uint8_t { kFree, kReserved, kReceiving, kOwned, kCached };
inline constexpr int kNumPageStates = static_cast<int>(PageState::kCached) + 1;  // kCached last

const char* PageStateName(PageState state);

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_pages);

  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  // kFree → kOwned with one reference each; when no page is kFree, the least recently freed
  // kCached page is evicted (its hash forgotten) and taken instead. ResourceExhausted (and
  // nothing taken) if fewer than `n` pages are free or cached.
  absl::StatusOr<std::vector<int32_t>> Allocate(int n);
  // kFree (or evicted kCached) → kReserved: pages an incoming KV transfer will write.
  // ResourceExhausted as Allocate.
  absl::StatusOr<std::vector<int32_t>> Reserve(int n);
  // kReserved → kReceiving: a transfer has started writing the pages.
  absl::Status BeginReceive(absl::Span<const int32_t> pages);
  // kReserved or kReceiving → kOwned (one reference): the transferred KV is complete.
  absl::Status Commit(absl::Span<const int32_t> pages);
  // kOwned: one more reference (a second block table shares the page).
  absl::Status AddRef(absl::Span<const int32_t> pages);
  // Drops one reference of each kOwned page (at zero: kCached if hashed, else kFree), or frees
  // kReserved/kReceiving pages. Validates every page before changing any. The pages of one call
  // enter the eviction order last page first.
  absl::Status Free(absl::Span<const int32_t> pages);

  // --- prefix caching ---
  // Gives kOwned `page`, whose every slot now holds its final KV, the chained hash of its tokens
  // (base/page_hash.h). False (and the page stays unhashed) if another page already holds `hash`
  // or this page holds a different one; FailedPrecondition / OutOfRange for a page not kOwned.
  absl::StatusOr<bool> Register(int32_t page, uint64_t hash);
  // The pages holding the longest run of `hashes` from the first (hashes[i] names page i of a
  // prefix); stops at the first miss. Reads only: the caller Acquires what it uses.
  std::vector<int32_t> Lookup(absl::Span<const uint64_t> hashes) const;
  // One more reference to each hashed page: kOwned → ref + 1, kCached → kOwned with one (taken
  // out of the eviction order). FailedPrecondition if a page is neither, or unhashed.
  absl::Status Acquire(absl::Span<const int32_t> pages);
  // Every kCached page → kFree, its hash forgotten (hashed kOwned pages keep theirs). Returns
  // how many pages it freed.
  int ClearCache();
  // Hashes of every hashed page (kOwned and kCached), for the router's KV-aware routing.
  std::vector<uint64_t> Hashes() const;
  // Bumped whenever the set of hashes changes (a page hashed, evicted or cleared).
  uint64_t hashes_version() const { return hashes_version_; }

  PageState state(int32_t page) const;
  int ref_count(int32_t page) const;
  bool hashed(int32_t page) const;

  int num_pages() const { return static_cast<int>(pages_.size()); }
  // Pages in kFree. Allocate and Reserve may also take the kCached ones: num_available().
  int num_free() const { return static_cast<int>(free_list_.size()); }
  int num_cached() const { return static_cast<int>(lru_.size()); }
  int num_available() const { return num_free() + num_cached(); }
  // O(1): kept by every transition.
  int num_in_state(PageState state) const { return num_in_state_[static_cast<int>(state)]; }

  // Recounts every page (O(pages): for tests and debugging, never per step) and checks the
  // bookkeeping against it: num_in_state equals the recount for every state, the free list holds
  // exactly the kFree pages and the eviction order exactly the kCached ones, kOwned pages hold at
  // least one reference and the others none, kCached pages are hashed, and the hash index names
  // exactly the hashed pages. Internal, naming the first mismatch, if not.
  absl::Status CheckConsistency() const;

 private:
  friend class BlockAllocatorPeer;  // tests: breaks the bookkeeping to see CheckConsistency fail

  struct Page {
    PageState state = PageState::kFree;
    int32_t ref_count = 0;
    bool hashed = false;
    uint64_t hash = 0;
    std::list<int32_t>::iterator lru_pos;  // valid in kCached
  };

  // CheckConsistency for one page: its references and hash agree with its state.
  absl::Status CheckPage(int32_t page) const;
  // The only writer of Page::state: moves `page` to `to` and the counts with it.
  void SetState(Page& page, PageState to);
  // SetState, then `ref_count` references and no hash: a page entering kFree or taken for new
  // contents (unhashed first: CHECK).
  void Reset(Page& page, PageState to, int32_t ref_count);
  absl::StatusOr<std::vector<int32_t>> Take(int n, PageState to);
  // The least recently freed kCached page → kFree (hash forgotten), on the free list.
  void EvictOne();
  void Unhash(Page& page);
  // OK iff every page is in the pool and in one of `allowed` states (a bit set of PageState).
  absl::Status Validate(absl::Span<const int32_t> pages, uint32_t allowed, const char* op) const;

  std::vector<Page> pages_;
  // Free page ids; popped from the back. Initially in descending order, so a fresh allocator
  // hands out 0, 1, 2, ... (easier to read in tests and logs).
  std::vector<int32_t> free_list_;
  // kCached page ids, least recently freed first (the next evicted).
  std::list<int32_t> lru_;
  absl::flat_hash_map<uint64_t, int32_t> page_of_hash_;  // every hashed page
  uint64_t hashes_version_ = 0;
  // Pages in each state, indexed by PageState; changed only by SetState.
  std::array<int, kNumPageStates> num_in_state_{};
};

// Pages needed to hold `num_tokens` tokens.
inline int PagesForTokens(int64_t num_tokens, int page_size) {
  return static_cast<int>((num_tokens + page_size - 1) / page_size);
}

}  // namespace tandem
