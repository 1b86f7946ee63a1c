#include "engine/kv/block_allocator.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "base/check.h"

namespace tandem {
namespace {

constexpr uint32_t Bit(PageState s) { return 1u << static_cast<uint32_t>(s); }

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
  }
  return "?";
}

BlockAllocator::BlockAllocator(int num_pages) : pages_(num_pages) {
  CHECK_GE(num_pages, 0);
  free_list_.reserve(num_pages);
  for (int32_t p = num_pages - 1; p >= 0; --p) free_list_.push_back(p);
}

absl::StatusOr<std::vector<int32_t>> BlockAllocator::Take(int n, PageState to) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrFormat("cannot take %d pages", n));
  if (n > num_free()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV cache: %d pages requested, %d of %d free", n, num_free(), num_pages()));
  }
  std::vector<int32_t> out(free_list_.end() - n, free_list_.end());
  std::reverse(out.begin(), out.end());
  free_list_.resize(free_list_.size() - n);
  for (int32_t p : out) {
    Page& page = pages_[p];
    CHECK(page.state == PageState::kFree)
        << "page " << p << " on the free list is " << PageStateName(page.state);
    page.state = to;
    page.ref_count = to == PageState::kOwned ? 1 : 0;
  }
  return out;
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
  for (int32_t p : pages) pages_[p].state = PageState::kReceiving;
  return absl::OkStatus();
}

absl::Status BlockAllocator::Commit(absl::Span<const int32_t> pages) {
  const uint32_t allowed = Bit(PageState::kReserved) | Bit(PageState::kReceiving);
  if (absl::Status s = Validate(pages, allowed, "Commit"); !s.ok()) return s;
  for (int32_t p : pages) pages_[p] = Page{PageState::kOwned, 1};
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
  for (int32_t p : pages) {
    Page& page = pages_[p];
    if (page.state == PageState::kOwned && --page.ref_count > 0) continue;
    page = Page{};
    free_list_.push_back(p);
  }
  return absl::OkStatus();
}

PageState BlockAllocator::state(int32_t page) const {
  CHECK(page >= 0 && page < num_pages()) << "page " << page;
  return pages_[page].state;
}

int BlockAllocator::ref_count(int32_t page) const {
  CHECK(page >= 0 && page < num_pages()) << "page " << page;
  return pages_[page].ref_count;
}

int BlockAllocator::num_in_state(PageState state) const {
  int n = 0;
  for (const Page& page : pages_) n += page.state == state;
  return n;
}

}  // namespace tandem
