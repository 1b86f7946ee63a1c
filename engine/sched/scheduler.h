// Scheduler: owns the waiting queue and the running set, asks its SchedulePolicy for a decision
// each step and applies it to the sequences and the BlockAllocator (preempted pages freed, new
// pages appended to block tables). Pure CPU, single-threaded (the engine loop).
//
// Sequence lifetime: the engine owns the Sequence objects; the scheduler holds pointers from
// Add*() until Remove().
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "engine/sched/schedule_policy.h"
#include "engine/sched/sequence.h"

namespace tandem {

class Scheduler {
 public:
  // `allocator` must outlive the scheduler. A null policy means FcfsChunkedPolicy(config).
  Scheduler(const SchedulerConfig& config, BlockAllocator* allocator,
            std::unique_ptr<SchedulePolicy> policy = nullptr);

  // Queues a new request (status kWaiting, no pages).
  void AddWaiting(Sequence* seq);
  // Adds a sequence that already holds the KV of its computed tokens (decode side, after a
  // transfer) straight to the running set.
  void AddRunning(Sequence* seq);
  // Takes `seq` out of whichever queue holds it and frees its pages.
  void Remove(Sequence* seq);
  // Takes a running `seq` out of the running set, keeping its pages (prefill_only requests).
  void Detach(Sequence* seq);

  // Decides this step's batch and applies it: preempted sequences lose their pages and return
  // to the front of the waiting queue; scheduled ones get their new pages and run. A prefix hit
  // is acquired before any page is allocated, so this step's allocations cannot evict it.
  // Running sequences in flight (Sequence::in_flight: in a launched step not yet collected) are
  // left out: neither scheduled nor preempted.
  ScheduleDecision Schedule();

  const SchedulerConfig& config() const { return config_; }
  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Prefix caching: tokens of the sequences admitted from the waiting queue (queries) and of
  // their prefixes found in the cache (hits); vLLM's prefix_cache_queries / prefix_cache_hits.
  int64_t num_prefix_cache_queries() const { return num_prefix_cache_queries_; }
  int64_t num_prefix_cache_hits() const { return num_prefix_cache_hits_; }

 private:
  void InsertRunning(Sequence* seq);  // keeps running_ ordered by arrival
  void Preempt(Sequence* seq);
  void FreePages(Sequence* seq);

  SchedulerConfig config_;
  BlockAllocator* allocator_;
  std::unique_ptr<SchedulePolicy> policy_;
  std::vector<Sequence*> running_;  // oldest first
  std::deque<Sequence*> waiting_;   // admission order; preempted ones at the front
  int64_t num_preemptions_ = 0;
  int64_t num_prefix_cache_queries_ = 0;
  int64_t num_prefix_cache_hits_ = 0;
};

}  // namespace tandem
