// The attention prologue, fused: optional QK-norm (Qwen3), rotary embedding of Q and K in place,
// and the store of this step's K and V into the paged cache (kernels/common/kv_layout.h).
//
// Rotary embedding is the "rotate half" form every supported family uses in Hugging Face:
// for i < head_dim/2, with angle = position * inv_freq[i]:
//   x'[i]              = x[i] * cos - x[i + head_dim/2] * sin
//   x'[i + head_dim/2] = x[i + head_dim/2] * cos + x[i] * sin
// inv_freq carries every scaling variant (Llama 3.1 "llama3", linear, ...): the engine builds it
// once at load time, so the kernel knows nothing about scaling.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/dtype.h"
#include "kernels/common/stream.h"

namespace tandem {

struct RopeKvStoreArgs {
  // [num_tokens, (num_q_heads + 2 * num_kv_heads) * head_dim], dtype: the fused QKV projection
  // output, Q heads then K heads then V heads. Q and K are normalised and rotated in place.
  void* qkv = nullptr;
  const int32_t* positions = nullptr;     // [num_tokens]
  const int32_t* slot_mapping = nullptr;  // [num_tokens] cache slot per token; < 0: do not store
  void* kv_layer =
      nullptr;  // this layer's pages: [num_pages][2][num_kv_heads][page_size][head_dim]
  const float* inv_freq = nullptr;      // [head_dim / 2], fp32
  const void* q_norm_weight = nullptr;  // [head_dim], dtype; null: no QK-norm
  const void* k_norm_weight = nullptr;  // [head_dim], dtype; null iff q_norm_weight is null
  float norm_eps = 1e-6f;
  int64_t num_tokens = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int page_size = 0;
  int num_pages = 0;
  DType dtype = DType::kBF16;  // qkv and norm weights: kF32 or kBF16
  // cache: kF32, kBF16 or kF8E4M3 (codes + per-token scales, kernels/common/kv_layout.h)
  DType kv_dtype = DType::kBF16;
};

void RopeKvStoreRef(const RopeKvStoreArgs& args);
absl::Status RopeKvStore(const RopeKvStoreArgs& args, cudaStream_t stream);

}  // namespace tandem
