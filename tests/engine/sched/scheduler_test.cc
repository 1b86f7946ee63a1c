#include "engine/sched/scheduler.h"

#include <memory>
#include <vector>

#include "base/page_hash.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void Init(int num_pages, int budget, int max_seqs = 16, int page_size = 4) {
    allocator_ = std::make_unique<BlockAllocator>(num_pages);
    scheduler_ =
        std::make_unique<Scheduler>(SchedulerConfig{max_seqs, budget, page_size}, allocator_.get());
  }

  Sequence* Add(int prompt_len) {
    auto seq = std::make_unique<Sequence>();
    seq->id = "r" + std::to_string(seqs_.size());
    seq->arrival = static_cast<int64_t>(seqs_.size());
    seq->tokens.assign(prompt_len, 1);
    seq->num_prompt_tokens = prompt_len;
    seq->sampling.max_tokens = 1000;
    scheduler_->AddWaiting(seq.get());
    seqs_.push_back(std::move(seq));
    return seqs_.back().get();
  }

  // Schedules and then does what the engine does after the forward pass: the chunk's tokens
  // are computed, and a chunk that reached the end of its sequence samples one more token.
  ScheduleDecision Step() {
    ScheduleDecision d = scheduler_->Schedule();
    int total = 0;
    for (const ScheduledChunk& c : d.chunks) {
      c.seq->num_computed_tokens += c.num_new_tokens;
      total += c.num_new_tokens;
      if (c.seq->num_computed_tokens == c.seq->num_tokens()) c.seq->tokens.push_back(2);
      EXPECT_GE(static_cast<int64_t>(c.seq->block_table.size()) * 4, c.seq->num_computed_tokens);
    }
    EXPECT_EQ(total, d.num_batched_tokens);
    EXPECT_LE(total, scheduler_->config().max_num_batched_tokens);
    return d;
  }

  void RemoveAll() {
    for (auto& seq : seqs_) scheduler_->Remove(seq.get());
    EXPECT_EQ(allocator_->num_free(), allocator_->num_pages()) << "pages leaked";
  }

  std::unique_ptr<BlockAllocator> allocator_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

TEST_F(SchedulerTest, LongPromptIsChunkedByTheTokenBudget) {
  Init(/*num_pages=*/64, /*budget=*/8);
  Sequence* s = Add(20);
  std::vector<int> chunks;
  for (int i = 0; i < 3; ++i) chunks.push_back(Step().chunks.at(0).num_new_tokens);
  EXPECT_THAT(chunks, ::testing::ElementsAre(8, 8, 4));
  EXPECT_EQ(s->num_output_tokens(), 1);  // sampled after the last chunk only
  EXPECT_EQ(s->block_table.size(), 5u);
  EXPECT_EQ(Step().chunks.at(0).num_new_tokens, 1);  // then decodes
  RemoveAll();
}

TEST_F(SchedulerTest, DecodesGoFirstAndPrefillsFillTheRest) {
  Init(/*num_pages=*/64, /*budget=*/10);
  Sequence* a = Add(3);
  Sequence* b = Add(3);
  Step();  // both prefill (6 tokens)
  Sequence* c = Add(30);
  ScheduleDecision d = Step();
  ASSERT_EQ(d.chunks.size(), 3u);
  EXPECT_EQ(d.chunks[0].seq, a);
  EXPECT_EQ(d.chunks[1].seq, b);
  EXPECT_EQ(d.chunks[2].seq, c);
  EXPECT_EQ(d.chunks[2].num_new_tokens, 8);  // 10 - 2 decodes
  // Next step: the two decodes still go first, then c's running prefill continues.
  d = Step();
  ASSERT_EQ(d.chunks.size(), 3u);
  EXPECT_EQ(d.chunks[2].seq, c);
  EXPECT_EQ(d.chunks[2].num_new_tokens, 8);
  RemoveAll();
}

TEST_F(SchedulerTest, MaxNumSeqsCapsTheBatch) {
  Init(/*num_pages=*/64, /*budget=*/100, /*max_seqs=*/3);
  for (int i = 0; i < 5; ++i) Add(2);
  EXPECT_EQ(Step().chunks.size(), 3u);
  EXPECT_EQ(scheduler_->num_running(), 3);
  EXPECT_EQ(scheduler_->num_waiting(), 2);
  EXPECT_EQ(Step().chunks.size(), 3u);  // the running three decode; no room for more
  RemoveAll();
}

