#include "engine/model/tensor_shard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status CheckTensorParallel(const ModelConfig& c, int tp) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", tp, ": ", what));
  };
  if (tp < 1) return bad("must be >= 1");
  if (c.num_q_heads % tp != 0) {
    return bad(absl::StrCat("the model's ", c.num_q_heads, " attention heads do not divide by it"));
  }
  if (c.intermediate_size % tp != 0) {
    return bad(absl::StrCat("the model's intermediate_size ", c.intermediate_size,
                            " does not divide by it"));
  }
  if (c.num_kv_heads % tp != 0 && tp % c.num_kv_heads != 0) {
    return bad(absl::StrCat("neither divides nor is a multiple of the model's ", c.num_kv_heads,
                            " KV heads"));
  }
  return absl::OkStatus();
}

ModelConfig ShardConfig(const ModelConfig& c, int tp) {
  ModelConfig s = c;
  s.num_q_heads = c.num_q_heads / tp;
  s.num_kv_heads = std::max(1, c.num_kv_heads / tp);
  s.intermediate_size = c.intermediate_size / tp;
  return s;
}

StageLayers StageOf(int num_layers, int pp, int s) {
  const int base = num_layers / pp, extra = num_layers % pp;
  StageLayers st;
  st.first = s * base + std::min(s, extra);
  st.count = base + (s < extra ? 1 : 0);
  st.first_stage = s == 0;
  st.last_stage = s == pp - 1;
  return st;
}

absl::Status CheckPipelineParallel(const ModelConfig& c, int pp) {
  if (pp < 1 || pp > c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline_parallel ", pp, ": must be in [1, ",
                                                   "the model's ", c.num_layers, " layers]"));
  }
  return absl::OkStatus();
}

int FirstQHead(const ModelConfig& c, TensorShard s) { return s.rank * (c.num_q_heads / s.size); }

int FirstKvHead(const ModelConfig& c, TensorShard s) {
  if (c.num_kv_heads >= s.size) return s.rank * (c.num_kv_heads / s.size);
  // Replicated: the KV head of the rank's query heads (a group of Hq / Hkv query heads reads
  // one KV head, and the rank's Hq / tp heads lie inside one group).
  return FirstQHead(c, s) / (c.num_q_heads / c.num_kv_heads);
}

int64_t FirstIntermediate(const ModelConfig& c, TensorShard s) {
  return int64_t{s.rank} * (c.intermediate_size / s.size);
}

}  // namespace tandem
