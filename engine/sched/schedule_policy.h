// Scheduling policies: given the running and waiting sequences and the free page count, decide
// which sequences run this step with how many new tokens, and which running ones to preempt.
// A policy only reads; it returns its decision as a value and the Scheduler applies it.
#pragma once

#include <deque>
#include <vector>

#include "engine/kv/block_allocator.h"
#include "engine/sched/sequence.h"

namespace tandem {

struct SchedulerConfig {
  int max_num_seqs = 256;             // sequences per step
  int max_num_batched_tokens = 2048;  // new tokens per step (prefill chunks + decodes)
  int page_size = 16;
  // Admitted sequences with cache_prefix reuse the longest cached prefix of full pages.
  bool enable_prefix_caching = false;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int num_new_tokens = 0;  // tokens [num_computed_tokens, + num_new_tokens) run this step
  int num_new_pages = 0;   // pages to append to seq->block_table before the step
  // Of a decode's new tokens, how many are proposals (seq->spec_tokens) after its last token:
  // num_new_tokens = 1 + num_spec_tokens, all of them logits rows (a verify step).
  int num_spec_tokens = 0;
  // A waiting sequence's prefix hit: hashed pages that become the start of its block table
  // (before the new pages), so its first cached_pages.size() * page_size tokens are computed.
  std::vector<int32_t> cached_pages = {};
};

struct ScheduleDecision {
  // Batch order: decodes first (those without proposals, then verify chunks), then prefill
  // chunks (running ones, then newly admitted).
  std::vector<ScheduledChunk> chunks;
  // Running sequences whose pages are freed; they go back to the front of the waiting queue
  // and recompute their KV later (preemption by recompute).
  std::vector<Sequence*> preempted;
  int num_batched_tokens = 0;

  bool empty() const { return chunks.empty(); }
};

class SchedulePolicy {
 public:
  virtual ~SchedulePolicy() = default;
  // `running` is ordered oldest first (by Sequence::arrival); `waiting` is in admission order.
  // `num_free_pages` counts the pages Allocate may take: free and cached (evictable).
  virtual ScheduleDecision Schedule(const std::vector<Sequence*>& running,
                                    const std::deque<Sequence*>& waiting,
                                    int num_free_pages) const = 0;
};

// The longest cached prefix `seq` may reuse: hashed pages of its full pages, leaving at least
// its last token to compute (so that the last position's logits exist).
std::vector<int32_t> PrefixHit(const BlockAllocator& cache, const Sequence& seq, int page_size);

// vLLM-v1-style continuous batching with chunked prefill: decodes first, then running prefills,
// then waiting requests in FCFS order, each taking what is left of the token budget (a prompt
// longer than the budget is split into chunks across steps). When pages run out, the youngest
// running sequence not yet scheduled this step is preempted (possibly the one asking). No new
// request is admitted in a step that preempts, and admission never skips the queue head.
// With `allocator`, preempting a sequence counts only the pages it alone holds as freed (block
// tables share pages: prefix hits, n > 1); without, every page of a block table is its own.
// With enable_prefix_caching (and the allocator), a waiting sequence that caches starts from
// its PrefixHit: its pages cost nothing new, but the hit pages now cached (evictable) count
// against the free pages since taking them makes them unevictable.
class FcfsChunkedPolicy : public SchedulePolicy {
 public:
  explicit FcfsChunkedPolicy(const SchedulerConfig& config,
                             const BlockAllocator* allocator = nullptr)
      : config_(config), allocator_(allocator) {}
  ScheduleDecision Schedule(const std::vector<Sequence*>& running,
                            const std::deque<Sequence*>& waiting,
                            int num_free_pages) const override;

 private:
  SchedulerConfig config_;
  const BlockAllocator* allocator_;
};

}  // namespace tandem
