#include "engine/sched/scheduler.h"

#include <algorithm>

#include "base/check.h"

namespace tandem {
namespace {

template <typename Container>
bool Erase(Container& c, Sequence* seq) {
  auto it = std::find(c.begin(), c.end(), seq);
  if (it == c.end()) return false;
  c.erase(it);
  return true;
}

}  // namespace

Scheduler::Scheduler(const SchedulerConfig& config, BlockAllocator* allocator,
                     std::unique_ptr<SchedulePolicy> policy)
    : config_(config), allocator_(allocator), policy_(std::move(policy)) {
  CHECK(allocator_ != nullptr);
  CHECK_GE(config_.max_num_seqs, 1);
  CHECK_GE(config_.max_num_batched_tokens, 1);
  CHECK_GE(config_.page_size, 1);
  if (policy_ == nullptr) {
    policy_ = std::make_unique<FcfsChunkedPolicy>(config_, allocator_);
  }
}

void Scheduler::AddWaiting(Sequence* seq) {
  CHECK(seq->block_table.empty()) << seq->id;
  seq->status = SequenceStatus::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::AddRunning(Sequence* seq) {
  seq->status = SequenceStatus::kRunning;
  InsertRunning(seq);
}

void Scheduler::InsertRunning(Sequence* seq) {
  auto it = std::upper_bound(running_.begin(), running_.end(), seq,
                             [](Sequence* a, Sequence* b) { return a->arrival < b->arrival; });
  running_.insert(it, seq);
}

void Scheduler::FreePages(Sequence* seq) {
  CHECK_OK(allocator_->Free(seq->block_table));
  seq->block_table.clear();
  seq->num_hashed_pages = 0;
}

void Scheduler::Remove(Sequence* seq) {
  if (!Erase(running_, seq)) Erase(waiting_, seq);
  FreePages(seq);
}

void Scheduler::Detach(Sequence* seq) { CHECK(Erase(running_, seq)) << seq->id; }

void Scheduler::Preempt(Sequence* seq) {
  CHECK(Erase(running_, seq)) << seq->id;
  FreePages(seq);
  seq->num_computed_tokens = 0;
  seq->spec_tokens.clear();
  seq->spec_probs.clear();
  seq->status = SequenceStatus::kWaiting;
  waiting_.push_front(seq);
  ++num_preemptions_;
}

ScheduleDecision Scheduler::Schedule() {
  // Sequences in a step still in flight are not the policy's to schedule or preempt.
  std::vector<Sequence*> ready;
  const std::vector<Sequence*>* running = &running_;
  if (std::any_of(running_.begin(), running_.end(), [](Sequence* s) { return s->in_flight; })) {
    for (Sequence* seq : running_) {
      if (!seq->in_flight) ready.push_back(seq);
    }
    running = &ready;
  }
  ScheduleDecision decision = policy_->Schedule(*running, waiting_, allocator_->num_available());
  for (const ScheduledChunk& chunk : decision.chunks) CHECK(!chunk.seq->in_flight) << chunk.seq->id;
  // Youngest first, so the oldest preempted sequence ends up at the very front.
  for (Sequence* seq : decision.preempted) Preempt(seq);
  for (const ScheduledChunk& chunk : decision.chunks) {
    Sequence* seq = chunk.seq;
    if (seq->status != SequenceStatus::kWaiting || !config_.enable_prefix_caching ||
        !seq->cache_prefix) {
      continue;
    }
    CHECK(seq->block_table.empty()) << seq->id;
    CHECK_OK(allocator_->Acquire(chunk.cached_pages));
    seq->block_table = chunk.cached_pages;
    seq->num_hashed_pages = static_cast<int>(chunk.cached_pages.size());
    const int hit_tokens = seq->num_hashed_pages * config_.page_size;
    seq->num_computed_tokens = hit_tokens;
    if (seq->num_cached_tokens < 0) seq->num_cached_tokens = hit_tokens;
    num_prefix_cache_queries_ += seq->num_tokens();
    num_prefix_cache_hits_ += hit_tokens;
  }
  for (const ScheduledChunk& chunk : decision.chunks) {
    Sequence* seq = chunk.seq;
    absl::StatusOr<std::vector<int32_t>> pages = allocator_->Allocate(chunk.num_new_pages);
    CHECK(pages.ok()) << "policy over-committed pages: " << pages.status();
    seq->block_table.insert(seq->block_table.end(), pages->begin(), pages->end());
    if (seq->status == SequenceStatus::kWaiting) {
      CHECK(Erase(waiting_, seq)) << seq->id;
      AddRunning(seq);
    }
  }
  return decision;
}

}  // namespace tandem
