// The host side of a decode launch's plan (AttentionPlan::BuildDecode / PlanDecode,
// attention_plan.h): which work items the decode kernels run, and which CTA runs each. Pure host
// code, tested without a GPU; AttentionPlan lands what it writes in device memory.
//
// Three layouts, CTA c of `slots` resident CTAs taking items c, c + slots, c + 2 slots, ...:
//  - split (FlashDecoding, small batches): key ranges longer than the GPU's share of the batch's
//    keys are split into chunks, each an item with a partial result and a merge;
//  - strided (large batches): one item per unit (sequence, KV head, packed rows), whole ranges;
//  - balanced: the strided units cut between CTAs so that each computes an even share of the
//    tiles (decode_balance.h), where the strided layout leaves some CTAs with far more work than
//    others (ragged lengths; WORKLOG.md step 18). Units are balanced as row groups (sequence,
//    rows) over slots / num_kv_heads groups of num_kv_heads CTAs, head h of each piece on CTA
//    g * num_kv_heads + h: the heads of a page are read at the same time, as in the strided
//    layout. A cut unit becomes split items with a merge; empty items (no rows, no keys) fill
//    the places of CTAs with fewer pieces.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/paged_attention/attention_items.h"
#include "kernels/paged_attention/decode_balance.h"

namespace tandem {

inline constexpr int kDecodeTileKeys = 64;  // keys per decode tile: splits and cuts are whole tiles

// When a plan without splits is balanced.
enum class DecodeBalance : uint8_t {
  kAuto,   // where the strided layout's busiest CTA has >= 1.5x the even share of tiles
  kOff,    // never (strided)
  kForce,  // always (benchmarks)
};

// The setting TANDEM_DECODE_BALANCE's value names: "auto" (or null / empty), "off" or "force";
// InvalidArgument for another value.
absl::StatusOr<DecodeBalance> ParseDecodeBalance(const char* value);

// The order of a split or strided plan's items, and so which units the resident CTAs read at
// the same time (CTA c takes items c, c + slots, ...). A benchmark switch: which of the two
// makes the better use of DRAM is a measurement (WORKLOG.md step 20).
enum class DecodeOrder : uint8_t {
  kSequenceMajor,  // (sequence, KV head, rows): CTAs c .. c + H - 1 read the H heads of a page
  kHeadMajor,      // (KV head, sequence, rows): the resident CTAs read one head of many sequences
                   // (FlashInfer's grid order); balanced plans keep their own layout
};

// The setting TANDEM_DECODE_ORDER's value names: "seq" (or null / empty) or "head";
// InvalidArgument for another value.
absl::StatusOr<DecodeOrder> ParseDecodeOrder(const char* value);

struct DecodePlanOptions {
  int slots = 1;           // decode CTAs resident at once (AttentionPlan::DecodeSlots)
  int items_per_slot = 1;  // the split target: the batch's keys over slots * items_per_slot
  DecodeBalance balance = DecodeBalance::kAuto;
  DecodeOrder order = DecodeOrder::kSequenceMajor;
};

// The capacities of the arrays a plan is written to (AttentionPlan::Capacity's).
struct DecodePlanLimits {
  int max_items = 0;
  int max_merges = 0;
  int max_partials = 0;
};

struct DecodePlanCounts {
  int items = 0;
  int merges = 0;
  int partials = 0;
  bool split_kv = false;  // the split layout (else strided or balanced)
};

// Packed rows of sequence s of `b` (q_len x the GQA group), and the keys its packed rows
// [.., row_end) can see (the last row's causal limit).
int PackedRows(const AttentionBatchShape& b, int s);
int RowsKeyEnd(const AttentionBatchShape& b, int s, int row_end);

class DecodePlanner {
 public:
  // Writes the decode plan of `b` to items[limits.max_items] and merges[limits.max_merges]
  // (partial slots numbered from 0) and returns its counts; ResourceExhausted when the split or
  // strided plan does not fit (a balanced one that does not fit stays strided), InvalidArgument
  // for a sequence with fewer keys than new tokens or head counts that do not divide.
  absl::StatusOr<DecodePlanCounts> Plan(const AttentionBatchShape& b,
                                        const DecodePlanOptions& options,
                                        const DecodePlanLimits& limits, AttentionWorkItem* items,
                                        AttentionMergeItem* merges);

 private:
  // Rewrites the strided plan in items[0, counts.items) as a balanced one where options say so.
  void Balance(const DecodePlanOptions& options, const DecodePlanLimits& limits, int num_kv_heads,
               AttentionWorkItem* items, AttentionMergeItem* merges, DecodePlanCounts& counts);
  // From units_ and unit_tiles_: the row groups (row_units_, row_tiles_, row_head_stride_).
  void CollectRowGroups();
  // Lays pieces_ out as the balanced plan (or leaves the strided one where it does not fit).
  void WriteBalanced(int slots, int heads, const DecodePlanLimits& limits, AttentionWorkItem* items,
                     AttentionMergeItem* merges, DecodePlanCounts& counts);

  // Balance's scratch, kept across steps: the strided plan's items and their tile counts; the
  // row groups' KV head 0 units, tiles and head strides; the pieces, and the pieces placed on
  // each CTA group so far.
  std::vector<AttentionWorkItem> units_;
  std::vector<int32_t> unit_tiles_;
  std::vector<int32_t> row_units_;
  std::vector<int32_t> row_tiles_;
  std::vector<int32_t> row_head_stride_;
  std::vector<DecodeUnitPiece> pieces_;
  std::vector<int> group_pieces_;
};

}  // namespace tandem
