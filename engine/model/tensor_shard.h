// TensorShard: which slice of a Llama-family model one tensor-parallel rank holds (Megatron
// style, vLLM's KV-head rule).
//
//   column-parallel (rows of the [out, in] weight): q_proj, k_proj, v_proj (+ biases), gate_proj,
//     up_proj — rank r computes its heads and its share of the intermediate features;
//   row-parallel (columns): o_proj, down_proj — rank r's partial sums, all-reduced after;
//   replicated: embeddings, norms, q_norm / k_norm; lm_head on rank 0 only (it samples).
//
// Query heads and the intermediate size must divide by the TP size. KV heads split evenly when
// TP divides them; when TP exceeds them (and is a multiple), each rank holds the one KV head its
// query heads read, so TP / Hkv ranks hold a copy of each.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/model_config.h"

namespace tandem {

struct TensorShard {
  int rank = 0;
  int size = 1;

  bool whole() const { return size == 1; }
};

// Part of a weight along one dimension: rows [begin, begin + count) of dim 0 (the output
// features of an [out, in] nn.Linear weight: column-parallel) or of dim 1 (its input features:
// row-parallel); dim -1: the whole tensor.
struct TensorSlice {
  int dim = -1;
  int64_t begin = 0;
  int64_t count = 0;

  bool whole() const { return dim < 0; }
};

// The layers a pipeline stage holds, [first, first + count) (count -1: all of them), and
// whether it is the first stage (embeds the tokens) and the last (norm, lm_head, sampling).
struct StageLayers {
  int first = 0;
  int count = -1;
  bool first_stage = true;
  bool last_stage = true;
};

// Stage s of `pp` over `num_layers` layers: contiguous ranges, the first num_layers % pp
// stages one layer longer. Requires 1 <= pp <= num_layers.
StageLayers StageOf(int num_layers, int pp, int s);
// OK when `num_layers` splits over `pp` stages (1 <= pp <= num_layers).
absl::Status CheckPipelineParallel(const ModelConfig& config, int pp);

// OK when `config` splits over `tp` ranks; InvalidArgument naming the dimension otherwise.
absl::Status CheckTensorParallel(const ModelConfig& config, int tp);

// What one rank's decoder sees: num_q_heads, num_kv_heads and intermediate_size per rank,
// everything else (hidden, vocab, head_dim, ...) unchanged. Requires CheckTensorParallel.
ModelConfig ShardConfig(const ModelConfig& config, int tp);

// The rank's first query head, first KV head (global indices) and first intermediate feature.
int FirstQHead(const ModelConfig& config, TensorShard shard);
int FirstKvHead(const ModelConfig& config, TensorShard shard);
int64_t FirstIntermediate(const ModelConfig& config, TensorShard shard);

}  // namespace tandem
