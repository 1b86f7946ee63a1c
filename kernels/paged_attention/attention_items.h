// The work items of a paged-attention launch and the batch shape they are planned from
// (attention_plan.h explains rows, items, splits and merges). Shared by the kernels, the CUDA
// plan (attention_plan.h) and its host-side decode planner (decode_plan.h).
#pragma once

#include <cstdint>

namespace tandem {

inline constexpr int kDecodeRows = 16;        // packed rows per decode item (one mma row tile)
inline constexpr int kPrefillRows = 128;      // packed rows per prefill item (4 warps x 32)
inline constexpr int kMaxDecodeSplits = 256;  // splits of one key range, at most

struct AttentionWorkItem {
  int32_t seq = 0;
  int32_t kv_head = 0;
  int32_t row_begin = 0;  // first packed row
  int32_t num_rows = 0;
  int32_t key_begin = 0;  // key positions [key_begin, key_end)
  int32_t key_end = 0;
  int32_t partial = -1;  // workspace slot of the partial result; -1: write the output
  int32_t merge = -1;    // the merge item this split belongs to; -1: none
  // Copies of the batch layout, so a kernel starts its loads without first reading it:
  int32_t token_begin = 0;  // query_start[seq]: the row of q/out of the sequence's first token
  int32_t first_pos = 0;    // seq_lens[seq] - q_len: the position of that token
};

struct AttentionMergeItem {
  int32_t seq = 0;
  int32_t kv_head = 0;
  int32_t row_begin = 0;
  int32_t num_rows = 0;
  int32_t first_partial = 0;  // the splits use partial slots [first_partial, + num_splits)
  int32_t num_splits = 0;
  int32_t token_begin = 0;  // query_start[seq]
};

// Host-side copy of what a plan needs to know about the batch (all host pointers).
struct AttentionBatchShape {
  const int32_t* seq_lens = nullptr;     // [num_seqs]
  const int32_t* query_start = nullptr;  // [num_seqs + 1]
  int num_seqs = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
};

}  // namespace tandem
