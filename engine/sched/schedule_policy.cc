#include "engine/sched/schedule_policy.h"

#include <algorithm>

#include "absl/types/span.h"
#include "engine/kv/block_allocator.h"

namespace tandem {
namespace {

// Working state of one Schedule() call.
struct Plan {
  const std::vector<Sequence*>& running;
  const BlockAllocator* allocator;  // null: every page has one holder
  int free_pages;
  int budget;
  int seqs_left;
  std::vector<bool> scheduled;
  std::vector<bool> preempted;
  ScheduleDecision decision;

  // Pages that preempting `seq` gives back: those it alone holds (a page shared with another
  // block table stays; counting it as kept when both holders go is merely conservative).
  int Freed(const Sequence& seq) const {
    if (allocator == nullptr) return static_cast<int>(seq.block_table.size());
    int n = 0;
    for (int32_t p : seq.block_table) n += allocator->ref_count(p) == 1;
    return n;
  }

  // Preempts the youngest running sequence other than `asking` that is neither scheduled nor
  // preempted yet. False if there is none.
  bool PreemptYoungest(size_t asking) {
    for (size_t j = running.size(); j-- > 0;) {
      if (j == asking || scheduled[j] || preempted[j]) continue;
      preempted[j] = true;
      free_pages += Freed(*running[j]);
      decision.preempted.push_back(running[j]);
      return true;
    }
    return false;
  }

  void Add(Sequence* seq, int num_new_tokens, int num_new_pages, int num_spec_tokens = 0,
           std::vector<int32_t> cached_pages = {}) {
    decision.chunks.push_back(
        {seq, num_new_tokens, num_new_pages, num_spec_tokens, std::move(cached_pages)});
    decision.num_batched_tokens += num_new_tokens;
    free_pages -= num_new_pages;
    budget -= num_new_tokens;
    --seqs_left;
  }

  // Schedules running[i] for as many tokens as the budget allows, preempting younger sequences
  // (or, failing that, running[i] itself) when the pages do not suffice.
  void ScheduleRunning(size_t i, int page_size) {
    if (preempted[i] || scheduled[i] || budget <= 0 || seqs_left <= 0) return;
    Sequence* seq = running[i];
    // A decode with proposals verifies them in the same step (as many as the budget allows).
    const int spec = seq->is_decode() ? static_cast<int>(seq->spec_tokens.size()) : 0;
    const int n = std::min(seq->num_uncomputed_tokens() + spec, budget);
    if (n <= 0) return;
    const int need = PagesForTokens(seq->num_computed_tokens + n, page_size) -
                     static_cast<int>(seq->block_table.size());
    while (need > free_pages && PreemptYoungest(i)) {
    }
    if (need > free_pages) {
      preempted[i] = true;
      free_pages += Freed(*seq);
      decision.preempted.push_back(seq);
      return;
    }
    scheduled[i] = true;
    Add(seq, n, std::max(need, 0), std::max(0, n - seq->num_uncomputed_tokens()));
  }
};

}  // namespace

std::vector<int32_t> PrefixHit(const BlockAllocator& cache, const Sequence& seq, int page_size) {
  const size_t max_pages =
      std::min(seq.page_hashes.size(), static_cast<size_t>((seq.num_tokens() - 1) / page_size));
  return cache.Lookup(absl::MakeConstSpan(seq.page_hashes.data(), max_pages));
}

ScheduleDecision FcfsChunkedPolicy::Schedule(const std::vector<Sequence*>& running,
                                             const std::deque<Sequence*>& waiting,
                                             int num_free_pages) const {
  Plan plan{running,
            allocator_,
            num_free_pages,
            config_.max_num_batched_tokens,
            config_.max_num_seqs,
            std::vector<bool>(running.size()),
            std::vector<bool>(running.size()),
            {}};
  // Plain decodes, then decodes verifying proposals (1 + k tokens), then prefills: the CUDA
  // backend runs the leading one-token sequences with its decode attention kernel.
  for (size_t i = 0; i < running.size(); ++i) {
    if (running[i]->is_decode() && running[i]->spec_tokens.empty()) {
      plan.ScheduleRunning(i, config_.page_size);
    }
  }
  for (size_t i = 0; i < running.size(); ++i) {
    if (running[i]->is_decode() && !running[i]->spec_tokens.empty()) {
      plan.ScheduleRunning(i, config_.page_size);
    }
  }
  for (size_t i = 0; i < running.size(); ++i) {
    if (!running[i]->is_decode()) plan.ScheduleRunning(i, config_.page_size);
  }
  if (!plan.decision.preempted.empty()) return std::move(plan.decision);
  for (Sequence* seq : waiting) {
    if (plan.budget <= 0 || plan.seqs_left <= 0) break;
    std::vector<int32_t> hit;
    int hit_cost = 0;  // hit pages that leave the evictable set
    if (config_.enable_prefix_caching && allocator_ != nullptr && seq->cache_prefix &&
        seq->block_table.empty()) {
      hit = PrefixHit(*allocator_, *seq, config_.page_size);
      for (int32_t p : hit) hit_cost += allocator_->state(p) == PageState::kCached;
    }
    const int computed =
        seq->num_computed_tokens + static_cast<int>(hit.size()) * config_.page_size;
    const int n = std::min(seq->num_tokens() - computed, plan.budget);
    const int need = PagesForTokens(computed + n, config_.page_size) -
                     static_cast<int>(seq->block_table.size() + hit.size());
    if (need + hit_cost > plan.free_pages) break;
    plan.free_pages -= hit_cost;
    plan.Add(seq, n, need, /*num_spec_tokens=*/0, std::move(hit));
  }
  return std::move(plan.decision);
}

}  // namespace tandem
