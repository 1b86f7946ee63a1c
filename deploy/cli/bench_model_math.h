// What `tandem bench` compares against: the bytes a decode step must read (weights once, plus
// every sequence's KV) and the FLOPs of a prefill (GEMMs and causal attention), from the config.
#pragma once

#include <cstdint>

#include "engine/model/model_config.h"

namespace tandem::cli {

class ModelMath {
 public:
  explicit ModelMath(const ModelConfig& c) : c_(c) {}

  // Weight bytes of one forward pass in bf16: every layer's projections and norms, the final
  // norm and the LM head (the embedding is a gather of one row per token).
  double WeightBytes() const {
    const double h = c_.hidden_size, d = c_.head_dim, i = c_.intermediate_size;
    const double q = c_.num_q_heads * d, kv = c_.num_kv_heads * d;
    const double layer = h * (q + 2 * kv) + q * h + 2 * h * i + i * h + 2 * h;
    return 2.0 * (c_.num_layers * layer + h + static_cast<double>(c_.vocab_size) * h);
  }
  // A decode step of `batch` sequences at `context` tokens each: the weights once, each
  // sequence's K and V of every layer.
  double DecodeBytes(int batch, int context) const {
    const double kv_per_token = 2.0 * 2 * c_.num_layers * c_.num_kv_heads * c_.head_dim;
    return WeightBytes() + static_cast<double>(batch) * context * kv_per_token;
  }
  // One prompt of `len` tokens: 2 FLOPs per multiply-add of the projections, and causal
  // attention (QK^T and PV over the len (len + 1) / 2 visible pairs per head), plus the LM head
  // of the last token.
  double PrefillFlops(int len) const {
    const double h = c_.hidden_size, d = c_.head_dim, i = c_.intermediate_size;
    const double q = c_.num_q_heads * d, kv = c_.num_kv_heads * d;
    const double gemm = 2.0 * len * (h * (q + 2 * kv) + q * h + 3 * h * i);
    const double attention =
        2.0 * 2.0 * c_.num_q_heads * d * (static_cast<double>(len) * (len + 1) / 2);
    return c_.num_layers * (gemm + attention) + 2.0 * h * c_.vocab_size;
  }

 private:
  ModelConfig c_;
};

}  // namespace tandem::cli
