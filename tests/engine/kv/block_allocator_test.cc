#include "engine/kv/block_allocator.h"

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

}  // namespace
}  // namespace tandem
