#include "engine/kv/block_allocator.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

TEST(BlockAllocatorTest, AllocateAndFreeRoundTrip) {
  BlockAllocator a(4);
  absl::StatusOr<std::vector<int32_t>> pages = a.Allocate(3);
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_THAT(*pages, ElementsAre(0, 1, 2));
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.state(1), PageState::kOwned);
  EXPECT_EQ(a.ref_count(1), 1);
  ASSERT_TRUE(a.Free(*pages).ok());
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(a.state(1), PageState::kFree);
}

TEST(BlockAllocatorTest, ExhaustionTakesNothing) {
  BlockAllocator a(4);
  ASSERT_TRUE(a.Allocate(3).ok());
  absl::StatusOr<std::vector<int32_t>> more = a.Allocate(2);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(a.Reserve(2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.num_free(), 1);
}

TEST(BlockAllocatorTest, TransferStateMachine) {
  BlockAllocator a(8);
  std::vector<int32_t> pages = *a.Reserve(3);
  EXPECT_EQ(a.num_in_state(PageState::kReserved), 3);
  // Reserved pages cannot be shared or received twice.
  EXPECT_EQ(a.AddRef(pages).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.BeginReceive(pages).ok());
  EXPECT_EQ(a.num_in_state(PageState::kReceiving), 3);
  EXPECT_EQ(a.BeginReceive(pages).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.Commit(pages).ok());
  EXPECT_EQ(a.num_in_state(PageState::kOwned), 3);
  EXPECT_EQ(a.Commit(pages).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(a.Free(pages).ok());
  EXPECT_EQ(a.num_free(), 8);
}

TEST(BlockAllocatorTest, AbortedTransferFreesReservedAndReceivingPages) {
  BlockAllocator a(4);
  std::vector<int32_t> reserved = *a.Reserve(2);
  std::vector<int32_t> receiving = *a.Reserve(2);
  ASSERT_TRUE(a.BeginReceive(receiving).ok());
  ASSERT_TRUE(a.Free(reserved).ok());
  ASSERT_TRUE(a.Free(receiving).ok());
  EXPECT_EQ(a.num_free(), 4);
}

TEST(BlockAllocatorTest, ReferenceCountedSharing) {
  BlockAllocator a(4);
  std::vector<int32_t> pages = *a.Allocate(2);
  ASSERT_TRUE(a.AddRef({pages[0]}).ok());
  EXPECT_EQ(a.ref_count(pages[0]), 2);
  ASSERT_TRUE(a.Free(pages).ok());
  EXPECT_EQ(a.state(pages[0]), PageState::kOwned);  // still held by the second table
  EXPECT_EQ(a.state(pages[1]), PageState::kFree);
  ASSERT_TRUE(a.Free({pages[0]}).ok());
  EXPECT_EQ(a.num_free(), 4);
}

TEST(BlockAllocatorTest, MisuseIsAnErrorAndChangesNothing) {
  BlockAllocator a(4);
  std::vector<int32_t> pages = *a.Allocate(2);
  EXPECT_EQ(a.Free({pages[0], 7}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a.Free({-1}).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a.Free({3}).code(), absl::StatusCode::kFailedPrecondition);  // never allocated
  // Listing a page twice would free it twice: rejected before anything changes.
  EXPECT_EQ(a.Free({pages[0], pages[0]}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_EQ(a.ref_count(pages[0]), 1);
  ASSERT_TRUE(a.Free(pages).ok());
  EXPECT_EQ(a.Free(pages).code(), absl::StatusCode::kFailedPrecondition);  // double free
  EXPECT_EQ(a.Commit({0}).code(), absl::StatusCode::kFailedPrecondition);  // free page
  EXPECT_EQ(a.num_free(), 4);
}

TEST(BlockAllocatorTest, FreedPagesAreReused) {
  BlockAllocator a(2);
  for (int round = 0; round < 100; ++round) {
    std::vector<int32_t> pages = *a.Allocate(2);
    ASSERT_TRUE(a.Free(pages).ok());
  }
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_EQ(a.Allocate(-1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BlockAllocatorTest, PagesForTokens) {
  EXPECT_EQ(PagesForTokens(0, 16), 0);
  EXPECT_EQ(PagesForTokens(1, 16), 1);
  EXPECT_EQ(PagesForTokens(16, 16), 1);
  EXPECT_EQ(PagesForTokens(17, 16), 2);
}

// --- prefix caching: the kCached state ---

TEST(BlockAllocatorCacheTest, HashedPagesAreCachedAfterTheLastFreeAndReacquired) {
  BlockAllocator a(4);
  std::vector<int32_t> pages = *a.Allocate(3);
  EXPECT_TRUE(*a.Register(pages[0], 100));
  EXPECT_TRUE(*a.Register(pages[1], 101));
  // pages[2] stays unhashed (a partial page).
  ASSERT_TRUE(a.AddRef({pages[0]}).ok());  // a second block table shares page 0
  ASSERT_TRUE(a.Free(pages).ok());
  EXPECT_EQ(a.state(pages[0]), PageState::kOwned);  // still held once
  EXPECT_EQ(a.state(pages[1]), PageState::kCached);
  EXPECT_EQ(a.state(pages[2]), PageState::kFree);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_EQ(a.num_cached(), 1);
  EXPECT_EQ(a.num_available(), 3);
  EXPECT_THAT(a.Lookup({100, 101, 102}), ElementsAre(pages[0], pages[1]));
  EXPECT_THAT(a.Lookup({101}), ElementsAre(pages[1]));
  EXPECT_TRUE(a.Lookup({999, 100}).empty());  // stops at the first miss
  ASSERT_TRUE(a.Acquire({pages[0], pages[1]}).ok());
  EXPECT_EQ(a.ref_count(pages[0]), 2);
  EXPECT_EQ(a.state(pages[1]), PageState::kOwned);
  EXPECT_EQ(a.ref_count(pages[1]), 1);
  EXPECT_EQ(a.num_cached(), 0);
  ASSERT_TRUE(a.Free({pages[0], pages[1]}).ok());
  ASSERT_TRUE(a.Free({pages[0]}).ok());
  EXPECT_EQ(a.num_cached(), 2);
  EXPECT_EQ(a.ClearCache(), 2);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_TRUE(a.Lookup({100}).empty());
  EXPECT_TRUE(a.Hashes().empty());
}

TEST(BlockAllocatorCacheTest, AllocationEvictsLeastRecentlyFreedTailFirst) {
  BlockAllocator a(4);
  std::vector<int32_t> first = *a.Allocate(2);   // 0, 1
  std::vector<int32_t> second = *a.Allocate(2);  // 2, 3
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(*a.Register(first[i], 10 + i));
    ASSERT_TRUE(*a.Register(second[i], 20 + i));
  }
  ASSERT_TRUE(a.Free(first).ok());  // evicted first, its tail (page 1) before its head
  ASSERT_TRUE(a.Free(second).ok());
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_THAT(*a.Allocate(1), ElementsAre(1));
  EXPECT_THAT(a.Lookup({10, 11}), ElementsAre(0));  // the head survives
  EXPECT_TRUE(a.Lookup({11}).empty());
  // Reserve evicts too; then nothing is left.
  EXPECT_THAT(*a.Reserve(2), ElementsAre(3, 0));
  EXPECT_EQ(a.Allocate(2).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.num_cached(), 1);  // exhaustion takes nothing
  EXPECT_THAT(a.Lookup({20}), ElementsAre(2));
}

TEST(BlockAllocatorCacheTest, RegisterAndAcquireRefuseWrongStates) {
  BlockAllocator a(4);
  std::vector<int32_t> pages = *a.Allocate(2);
  ASSERT_TRUE(*a.Register(pages[0], 7));
  EXPECT_FALSE(*a.Register(pages[1], 7));  // another page holds this prefix
  EXPECT_FALSE(a.hashed(pages[1]));
  EXPECT_TRUE(*a.Register(pages[0], 7));   // the same hash again: no change
  EXPECT_FALSE(*a.Register(pages[0], 8));  // a page holds one hash
  EXPECT_EQ(a.Register(3, 9).status().code(), absl::StatusCode::kFailedPrecondition);  // free
  EXPECT_EQ(a.Register(9, 9).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(a.Acquire({pages[1]}).code(), absl::StatusCode::kFailedPrecondition);  // unhashed
  EXPECT_EQ(a.Acquire({3}).code(), absl::StatusCode::kFailedPrecondition);         // free
  std::vector<int32_t> reserved = *a.Reserve(1);
  EXPECT_EQ(a.Register(reserved[0], 9).status().code(), absl::StatusCode::kFailedPrecondition);
  // AddRef keeps its meaning: kOwned pages only, never a cached one.
  ASSERT_TRUE(a.Free({pages[0]}).ok());
  EXPECT_EQ(a.state(pages[0]), PageState::kCached);
  EXPECT_EQ(a.AddRef({pages[0]}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(a.Free({pages[0]}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(BlockAllocatorCacheTest, HashesAndVersionFollowTheSet) {
  BlockAllocator a(3);
  const uint64_t v0 = a.hashes_version();
  std::vector<int32_t> pages = *a.Allocate(3);
  ASSERT_TRUE(*a.Register(pages[0], 5));
  ASSERT_TRUE(*a.Register(pages[1], 6));
  const uint64_t v1 = a.hashes_version();
  EXPECT_NE(v1, v0);
  std::vector<uint64_t> hashes = a.Hashes();
  std::sort(hashes.begin(), hashes.end());
  EXPECT_THAT(hashes, ElementsAre(5, 6));
  ASSERT_TRUE(a.Free(pages).ok());
  EXPECT_EQ(a.hashes_version(), v1);  // cached pages keep their hashes
  EXPECT_EQ(a.Hashes().size(), 2u);
  ASSERT_TRUE(a.Allocate(2).ok());  // one free page, one evicted
  EXPECT_NE(a.hashes_version(), v1);
  EXPECT_EQ(a.Hashes().size(), 1u);
}

}  // namespace
}  // namespace tandem
