#include "engine/kv/block_allocator.h"

#include <algorithm>
#include <array>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "base/check.h"

namespace tandem {
namespace {

constexpr uint32_t Bit(PageState s) { return 1u << static_cast<uint32_t>(s); }

// OK iff `list` names every page in `state` (counted[state] of them) exactly once, and no other.
template <typename List, typename StateOf>
absl::Status CheckListed(const List& list, PageState state,
                         const std::array<int, kNumPageStates>& counted, int num_pages,
                         StateOf state_of, const char* what) {
  std::vector<bool> seen(num_pages);
  int num_seen = 0;
  for (int32_t p : list) {
    if (p < 0 || p >= num_pages) {
      return absl::InternalError(absl::StrFormat("the %s holds page %d", what, p));
    }
    if (state_of(p) != state) {
      return absl::InternalError(
          absl::StrFormat("page %d on the %s is %s", p, what, PageStateName(state_of(p))));
    }
    if (seen[p]) return absl::InternalError(absl::StrFormat("page %d is twice on the %s", p, what));
    seen[p] = true;
    ++num_seen;
  }
  if (num_seen != counted[static_cast<int>(state)]) {
    return absl::InternalError(absl::StrFormat("%d pages are %s, the %s holds %d",
                                               counted[static_cast<int>(state)],
                                               PageStateName(state), what, num_seen));
  }
  return absl::OkStatus();
}

}  // namespace

const char* PageStateName(PageState state) {
  switch (state) {
    case PageState::kFree:
      return "free";
    case PageState::kReserved:
      return "reserved";
    case PageState::kReceiving:
      return "receiving";
    case PageState::kOwned:
      return "owned";
    case PageState::kCached:
      return "cached";
  }
  return "?";
}

BlockAllocator::BlockAllocator(int num_pages) : pages_(num_pages) {
  CHECK_GE(num_pages, 0);
  free_list_.reserve(num_pages);
  for (int32_t p = num_pages - 1; p >= 0; --p) free_list_.push_back(p);
  num_in_state_[static_cast<int>(PageState::kFree)] = num_pages;
}

void BlockAllocator::SetState(Page& page, PageState to) {
  --num_in_state_[static_cast<int>(page.state)];
  ++num_in_state_[static_cast<int>(to)];
  page.state = to;
}

void BlockAllocator::Reset(Page& page, PageState to, int32_t ref_count) {
  CHECK(!page.hashed) << "a hashed page must leave the hash index first";
  SetState(page, to);
  page.ref_count = ref_count;
  page.hash = 0;
  page.lru_pos = {};
}

absl::StatusOr<std::vector<int32_t>> BlockAllocator::Take(int n, PageState to) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrFormat("cannot take %d pages", n));
  if (n > num_available()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV cache: %d pages requested, %d of %d free (%d of them cached)", n,
                        num_available(), num_pages(), num_cached()));
  }
  while (num_free() < n) EvictOne();
  std::vector<int32_t> out(free_list_.end() - n, free_list_.end());
  std::reverse(out.begin(), out.end());
  free_list_.resize(free_list_.size() - n);
  for (int32_t p : out) {
    Page& page = pages_[p];
    CHECK(page.state == PageState::kFree)
        << "page " << p << " on the free list is " << PageStateName(page.state);
    Reset(page, to, to == PageState::kOwned ? 1 : 0);
  }
  return out;
}

void BlockAllocator::Unhash(Page& page) {
  if (!page.hashed) return;
  page_of_hash_.erase(page.hash);
  page.hashed = false;
  page.hash = 0;
  ++hashes_version_;
}

void BlockAllocator::EvictOne() {
  CHECK(!lru_.empty());
  const int32_t p = lru_.front();
  lru_.pop_front();
  Page& page = pages_[p];
  CHECK(page.state == PageState::kCached && page.ref_count == 0) << "page " << p;
  Unhash(page);
  Reset(page, PageState::kFree, 0);
  free_list_.push_back(p);
}

