// Sequence: the engine's state for one request, shared by the scheduler, the model runner and
// the output processor. Tokens are the prompt followed by the generated tokens; the KV of the
// first `num_computed_tokens` of them is in the pages of `block_table` (page ids, one list for
// all layers, kernels/common/kv_layout.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/request.h"

namespace tandem {

enum class SequenceStatus {
  kWaiting,      // queued (new, or preempted: its KV was dropped and will be recomputed)
  kRunning,      // has pages; prefilling or decoding
  kPrefillDone,  // prefill_only request done: pages kept for the KV transfer
  kReserved,     // decode side: pages reserved for an incoming KV transfer
  kForkWaiting,  // a sibling (EngineRequest::siblings) waiting for its parent's prompt KV
  kFinished,
};

struct Sequence {
  std::string id;
  int64_t arrival = 0;  // admission order: lower is older (FCFS, preemption picks the highest)
  std::vector<int32_t> tokens;  // prompt then output
  int num_prompt_tokens = 0;
  int num_computed_tokens = 0;  // tokens whose KV is in the cache
  std::vector<int32_t> block_table;
  SequenceStatus status = SequenceStatus::kWaiting;
  SamplingParams sampling;
  bool prefill_only = false;
  bool keep_kv_when_finished = false;  // EngineRequest::keep_kv_when_finished
  uint64_t seed = 0;                   // sampling.seed, or derived from the id
  bool abort_requested = false;
  // In a launched step not yet collected (async scheduling, pipeline micro-batches): its next
  // token is not known yet, so the scheduler neither schedules nor preempts it.
  bool in_flight = false;
  // Its final prefill chunk was announced to the KV push listener (engine/kv_push.h): its
  // pages are freed only after the listener's BeforeFree.
  bool kv_push_announced = false;
  // Speculative decoding (engine/spec): tokens proposed this step after `tokens` (the step
  // verifies them; never part of `tokens` until accepted), and the distribution each was drawn
  // from ([spec_tokens.size()][vocab]; empty: point masses).
  std::vector<int32_t> spec_tokens;
  std::vector<std::vector<float>> spec_probs;

  // SamplingParams::prompt_logprobs: the entries of prompt tokens 1 .. computed so far (entry i
  // scores tokens[i + 1]); moved into the output that carries the first token.
  std::vector<TokenLogprobs> prompt_logprobs;

  // Prefix caching (engine/kv/block_allocator.h). A sequence that caches looks its prefix up
  // when it is admitted from the waiting queue and hashes its pages as they fill.
  bool cache_prefix = false;
  // Chained hashes of the full pages of `tokens` (base/page_hash.h), page 0 first; the engine
  // extends it as tokens are appended.
  std::vector<uint64_t> page_hashes;
  // block_table[0, num_hashed_pages) are hashed (prefix hits, or pages registered once full).
  int num_hashed_pages = 0;
  // Prompt tokens found in the cache when the sequence was first admitted; -1 before that.
  int num_cached_tokens = -1;

  // Siblings (EngineRequest::siblings): the parent lists the ones waiting for its prompt KV
  // (kForkWaiting, owned by the engine like every sequence), each of which points back to it.
  std::vector<Sequence*> fork_children;
  Sequence* fork_parent = nullptr;

  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  // Tokens still to feed through the model before the next sample.
  int num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens; }
  bool is_decode() const { return num_uncomputed_tokens() == 1 && num_output_tokens() > 0; }
};

}  // namespace tandem
