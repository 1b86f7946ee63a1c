#include "engine/model/hf_tensors.h"

#include "absl/strings/str_cat.h"

namespace tandem {

std::string LayerPrefix(int layer) { return absl::StrCat("model.layers.", layer, "."); }

std::vector<HfTensor> HfTensors(const ModelConfig& c) {
  const int64_t h = c.hidden_size, d = c.head_dim, inter = c.intermediate_size;
  const int64_t q_out = int64_t{c.num_q_heads} * d, kv_out = int64_t{c.num_kv_heads} * d;
  std::vector<HfTensor> out;
  auto add = [&](std::string name, std::vector<int64_t> shape, TensorRole role) {
    out.push_back({TensorSpec{std::move(name), c.dtype, std::move(shape)}, role});
  };
  add("model.embed_tokens.weight", {c.vocab_size, h}, TensorRole::kEmbedding);
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = LayerPrefix(l);
    const std::pair<const char*, int64_t> qkv[] = {{"q", q_out}, {"k", kv_out}, {"v", kv_out}};
    for (const auto& [which, rows] : qkv) {
      add(absl::StrCat(p, "self_attn.", which, "_proj.weight"), {rows, h}, TensorRole::kProjection);
      if (c.qkv_bias) {
        add(absl::StrCat(p, "self_attn.", which, "_proj.bias"), {rows}, TensorRole::kBias);
      }
    }
    add(p + "self_attn.o_proj.weight", {h, q_out}, TensorRole::kResidualProjection);
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {d}, TensorRole::kNorm);
      add(p + "self_attn.k_norm.weight", {d}, TensorRole::kNorm);
    }
    add(p + "mlp.gate_proj.weight", {inter, h}, TensorRole::kProjection);
    add(p + "mlp.up_proj.weight", {inter, h}, TensorRole::kProjection);
    add(p + "mlp.down_proj.weight", {h, inter}, TensorRole::kResidualProjection);
    add(p + "input_layernorm.weight", {h}, TensorRole::kNorm);
    add(p + "post_attention_layernorm.weight", {h}, TensorRole::kNorm);
  }
  add("model.norm.weight", {h}, TensorRole::kNorm);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, h}, TensorRole::kLmHead);
  return out;
}

}  // namespace tandem
