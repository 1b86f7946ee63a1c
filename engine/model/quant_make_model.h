// Pre-quantized random checkpoints for `tandem make-model --quantization SCHEME`: the same
// random bf16 (config dtype) weights as the unquantized checkpoint of that seed, with every
// decoder linear layer quantized and written in a real format's layout (quant_checkpoint.h):
//
//   fp8-block    quant_method fp8, weight_block_size [128, 128], weight_scale_inv F32, dynamic
//                activations (the Qwen3-8B-FP8 layout)
//   fp8-channel  compressed-tensors float-quantized, per-channel weight_scale BF16 [n, 1],
//                dynamic FP8 per-token activations (llm-compressor's FP8_DYNAMIC scheme)
//   int8         compressed-tensors int-quantized, per-channel weight_scale BF16 [n, 1],
//                weight-only (W8A16)
//   awq          AutoAWQ GEMM: qweight/qzeros I32, scales F16, asymmetric, group_size
//   gptq         AutoGPTQ (checkpoint_format gptq): qweight/qzeros/g_idx I32, scales F16,
//                symmetric (stored zero 7), group_size (-1: one group per row), desc_act false
//
// Embeddings, norms, biases and lm_head are written as in the unquantized checkpoint.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors_writer.h"

namespace tandem {

// The config.json "quantization_config" object of `scheme` (JSON text). InvalidArgument for an
// unknown scheme, listing the known ones.
absl::StatusOr<std::string> QuantizationConfigJson(const std::string& scheme, int64_t group_size);

// Writes the safetensors files. InvalidArgument (naming the tensor) when a layer's shape does not
// fit the format (AWQ / GPTQ: in_features a multiple of group_size and of 8, out_features of 8).
absl::Status WriteQuantizedRandomWeights(const ModelConfig& config, uint64_t seed,
                                         const std::string& dir,
                                         const CheckpointWriteOptions& options,
                                         const std::string& scheme, int64_t group_size);

}  // namespace tandem
