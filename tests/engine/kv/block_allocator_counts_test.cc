// num_in_state is a set of counters that every transition keeps (block_allocator.h): these tests
// walk every edge of the state machine and check that CheckConsistency notices each broken
// invariant, a state changed without its counter first. block_allocator_random_test.cc drives
// long random runs against a reference model.
#include <array>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/engine/kv/block_allocator_model.h"

namespace tandem {

// Breaks BlockAllocator's bookkeeping the way a buggy transition would.
class BlockAllocatorPeer {
 public:
  // A state change that skips the counters (what SetState exists to prevent).
  static void WriteStateOnly(BlockAllocator& a, int32_t page, PageState to) {
    a.pages_[page].state = to;
  }
  static void SetRefCount(BlockAllocator& a, int32_t page, int32_t refs) {
    a.pages_[page].ref_count = refs;
  }
  static void HashWithoutIndex(BlockAllocator& a, int32_t page, uint64_t hash) {
    a.pages_[page].hashed = true;
    a.pages_[page].hash = hash;
  }
  static void PushFree(BlockAllocator& a, int32_t page) { a.free_list_.push_back(page); }
};

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Code = absl::StatusCode;

TEST(BlockAllocatorCountsTest, EveryTransitionMovesItsCounts) {
  BlockAllocator a(8);
  EXPECT_THAT(Counts(a), ElementsAre(8, 0, 0, 0, 0));
  const std::vector<int32_t> owned = *a.Allocate(2);  // kFree → kOwned
  EXPECT_THAT(Counts(a), ElementsAre(6, 0, 0, 2, 0));
  const std::vector<int32_t> r = *a.Reserve(3);  // kFree → kReserved
  EXPECT_THAT(Counts(a), ElementsAre(3, 3, 0, 2, 0));
  ASSERT_TRUE(a.BeginReceive({r[0], r[1]}).ok());  // kReserved → kReceiving
  EXPECT_THAT(Counts(a), ElementsAre(3, 1, 2, 2, 0));
  ASSERT_TRUE(a.Commit({r[2]}).ok());  // kReserved → kOwned
  EXPECT_THAT(Counts(a), ElementsAre(3, 0, 2, 3, 0));
  ASSERT_TRUE(a.Commit({r[0]}).ok());  // kReceiving → kOwned
  EXPECT_THAT(Counts(a), ElementsAre(3, 0, 1, 4, 0));
  ASSERT_TRUE(a.Free({r[1]}).ok());  // kReceiving → kFree (aborted transfer)
  EXPECT_THAT(Counts(a), ElementsAre(4, 0, 0, 4, 0));
  const std::vector<int32_t> aborted = *a.Reserve(1);
  ASSERT_TRUE(a.Free(aborted).ok());  // kReserved → kFree
  EXPECT_THAT(Counts(a), ElementsAre(4, 0, 0, 4, 0));
  ASSERT_TRUE(a.AddRef({owned[0]}).ok());  // kOwned, 2 references: no state change
  ASSERT_TRUE(a.Free({owned[0]}).ok());
  EXPECT_THAT(Counts(a), ElementsAre(4, 0, 0, 4, 0));
  ASSERT_TRUE(*a.Register(owned[0], 1));
  ASSERT_TRUE(*a.Register(owned[1], 2));
  ASSERT_TRUE(a.Free(owned).ok());  // kOwned, hashed → kCached
  EXPECT_THAT(Counts(a), ElementsAre(4, 0, 0, 2, 2));
  ASSERT_TRUE(a.Acquire({owned[0]}).ok());  // kCached → kOwned
  EXPECT_THAT(Counts(a), ElementsAre(4, 0, 0, 3, 1));
  ASSERT_TRUE(a.Reserve(5).ok());  // 4 kFree and an evicted kCached → kReserved
  EXPECT_THAT(Counts(a), ElementsAre(0, 5, 0, 3, 0));
  ASSERT_TRUE(a.Free({r[2]}).ok());  // kOwned, unhashed → kFree
  EXPECT_THAT(Counts(a), ElementsAre(1, 5, 0, 2, 0));
  ASSERT_TRUE(a.Free({owned[0]}).ok());  // → kCached again
  ASSERT_TRUE(a.Allocate(2).ok());       // a kFree page and an evicted one → kOwned
  EXPECT_THAT(Counts(a), ElementsAre(0, 5, 0, 3, 0));
  ASSERT_TRUE(*a.Register(r[0], 3));
  ASSERT_TRUE(a.Free({r[0]}).ok());
  EXPECT_THAT(Counts(a), ElementsAre(0, 5, 0, 2, 1));
  EXPECT_EQ(a.ClearCache(), 1);  // kCached → kFree
  EXPECT_THAT(Counts(a), ElementsAre(1, 5, 0, 2, 0));
  EXPECT_TRUE(a.CheckConsistency().ok()) << a.CheckConsistency();
}

TEST(BlockAllocatorCountsTest, RefusedTransitionsMoveNoCount) {
  BlockAllocator a(6);
  const std::vector<int32_t> owned = *a.Allocate(2);
  const std::vector<int32_t> reserved = *a.Reserve(2);
  ASSERT_TRUE(*a.Register(owned[0], 9));
  const std::array<int, kNumPageStates> before = Counts(a);
  // Each list holds valid pages before the bad one: validation comes before any change.
  EXPECT_EQ(a.BeginReceive({reserved[0], owned[0]}).code(), Code::kFailedPrecondition);
  EXPECT_EQ(a.Commit({reserved[0], owned[1]}).code(), Code::kFailedPrecondition);
  EXPECT_EQ(a.Commit({reserved[0], 6}).code(), Code::kOutOfRange);
  EXPECT_EQ(a.AddRef({owned[0], reserved[1]}).code(), Code::kFailedPrecondition);
  EXPECT_EQ(a.Free({owned[1], reserved[0], 4}).code(), Code::kFailedPrecondition);      // 4 is free
  EXPECT_EQ(a.Free({owned[0], owned[1], owned[0]}).code(), Code::kFailedPrecondition);  // twice
  EXPECT_EQ(a.Free({reserved[1], -1}).code(), Code::kOutOfRange);
  EXPECT_EQ(a.Acquire({owned[0], owned[1]}).code(), Code::kFailedPrecondition);  // unhashed
  EXPECT_EQ(a.Register(reserved[0], 5).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(a.Allocate(3).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(a.Reserve(-1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Counts(a), before);
  EXPECT_TRUE(a.CheckConsistency().ok()) << a.CheckConsistency();
}

TEST(BlockAllocatorCountsTest, EmptyPoolCountsNothing) {
  BlockAllocator a(0);
  EXPECT_THAT(Counts(a), ElementsAre(0, 0, 0, 0, 0));
  EXPECT_EQ(a.Allocate(1).status().code(), Code::kResourceExhausted);
  EXPECT_TRUE(a.Allocate(0)->empty());
  EXPECT_EQ(a.ClearCache(), 0);
  EXPECT_TRUE(a.CheckConsistency().ok()) << a.CheckConsistency();
}

TEST(BlockAllocatorCountsTest, CheckConsistencyCatchesAStateWrittenWithoutItsCount) {
  BlockAllocator a(4);
  const std::vector<int32_t> pages = *a.Reserve(2);
  ASSERT_TRUE(a.CheckConsistency().ok());
  BlockAllocatorPeer::WriteStateOnly(a, pages[0], PageState::kReceiving);
  EXPECT_EQ(a.num_in_state(PageState::kReceiving), 0);  // the counter never heard of it
  const absl::Status s = a.CheckConsistency();
  EXPECT_EQ(s.code(), Code::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("the count says"));
}

TEST(BlockAllocatorCountsTest, CheckConsistencyCatchesEachOtherBrokenInvariant) {
  {
    BlockAllocator a(4);
    const std::vector<int32_t> pages = *a.Allocate(1);
    BlockAllocatorPeer::SetRefCount(a, pages[0], 0);
    EXPECT_THAT(a.CheckConsistency().message(), HasSubstr("with 0 references"));
  }
  {
    BlockAllocator a(4);
    const std::vector<int32_t> pages = *a.Allocate(1);
    BlockAllocatorPeer::HashWithoutIndex(a, pages[0], 77);
    EXPECT_THAT(a.CheckConsistency().message(), HasSubstr("not indexed"));
  }
  {
    BlockAllocator a(4);
    BlockAllocatorPeer::HashWithoutIndex(a, 2, 77);  // a free page is never hashed
    EXPECT_THAT(a.CheckConsistency().message(), HasSubstr("is free and hashed"));
  }
  {
    BlockAllocator a(4);
    const std::vector<int32_t> pages = *a.Allocate(1);
    BlockAllocatorPeer::PushFree(a, pages[0]);  // an owned page on the free list
    EXPECT_THAT(a.CheckConsistency().message(), HasSubstr("on the free list is owned"));
  }
  {
    BlockAllocator a(4);
    BlockAllocatorPeer::PushFree(a, 3);  // listed twice
    EXPECT_THAT(a.CheckConsistency().message(), HasSubstr("page 3 is twice on the free list"));
  }
}

}  // namespace
}  // namespace tandem