TEST_F(SchedulerTest, AdmissionIsFcfsAndNeverSkipsTheHead) {
  Init(/*num_pages=*/4, /*budget=*/100);
  Add(8);                   // 2 pages
  Sequence* big = Add(12);  // 3 pages: does not fit next to the first
  Sequence* small = Add(2);
  ScheduleDecision d = Step();
  ASSERT_EQ(d.chunks.size(), 1u);
  EXPECT_EQ(big->status, SequenceStatus::kWaiting);
  EXPECT_EQ(small->status, SequenceStatus::kWaiting);
  RemoveAll();
}

TEST_F(SchedulerTest, PreemptsTheYoungestWhenPagesRunOut) {
  Init(/*num_pages=*/4, /*budget=*/100);
  Sequence* a = Add(8);  // 2 full pages each
  Sequence* b = Add(8);
  Step();
  EXPECT_EQ(allocator_->num_free(), 0);
  // Both decode token 9, which needs a third page each: b (younger) is preempted for a.
  ScheduleDecision d = Step();
  ASSERT_EQ(d.preempted.size(), 1u);
  EXPECT_EQ(d.preempted[0], b);
  ASSERT_EQ(d.chunks.size(), 1u);
  EXPECT_EQ(d.chunks[0].seq, a);
  EXPECT_EQ(b->status, SequenceStatus::kWaiting);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_TRUE(b->block_table.empty());
  EXPECT_EQ(b->num_tokens(), 9);  // keeps its sampled token: it is recomputed, not resampled
  EXPECT_EQ(scheduler_->num_preemptions(), 1);
  RemoveAll();
}

TEST_F(SchedulerTest, PreemptsItselfWhenOnlyOlderSequencesHoldPages) {
  Init(/*num_pages=*/3, /*budget=*/100);
  Sequence* a = Add(4);  // one full page each
  Sequence* b = Add(4);
  Step();
  // Both need a second page for token 5 and one is free: a (older) takes it, and b, finding
  // no younger sequence to preempt, gives up its own page.
  ScheduleDecision d = Step();
  EXPECT_THAT(d.preempted, ::testing::ElementsAre(b));
  EXPECT_EQ(d.chunks.size(), 1u);
  // b comes back once a finishes.
  scheduler_->Remove(a);
  d = Step();
  ASSERT_EQ(d.chunks.size(), 1u);
  EXPECT_EQ(d.chunks[0].seq, b);
  EXPECT_EQ(d.chunks[0].num_new_tokens, 5);  // recomputes prompt + its sampled token
  RemoveAll();
}

// A prefix hit is taken before this step allocates anything: the allocations evict other cached
// pages, never the hit (here the hit pages are the least recently freed, so an allocation made
// first would have evicted them).
TEST(SchedulerPrefixCacheTest, HitIsAcquiredBeforeAllocationsEvict) {
  BlockAllocator allocator(4);
  Scheduler scheduler(SchedulerConfig{16, 64, 4, /*enable_prefix_caching=*/true}, &allocator);
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  const std::vector<uint64_t> hashes = PageHashes(tokens, 4);
  std::vector<int32_t> x = *allocator.Allocate(2);
  std::vector<int32_t> y = *allocator.Allocate(2);
  ASSERT_TRUE(*allocator.Register(x[0], hashes[0]));
  ASSERT_TRUE(*allocator.Register(x[1], hashes[1]));
  ASSERT_TRUE(*allocator.Register(y[0], 1));
  ASSERT_TRUE(*allocator.Register(y[1], 2));
  ASSERT_TRUE(allocator.Free(x).ok());
  ASSERT_TRUE(allocator.Free(y).ok());
  ASSERT_EQ(allocator.num_cached(), 4);

  Sequence r;  // no prefix of its own: needs one new page
  r.id = "r";
  r.tokens = {1, 2, 3, 4};
  r.num_prompt_tokens = 4;
  Sequence w;  // hits x (8 tokens) and needs one page for its last token
  w.id = "w";
  w.arrival = 1;
  w.tokens = tokens;
  w.num_prompt_tokens = 9;
  w.cache_prefix = true;
  w.page_hashes = hashes;
  scheduler.AddWaiting(&r);
  scheduler.AddWaiting(&w);
  ScheduleDecision d = scheduler.Schedule();
  ASSERT_EQ(d.chunks.size(), 2u);
  EXPECT_EQ(d.chunks[1].num_new_tokens, 1);
  ASSERT_EQ(w.block_table.size(), 3u);
  EXPECT_EQ(w.block_table[0], x[0]);
  EXPECT_EQ(w.block_table[1], x[1]);
  EXPECT_EQ(w.num_computed_tokens, 8);
  EXPECT_EQ(w.num_cached_tokens, 8);
  EXPECT_EQ(allocator.state(x[0]), PageState::kOwned);
  ASSERT_EQ(r.block_table.size(), 1u);
  EXPECT_TRUE(r.block_table[0] == y[0] || r.block_table[0] == y[1]);
  EXPECT_EQ(scheduler.num_prefix_cache_hits(), 8);
  EXPECT_EQ(scheduler.num_prefix_cache_queries(), 9);  // r does not cache: no query
  scheduler.Remove(&r);
  scheduler.Remove(&w);
  EXPECT_EQ(allocator.num_available(), 4);
}

