// The Hugging Face tensor names and shapes of a Llama-family checkpoint, derived from its config:
// the one list both the weight loader (to check a checkpoint) and make-model (to write one) use.
#pragma once

#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/safetensors_writer.h"

namespace tandem {

// What a tensor is for; make-model picks its random init from this.
// kResidualProjection: o_proj and down_proj, whose outputs are added to the residual stream.
enum class TensorRole { kEmbedding, kLmHead, kProjection, kResidualProjection, kBias, kNorm };

struct HfTensor {
  TensorSpec spec;  // name, dtype = config.dtype, shape ([out, in] for nn.Linear weights)
  TensorRole role = TensorRole::kProjection;
};

// Every tensor `config` implies, in the order transformers' state_dict lists them:
//   model.embed_tokens.weight [V, H]
//   per layer N, prefix model.layers.N.:
//     self_attn.q_proj.weight [Hq*D, H]  (+ .bias [Hq*D] when config.qkv_bias)
//     self_attn.k_proj.weight [Hkv*D, H] (+ .bias)
//     self_attn.v_proj.weight [Hkv*D, H] (+ .bias)
//     self_attn.o_proj.weight [H, Hq*D]
//     self_attn.q_norm.weight, self_attn.k_norm.weight [D]   (config.qk_norm, Qwen3)
//     mlp.gate_proj.weight, mlp.up_proj.weight [I, H]; mlp.down_proj.weight [H, I]
//     input_layernorm.weight, post_attention_layernorm.weight [H]
//   model.norm.weight [H]
//   lm_head.weight [V, H] unless config.tie_word_embeddings
std::vector<HfTensor> HfTensors(const ModelConfig& config);

std::string LayerPrefix(int layer);  // "model.layers.<layer>."

}  // namespace tandem
