#include "tests/engine/kv/block_allocator_model.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"

namespace tandem {
namespace {

using Code = absl::StatusCode;

constexpr uint32_t Bit(PageState s) { return 1u << static_cast<uint32_t>(s); }

}  // namespace

std::array<int, kNumPageStates> Counts(const BlockAllocator& a) {
  std::array<int, kNumPageStates> out{};
  for (int s = 0; s < kNumPageStates; ++s) out[s] = a.num_in_state(static_cast<PageState>(s));
  return out;
}

int BlockAllocatorModel::Count(PageState state) const {
  return static_cast<int>(std::count_if(pages_.begin(), pages_.end(),
                                        [state](const Page& p) { return p.state == state; }));
}

std::array<int, kNumPageStates> BlockAllocatorModel::Counts() const {
  std::array<int, kNumPageStates> out{};
  for (int s = 0; s < kNumPageStates; ++s) out[s] = Count(static_cast<PageState>(s));
  return out;
}

Code BlockAllocatorModel::Check(absl::Span<const int32_t> pages, uint32_t allowed) const {
  for (int32_t p : pages) {
    if (p < 0 || p >= num_pages()) return Code::kOutOfRange;
    if ((Bit(pages_[p].state) & allowed) == 0) return Code::kFailedPrecondition;
  }
  return Code::kOk;
}

void BlockAllocatorModel::Unhash(int32_t p) {
  if (!pages_[p].hashed) return;
  index_.erase(pages_[p].hash);
  pages_[p].hashed = false;
  pages_[p].hash = 0;
}

Code BlockAllocatorModel::TakeCode(int n) const {
  if (n < 0) return Code::kInvalidArgument;
  if (n > Count(PageState::kFree) + Count(PageState::kCached)) return Code::kResourceExhausted;
  return Code::kOk;
}

bool BlockAllocatorModel::ApplyTake(absl::Span<const int32_t> taken, int n, PageState to) {
  if (static_cast<int>(taken.size()) != n) return false;
  // Evicted: the `evict` least recently freed cached pages, exactly.
  const int evict = std::max(0, n - Count(PageState::kFree));
  absl::flat_hash_set<int32_t> expected_evicted(lru_.begin(), std::next(lru_.begin(), evict));
  absl::flat_hash_set<int32_t> seen;
  int evicted = 0;
  for (int32_t p : taken) {
    if (p < 0 || p >= num_pages() || !seen.insert(p).second) return false;
    if (pages_[p].state == PageState::kCached) {
      if (!expected_evicted.contains(p)) return false;
      ++evicted;
    } else if (pages_[p].state != PageState::kFree) {
      return false;
    }
  }
  if (evicted != evict) return false;
  for (int32_t p : taken) {
    if (pages_[p].state == PageState::kCached) lru_.remove(p);
    Unhash(p);
    pages_[p].state = to;
    pages_[p].refs = to == PageState::kOwned ? 1 : 0;
  }
  return true;
}

Code BlockAllocatorModel::BeginReceive(absl::Span<const int32_t> pages) {
  const Code code = Check(pages, Bit(PageState::kReserved));
  if (code != Code::kOk) return code;
  for (int32_t p : pages) pages_[p].state = PageState::kReceiving;
  return code;
}

Code BlockAllocatorModel::Commit(absl::Span<const int32_t> pages) {
  const Code code = Check(pages, Bit(PageState::kReserved) | Bit(PageState::kReceiving));
  if (code != Code::kOk) return code;
  for (int32_t p : pages) pages_[p] = {PageState::kOwned, 1, false, 0};
  return code;
}

Code BlockAllocatorModel::AddRef(absl::Span<const int32_t> pages) {
  const Code code = Check(pages, Bit(PageState::kOwned));
  if (code != Code::kOk) return code;
  for (int32_t p : pages) ++pages_[p].refs;
  return code;
}

Code BlockAllocatorModel::Free(absl::Span<const int32_t> pages) {
  const Code code =
      Check(pages, Bit(PageState::kOwned) | Bit(PageState::kReserved) | Bit(PageState::kReceiving));
  if (code != Code::kOk) return code;
  for (int32_t p : pages) {  // a page listed more often than it is held is a double free
    const int held = pages_[p].state == PageState::kOwned ? pages_[p].refs : 1;
    if (std::count(pages.begin(), pages.end(), p) > held) return Code::kFailedPrecondition;
  }
  std::vector<int32_t> cached;
  for (int32_t p : pages) {
    Page& page = pages_[p];
    if (page.state == PageState::kOwned && --page.refs > 0) continue;
    if (page.state == PageState::kOwned && page.hashed) {
      page.state = PageState::kCached;
      cached.push_back(p);
    } else {
      page = {};
    }
  }
  lru_.insert(lru_.end(), cached.rbegin(), cached.rend());  // last page first
  return code;
}

Code BlockAllocatorModel::Acquire(absl::Span<const int32_t> pages) {
  const Code code = Check(pages, Bit(PageState::kOwned) | Bit(PageState::kCached));
  if (code != Code::kOk) return code;
  for (int32_t p : pages) {
    if (!pages_[p].hashed) return Code::kFailedPrecondition;
  }
  for (int32_t p : pages) {
    if (pages_[p].state == PageState::kCached) {
      lru_.remove(p);
      pages_[p].state = PageState::kOwned;
    }
    ++pages_[p].refs;
  }
  return code;
}

Code BlockAllocatorModel::Register(int32_t page, uint64_t hash, bool* result) {
  const int32_t one[] = {page};
  const Code code = Check(one, Bit(PageState::kOwned));
  if (code != Code::kOk) return code;
  Page& p = pages_[page];
  if (p.hashed || index_.contains(hash)) {
    *result = p.hashed && p.hash == hash;
    return code;
  }
  p.hashed = true;
  p.hash = hash;
  index_[hash] = page;
  *result = true;
  return code;
}

std::vector<int32_t> BlockAllocatorModel::Lookup(absl::Span<const uint64_t> hashes) const {
  std::vector<int32_t> out;
  for (uint64_t h : hashes) {
    auto it = index_.find(h);
    if (it == index_.end()) break;
    out.push_back(it->second);
  }
  return out;
}

int BlockAllocatorModel::ClearCache() {
  const int n = static_cast<int>(lru_.size());
  for (int32_t p : lru_) {
    Unhash(p);
    pages_[p] = {};
  }
  lru_.clear();
  return n;
}

}  // namespace tandem