// Preempting a sequence frees only the pages it alone holds: a page shared with another block
// table is not counted as room (counting it would over-commit the pool and crash the step).
TEST(SchedulerPrefixCacheTest, PreemptionCountsOnlyUnsharedPagesAsFreed) {
  BlockAllocator allocator(3);
  Scheduler scheduler(SchedulerConfig{16, 64, 4, true}, &allocator);
  Sequence a;  // prefilling: 8 of 13 tokens computed in pages 0 and 1, needs 2 more pages
  a.id = "a";
  a.tokens.assign(13, 1);
  a.num_prompt_tokens = 13;
  a.num_computed_tokens = 8;
  a.block_table = *allocator.Allocate(2);
  Sequence b;  // younger, prefilling too; shares both of a's pages and holds its own third page
  b.id = "b";
  b.arrival = 1;
  b.tokens.assign(12, 1);
  b.num_prompt_tokens = 12;
  b.num_computed_tokens = 11;
  ASSERT_TRUE(allocator.AddRef(a.block_table).ok());
  b.block_table = a.block_table;
  b.block_table.push_back((*allocator.Allocate(1))[0]);
  scheduler.AddRunning(&a);
  scheduler.AddRunning(&b);
  // Preempting b gives back one page, not three: a cannot run and gives up its own.
  ScheduleDecision d = scheduler.Schedule();
  EXPECT_EQ(d.preempted.size(), 2u);
  EXPECT_TRUE(d.chunks.empty());
  EXPECT_EQ(allocator.num_free(), 3);
  scheduler.Remove(&a);
  scheduler.Remove(&b);
}

}  // namespace
// A sequence in a launched step not yet collected (pipeline micro-batches) is neither scheduled
// nor preempted, however the pages run short; once collected it runs again.
TEST_F(SchedulerTest, InFlightSequenceIsNeverScheduledNorPreempted) {
  Init(/*num_pages=*/5, /*budget=*/64);
  Sequence* old = Add(8);    // 2 pages
  Sequence* young = Add(7);  // 2 pages
  ScheduleDecision d = Step();
  ASSERT_EQ(d.chunks.size(), 2u);
  // Both decode; `young` is in flight. Its next token is unknown: only `old` may run.
  young->in_flight = true;
  for (int i = 0; i < 12; ++i) {
    d = Step();
    for (const ScheduledChunk& c : d.chunks) EXPECT_NE(c.seq, young) << "step " << i;
    for (const Sequence* p : d.preempted) EXPECT_NE(p, young) << "step " << i;
    EXPECT_EQ(young->status, SequenceStatus::kRunning);
  }
  // `old` grew until the pages ran out: it preempted itself rather than the in-flight one.
  EXPECT_EQ(old->status, SequenceStatus::kWaiting);
  EXPECT_EQ(young->block_table.size(), 2u);
  // Nothing else is runnable while `young` is in flight and holds its pages.
  young->in_flight = false;
  d = Step();
  ASSERT_FALSE(d.chunks.empty());
  EXPECT_EQ(d.chunks[0].seq, young);
  RemoveAll();
}

}  // namespace tandem
