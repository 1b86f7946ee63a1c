// Reading one quantized linear layer of a checkpoint into the canonical QuantizedWeight, for
// every format of quant_config.h. Tensors of module M (e.g. "model.layers.0.self_attn.q_proj",
// an nn.Linear of out_features n, in_features k):
//
//   fp8 block      M.weight F8_E4M3 [n, k]; M.weight_scale_inv F32/BF16 [ceil(n/bn), ceil(k/bk)]:
//                  w = code * scale_inv[j / bn, kk / bk]   (despite the name, a multiplier)
//   fp8 per-tensor M.weight F8_E4M3 [n, k]; M.weight_scale [] or [1]
//   compressed-tensors float-quantized / int-quantized (llm-compressor's FP8 and INT8 layouts)
//                  M.weight F8_E4M3 or I8 [n, k]; M.weight_scale [n, 1] (channel) or [1]
//                  (tensor), F32/BF16/F16; w = code * scale. M.weight_zero_point (asymmetric)
//                  and M.input_scale (static activations) are refused.
//   awq (AutoAWQ GEMM): M.qweight I32 [k, n/8], M.qzeros I32 [k/g, n/8], M.scales F16 [k/g, n].
//                  Eight 4-bit values per int32 along n, nibble i (bits 4i..4i+3) holding
//                  column 8c + kAwqOrder[i], kAwqOrder = {0, 2, 4, 6, 1, 3, 5, 7}; the same for
//                  qzeros. w[j, kk] = (q[kk, j] - z[kk/g, j]) * s[kk/g, j].
//   gptq (AutoGPTQ): M.qweight I32 [k/8, n], nibble i of qweight[r, j] = q for kk = 8r + i;
//                  M.qzeros I32 [G, n/8], nibble i of qzeros[g, c] = stored zero of column
//                  8c + i; M.scales F16 [G, n]; M.g_idx I32 [k] (optional; must be kk / g since
//                  desc_act is false). G = k / g (1 for group_size -1). checkpoint_format "gptq"
//                  stores zero - 1 (w = (q - (stored + 1)) * s), "gptq_v2" the zero itself.
//
// Wrong dtype, shape (including k or n not a multiple of the packing or the group) or a missing
// tensor is InvalidArgument naming the tensor.
//
// With a tensor-parallel `slice` (of rank out of `tp`), only the slice's elements of each tensor
// are read (from the mapped files), and the result is the canonical weight of that slice: the
// same bytes as the slice of the whole weight. A slice the format cannot cut there (quant_shard.h)
// is InvalidArgument.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/quant_config.h"
#include "engine/model/quant_weight.h"
#include "engine/model/safetensors.h"
#include "engine/model/tensor_shard.h"

namespace tandem {

inline constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

absl::StatusOr<QuantizedWeight> ReadQuantizedLinear(const SafetensorsCheckpoint& checkpoint,
                                                    const QuantConfig& quant,
                                                    const std::string& module, int64_t n, int64_t k,
                                                    const TensorSlice& slice = {}, int tp = 1);

}  // namespace tandem
