// LlamaModel: the Llama-family decoder (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3) as a Model, on
// any Ops backend. Per layer, for the T new tokens of a step (activations in the backend's
// compute dtype; CPU: fp32):
//
//   h        = RmsNorm(residual += x, input_layernorm)        (fused; layer 0: residual = embed)
//   qkv      = h · qkv_projᵀ (+ qkv_bias)                     [T, (Hq + 2 Hkv) D]
//   RopeKvStore: QK-norm (Qwen3), rotary on Q and K, K/V stored at slot_mapping
//   attn     = PagedAttention(Q, cache)                        [T, Hq D]
//   x        = attn · o_projᵀ
//   h        = RmsNorm(residual += x, post_attention_layernorm)
//   x        = SiluMul(h · gate_up_projᵀ) · down_projᵀ
//
// then h = RmsNorm(residual += x, norm), and logits = h[logits_rows] · lm_headᵀ only for the
// rows asked for. `kv_pool` is backend ("device") memory; `logits` is host memory (the rows are
// copied out with Ops::CopyToHost). The step's index arrays are copied in with CopyToDevice.
#pragma once

#include <memory>
#include <vector>

#include "engine/model/model.h"
#include "engine/model/ops.h"
#include "engine/model/weights.h"

namespace tandem {

class LlamaModel final : public Model {
 public:
  // Hands every weight to `ops` (AdoptWeight) and builds the rotary inverse frequencies.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const ModelConfig& config,
                                                            ModelWeights weights,
                                                            std::unique_ptr<Ops> ops);

  const ModelConfig& config() const override { return config_; }
  absl::Status Forward(const StepInputs& inputs, const KvLayout& layout, void* kv_pool,
                       float* logits) override;

 private:
  // Device addresses of one layer's weights (null where absent).
  struct Layer {
    const void* qkv_proj = nullptr;
    const void* qkv_bias = nullptr;
    const void* o_proj = nullptr;
    const void* q_norm = nullptr;
    const void* k_norm = nullptr;
    const void* gate_up_proj = nullptr;
    const void* down_proj = nullptr;
    const void* input_layernorm = nullptr;
    const void* post_attention_layernorm = nullptr;
  };
  // Device copies of the step's index arrays and the activation buffers.
  struct StepBuffers;

  LlamaModel(const ModelConfig& config, std::unique_ptr<Ops> ops)
      : config_(config), ops_(std::move(ops)) {}
  absl::Status AdoptWeights(ModelWeights weights);
  absl::StatusOr<StepBuffers> Prepare(const StepInputs& in);
  absl::Status Attention(int layer, const StepInputs& in, const StepBuffers& b,
                         const KvLayout& layout, void* kv_pool);
  absl::Status Mlp(int layer, int64_t num_tokens, const StepBuffers& b);
  absl::Status Logits(const StepInputs& in, const StepBuffers& b, float* logits);
  GemmArgs Linear(const void* a, const void* w, void* c, int64_t m, int64_t n, int64_t k) const;
  RmsNormArgs Norm(const void* input, void* residual, const void* weight, void* out,
                   int64_t rows) const;

  ModelConfig config_;
  std::unique_ptr<Ops> ops_;
  const void* embed_tokens_ = nullptr;
  const void* norm_ = nullptr;
  const void* lm_head_ = nullptr;  // == embed_tokens_ when tied
  std::vector<Layer> layers_;
  const float* inv_freq_ = nullptr;  // device, [head_dim / 2]
};

}  // namespace tandem