absl::StatusOr<std::vector<int32_t>> BlockAllocator::Allocate(int n) {
  return Take(n, PageState::kOwned);
}

absl::StatusOr<std::vector<int32_t>> BlockAllocator::Reserve(int n) {
  return Take(n, PageState::kReserved);
}

absl::Status BlockAllocator::Validate(absl::Span<const int32_t> pages, uint32_t allowed,
                                      const char* op) const {
  for (int32_t p : pages) {
    if (p < 0 || p >= num_pages()) {
      return absl::OutOfRangeError(
          absl::StrFormat("%s: page %d outside the pool of %d pages", op, p, num_pages()));
    }
    if ((Bit(pages_[p].state) & allowed) == 0) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s: page %d is %s", op, p, PageStateName(pages_[p].state)));
    }
  }
  return absl::OkStatus();
}

absl::Status BlockAllocator::BeginReceive(absl::Span<const int32_t> pages) {
  if (absl::Status s = Validate(pages, Bit(PageState::kReserved), "BeginReceive"); !s.ok()) {
    return s;
  }
  for (int32_t p : pages) SetState(pages_[p], PageState::kReceiving);
  return absl::OkStatus();
}

absl::Status BlockAllocator::Commit(absl::Span<const int32_t> pages) {
  const uint32_t allowed = Bit(PageState::kReserved) | Bit(PageState::kReceiving);
  if (absl::Status s = Validate(pages, allowed, "Commit"); !s.ok()) return s;
  for (int32_t p : pages) {
    Reset(pages_[p], PageState::kOwned, 1);
  }
  return absl::OkStatus();
}

absl::Status BlockAllocator::AddRef(absl::Span<const int32_t> pages) {
  if (absl::Status s = Validate(pages, Bit(PageState::kOwned), "AddRef"); !s.ok()) return s;
  for (int32_t p : pages) ++pages_[p].ref_count;
  return absl::OkStatus();
}

