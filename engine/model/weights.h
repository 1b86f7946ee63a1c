// ModelWeights: a checkpoint's tensors, checked against the config, converted to one compute
// dtype and fused for the forward pass, in host memory (a backend then adopts or uploads them).
//
// Fusions done at load time (row-major [out, in] nn.Linear layout throughout):
//   qkv_proj     [(Hq + 2 * Hkv) * D, H]  = rows of q_proj, then k_proj, then v_proj
//   qkv_bias     [(Hq + 2 * Hkv) * D]     = q, k, v biases (Qwen2 only; else empty)
//   gate_up_proj [2 * I, H]               = rows of gate_proj, then up_proj
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/quant_config.h"
#include "engine/model/quant_weight.h"
#include "engine/model/safetensors.h"
#include "engine/model/tensor_shard.h"
#include "kernels/common/dtype.h"

namespace tandem {

// A dense host tensor, or a quantized linear weight (`quant` set: shape [n, k], bytes empty,
// dtype unused); empty (neither) means "absent".
struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // row-major, dtype-encoded
  std::shared_ptr<const QuantizedWeight> quant = nullptr;

  bool empty() const { return bytes.empty() && quant == nullptr; }
  const void* data() const { return bytes.data(); }
  int64_t NumElements() const;
};

struct LayerWeights {
  HostTensor qkv_proj;
  HostTensor qkv_bias;  // Qwen2
  HostTensor o_proj;    // [H, Hq * D]
  HostTensor q_norm;    // [D], Qwen3
  HostTensor k_norm;    // [D], Qwen3
  HostTensor gate_up_proj;
  HostTensor down_proj;                 // [H, I]
  HostTensor input_layernorm;           // [H]
  HostTensor post_attention_layernorm;  // [H]
};

struct ModelWeights {
  HostTensor embed_tokens;  // [V, H]
  std::vector<LayerWeights> layers;
  HostTensor norm;     // [H]
  HostTensor lm_head;  // [V, H]; empty when tied: use embed_tokens
};

// Reads every tensor `config` implies (hf_tensors.h) from `checkpoint`, converting BF16/F16/F32
// to `compute_dtype` (kF32 or kBF16). InvalidArgument naming the tensor when one is missing, has
// the wrong shape ("model.layers.3.mlp.up_proj.weight: expected [1024, 256], found
// [1024, 255]") or a non-float dtype. Tensors the config does not imply are ignored.
// With a tensor-parallel `shard`, only that rank's slices are read and converted
// (tensor_shard.h): the layers' weights are then the shapes of ShardConfig(config, shard.size),
// and lm_head is loaded on rank 0 only (empty elsewhere). With a pipeline `stage`, only its
// layers are read (layers[i] is layer stage.first + i), the embeddings on the first stage (and
// on the last one's rank 0 when tied), the final norm and lm_head on the last.
absl::StatusOr<ModelWeights> LoadWeights(const SafetensorsCheckpoint& checkpoint,
                                         const ModelConfig& config, DType compute_dtype,
                                         TensorShard shard = {}, StageLayers stage = {},
                                         const QuantConfig& quant = {});
// The same with the linear layers of every decoder layer (qkv_proj, o_proj, gate_up_proj,
// down_proj) quantized as `quant` says: read from the checkpoint's format
// (quant_checkpoint.h), or, for a load-time format, loaded as fp32 and quantized
// (QuantizeWeight). Embeddings, norms, biases and lm_head stay in the compute dtype. With a
// tensor-parallel shard (the first overload), each rank's quantized slices equal the same
// slices of the whole quantized weights; a slice the format cannot cut is InvalidArgument
// (quant_shard.h).
absl::StatusOr<ModelWeights> LoadWeights(const SafetensorsCheckpoint& checkpoint,
                                         const ModelConfig& config, DType compute_dtype,
                                         const QuantConfig& quant);

}  // namespace tandem
