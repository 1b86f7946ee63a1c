// What `tandem bench` compares against: the bytes a decode step must read (weights once, plus
// every sequence's KV) and the FLOPs of a prefill (GEMMs and causal attention), from the config.
#pragma once

#include <cstdint>

#include "engine/model/model_config.h"

namespace tandem::cli {

class ModelMath {
 public:
  // `linear_bytes_per_weight`: what one weight of a decoder projection costs to read (2: bf16;
  // quantized: LinearBytesPerWeight below). Norms and the LM head are bf16 either way.
  explicit ModelMath(const ModelConfig& c, double linear_bytes_per_weight = 2.0)
      : c_(c), linear_bytes_(linear_bytes_per_weight) {}

  // Weight bytes of one forward pass: every layer's projections and norms, the final norm and
  // the LM head (the embedding is a gather of one row per token).
  double WeightBytes() const {
    const double h = c_.hidden_size, d = c_.head_dim, i = c_.intermediate_size;
    const double q = c_.num_q_heads * d, kv = c_.num_kv_heads * d;
    const double projections = h * (q + 2 * kv) + q * h + 2 * h * i + i * h;
    return c_.num_layers * (linear_bytes_ * projections + 2.0 * 2 * h) +
           2.0 * (h + static_cast<double>(c_.vocab_size) * h);
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
  double linear_bytes_;
};

// Bytes per weight of a quantized projection in the canonical layout the kernels read
// (kernels/quant_gemm/quant_gemm.h): the code (1 byte, or half a byte for 4-bit) plus its share
// of the fp32 scale (and uint4 zero point) of its group; `group` <= 0 means one per row of
// `row_k` weights.
inline double QuantBytesPerWeight(bool four_bit, int64_t group, int64_t row_k) {
  const double g = static_cast<double>(group > 0 ? group : row_k);
  return four_bit ? 0.5 + 5.0 / g : 1.0 + 4.0 / g;
}

}  // namespace tandem::cli