absl::Status BlockAllocator::Free(absl::Span<const int32_t> pages) {
  const uint32_t allowed =
      Bit(PageState::kOwned) | Bit(PageState::kReserved) | Bit(PageState::kReceiving);
  if (absl::Status s = Validate(pages, allowed, "Free"); !s.ok()) return s;
  // A page listed k times must hold at least k references, else it would be freed twice.
  absl::flat_hash_map<int32_t, int> times;
  for (int32_t p : pages) {
    const int held = pages_[p].state == PageState::kOwned ? pages_[p].ref_count : 1;
    if (++times[p] > held) {
      return absl::FailedPreconditionError(absl::StrFormat("Free: page %d freed twice", p));
    }
  }
  std::vector<int32_t> to_cache;
  for (int32_t p : pages) {
    Page& page = pages_[p];
    if (page.state == PageState::kOwned && --page.ref_count > 0) continue;
    if (page.state == PageState::kOwned && page.hashed) {
      SetState(page, PageState::kCached);
      to_cache.push_back(p);
      continue;
    }
    Reset(page, PageState::kFree, 0);
    free_list_.push_back(p);
  }
  // Last page first: evicted before the pages of the prefix it extends.
  for (auto it = to_cache.rbegin(); it != to_cache.rend(); ++it) {
    pages_[*it].lru_pos = lru_.insert(lru_.end(), *it);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> BlockAllocator::Register(int32_t page, uint64_t hash) {
  const int32_t one[] = {page};
  if (absl::Status s = Validate(one, Bit(PageState::kOwned), "Register"); !s.ok()) return s;
  Page& p = pages_[page];
  if (p.hashed || page_of_hash_.contains(hash)) return p.hashed && p.hash == hash;
  p.hashed = true;
  p.hash = hash;
  page_of_hash_.emplace(hash, page);
  ++hashes_version_;
  return true;
}

std::vector<int32_t> BlockAllocator::Lookup(absl::Span<const uint64_t> hashes) const {
  std::vector<int32_t> out;
  for (uint64_t h : hashes) {
    auto it = page_of_hash_.find(h);
    if (it == page_of_hash_.end()) break;
    out.push_back(it->second);
  }
  return out;
}

absl::Status BlockAllocator::Acquire(absl::Span<const int32_t> pages) {
  const uint32_t allowed = Bit(PageState::kOwned) | Bit(PageState::kCached);
  if (absl::Status s = Validate(pages, allowed, "Acquire"); !s.ok()) return s;
  for (int32_t p : pages) {
    if (!pages_[p].hashed) {
      return absl::FailedPreconditionError(
          absl::StrFormat("Acquire: page %d holds no cached prefix", p));
    }
  }
  for (int32_t p : pages) {
    Page& page = pages_[p];
    if (page.state == PageState::kCached) {
      lru_.erase(page.lru_pos);
      page.lru_pos = {};
      SetState(page, PageState::kOwned);
    }
    ++page.ref_count;
  }
  return absl::OkStatus();
}

int BlockAllocator::ClearCache() {
  const int n = num_cached();
  while (!lru_.empty()) EvictOne();
  return n;
}

std::vector<uint64_t> BlockAllocator::Hashes() const {
  std::vector<uint64_t> out;
  out.reserve(page_of_hash_.size());
  for (const auto& [hash, page] : page_of_hash_) out.push_back(hash);
  return out;
}

bool BlockAllocator::hashed(int32_t page) const {
  CHECK(page >= 0 && page < num_pages()) << "page " << page;
  return pages_[page].hashed;
}

PageState BlockAllocator::state(int32_t page) const {
  CHECK(page >= 0 && page < num_pages()) << "page " << page;
  return pages_[page].state;
}

int BlockAllocator::ref_count(int32_t page) const {
  CHECK(page >= 0 && page < num_pages()) << "page " << page;
  return pages_[page].ref_count;
}

absl::Status BlockAllocator::CheckPage(int32_t p) const {
  const Page& page = pages_[p];
  const bool owned = page.state == PageState::kOwned;
  if (owned ? page.ref_count < 1 : page.ref_count != 0) {
    return absl::InternalError(absl::StrFormat("page %d is %s with %d references", p,
                                               PageStateName(page.state), page.ref_count));
  }
  // kCached pages are hashed, kOwned ones may be, the others never are.
  const bool cached = page.state == PageState::kCached;
  if (page.hashed ? !(owned || cached) : cached) {
    return absl::InternalError(absl::StrFormat("page %d is %s and %s", p, PageStateName(page.state),
                                               page.hashed ? "hashed" : "unhashed"));
  }
  auto it = page_of_hash_.find(page.hash);
  if (page.hashed && (it == page_of_hash_.end() || it->second != p)) {
    return absl::InternalError(absl::StrFormat("page %d's hash is not indexed to it", p));
  }
  return absl::OkStatus();
}

absl::Status BlockAllocator::CheckConsistency() const {
  std::array<int, kNumPageStates> counted{};
  int num_hashed = 0;
  for (int32_t p = 0; p < num_pages(); ++p) {
    if (absl::Status s = CheckPage(p); !s.ok()) return s;
    ++counted[static_cast<int>(pages_[p].state)];
    num_hashed += pages_[p].hashed;
  }
  for (int s = 0; s < kNumPageStates; ++s) {
    if (counted[s] != num_in_state_[s]) {
      return absl::InternalError(absl::StrFormat("%d pages are %s, the count says %d", counted[s],
                                                 PageStateName(static_cast<PageState>(s)),
                                                 num_in_state_[s]));
    }
  }
  if (num_hashed != static_cast<int>(page_of_hash_.size())) {
    return absl::InternalError(
        absl::StrFormat("%d hashed pages, %d hashes indexed", num_hashed, page_of_hash_.size()));
  }
  auto state_of = [this](int32_t p) { return pages_[p].state; };
  if (absl::Status s =
          CheckListed(free_list_, PageState::kFree, counted, num_pages(), state_of, "free list");
      !s.ok()) {
    return s;
  }
  return CheckListed(lru_, PageState::kCached, counted, num_pages(), state_of, "eviction order");
}

}  // namespace tandem
