// AttentionPlan: the host-side schedule of one paged-attention launch, built once per step into
// fixed-capacity device buffers so a CUDA graph captured with one plan replays with the next.
//
// Rows. For a sequence and one KV head, the query rows are packed "token-major": packed row
// r = token * group + g is query token `token` of the sequence (relative to its first new token)
// and query head kv_head * group + g, where group = num_q_heads / num_kv_heads. Packing the heads
// of a KV group into the rows of one tile lets each K/V tile be read once for all of them (GQA).
//
// Work items. A work item is (sequence, KV head, a run of packed rows, a range of keys). Decode
// items hold up to kDecodeRows rows and one split of the key range (FlashDecoding, split-KV);
// prefill items hold up to kPrefillRows rows and every key their rows can see (causal). An item
// whose key range is one of several splits writes a partial result (bf16 output normalised by
// its own softmax sum, plus the fp32 log2-sum-exp of each row) to the workspace and bumps its merge
// item's arrival counter; the CTA that arrives last combines the splits of that (sequence, KV
// head, rows) and resets the counter to zero for the next launch. An item that covers all keys
// writes the output directly.
//
// The kernels read the item counts from device memory and loop over items with a fixed grid,
// so a captured graph stays valid while the counts stay within capacity. CTA c of a grid of
// DecodeSlots() CTAs takes items c, c + grid, c + 2 grid, ...; a decode plan without splits whose
// units (sequence, KV head, rows) would leave some CTAs with far more tiles than others is
// balanced: the units are cut between CTAs so each computes an even share of the tiles, with a
// merge at each cut and empty items (no rows, no keys) where a CTA has fewer pieces. The decode
// plans are built on the host by decode_plan.h's DecodePlanner (tested without a GPU).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/common/stream.h"
#include "kernels/paged_attention/attention_items.h"
#include "kernels/paged_attention/decode_plan.h"

namespace tandem {

class AttentionPlan {
 public:
  // Capacities: work items, merge items and partial slots. The workspace holds
  // max_partials x kDecodeRows x max_head_dim bf16 plus the fp32 row log-sums.
  struct Capacity {
    int max_items = 1 << 16;
    int max_merges = 1 << 14;
    int max_partials = 4096;
    int max_head_dim = 128;
  };
  static absl::StatusOr<std::unique_ptr<AttentionPlan>> Create(const Capacity& capacity);
  ~AttentionPlan();
  AttentionPlan(const AttentionPlan&) = delete;
  AttentionPlan& operator=(const AttentionPlan&) = delete;

  // Fills the plan for a decode launch (any q_len works; meant for q_len * group <= 16) and
  // uploads it on `stream`. Splits long key ranges so that the GPU is filled. Waits for the
  // previous upload from this plan's staging buffer to finish before overwriting it.
  absl::Status BuildDecode(const AttentionBatchShape& shape, cudaStream_t stream);
  // Fills the plan for a prefill launch: tiles of kPrefillRows rows, no splits, longest first.
  absl::Status BuildPrefill(const AttentionBatchShape& shape, cudaStream_t stream);

  // The same two plans, built on the host only (no upload): host_items(), host_merges() and
  // host_counts() then hold what BuildDecode / BuildPrefill would upload. A caller that moves
  // a whole step's inputs in one copy (the engine's CUDA backend) packs them with the rest and
  // lands them in device_items(), device_merges() and device_counts() itself, before the
  // launches that read the plan.
  absl::Status PlanDecode(const AttentionBatchShape& shape);
  absl::Status PlanPrefill(const AttentionBatchShape& shape);
  const AttentionWorkItem* host_items() const;
  const AttentionMergeItem* host_merges() const;
  const int32_t* host_counts() const;  // [2]: items, merges
  AttentionWorkItem* device_items() const { return items_; }
  AttentionMergeItem* device_merges() const { return merges_; }
  int32_t* device_counts() const { return counts_; }

  // Device views used by the launchers.
  const AttentionWorkItem* items() const { return items_; }
  const AttentionMergeItem* merges() const { return merges_; }
  const int32_t* counts() const { return counts_; }            // device [2]: items, merges
  int32_t* merge_counters() const { return merge_counters_; }  // device [max_merges], zero at rest
  uint16_t* partial_out() const { return partial_out_; }       // bf16 bits
  float* partial_lse() const { return partial_lse_; }
  const Capacity& capacity() const { return capacity_; }
  // Device memory the plan's buffers take (for a caller's memory budget).
  int64_t DeviceBytes() const;
  // Host copies of the counts of the last build (for tests and benchmarks).
  int num_items() const { return num_items_; }
  int num_merges() const { return num_merges_; }
  int num_partials() const { return num_partials_; }
  // Whether the last BuildDecode / PlanDecode split key ranges to fill the GPU (FlashDecoding:
  // small batches, a few tiles an item; the split decode kernel's plans). False for a plan of
  // whole key ranges, or one that cuts them only to even out the CTAs' work (balanced: merges at
  // the cuts, decode_plan.h).
  bool split_kv() const { return split_kv_; }

  // Number of decode CTAs the GPU runs at once: sets the split target.
  static int DecodeSlots();

 private:
  explicit AttentionPlan(const Capacity& capacity) : capacity_(capacity) {}
  absl::Status Upload(cudaStream_t stream);
  void SetHostCounts();  // writes num_items_ / num_merges_ into host_counts()

  Capacity capacity_;
  AttentionWorkItem* items_ = nullptr;    // device [max_items]
  AttentionMergeItem* merges_ = nullptr;  // device [max_merges]
  int32_t* counts_ = nullptr;             // device [2]
  int32_t* merge_counters_ = nullptr;     // device [max_merges]
  uint16_t* partial_out_ = nullptr;       // device [max_partials][kDecodeRows][max_head_dim] bf16
  float* partial_lse_ = nullptr;          // device [max_partials][kDecodeRows], log2 domain
  // Pinned staging: items, then merges, then counts. Reused after `uploaded_` completes.
  uint8_t* staging_ = nullptr;
  struct CUevent_st* uploaded_ = nullptr;
  int num_items_ = 0;
  int num_merges_ = 0;
  int num_partials_ = 0;
  bool split_kv_ = false;
  DecodePlanner decode_planner_;  // its scratch is kept across steps
};

}  // namespace tandem
