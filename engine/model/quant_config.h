// QuantConfig: how a checkpoint's linear layers are quantized, read from config.json's
// "quantization_config" as real checkpoints ship it, or asked for at load time (--quantization,
// vLLM's flag, on an unquantized checkpoint). What each format's tensors look like is in
// quant_checkpoint.h. A field that is present is honoured or refused: anything this loader cannot
// do exactly (static activation scales, act-order, other bit widths, per-layer exceptions other
// than lm_head, a KV-cache scheme) is Unimplemented, a malformed value InvalidArgument, both
// naming the field.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {

struct QuantConfig {
  enum class Format {
    kNone,
    // quant_method "fp8" (transformers' FineGrainedFP8 / vLLM "fp8"; Qwen3-8B-FP8, DeepSeek-V3):
    // weight F8_E4M3 + weight_scale_inv [ceil(n / bn), ceil(k / bk)] with weight_block_size
    // [bn, bk]; without a block size, one per-tensor weight_scale. activation_scheme "dynamic".
    kFp8Block,
    kFp8PerTensor,
    // quant_method "compressed-tensors" (llm-compressor), format "float-quantized" (FP8) or
    // "int-quantized" (INT8), 8-bit symmetric weights with strategy "channel" (weight_scale
    // [n, 1]) or "tensor" ([1]); input_activations null (weight-only) or dynamic FP8 per token.
    kCompressedFp8,
    kCompressedInt8,
    // quant_method "awq" (AutoAWQ, version "gemm"): 4-bit, zero_point, group_size.
    kAwq,
    // quant_method "gptq" (AutoGPTQ / GPTQModel, checkpoint_format "gptq" or "gptq_v2"): 4-bit,
    // group_size (-1: one group), desc_act false.
    kGptq,
    // --quantization on an unquantized checkpoint: weights quantized after loading.
    kLoadTimeFp8,   // FP8 e4m3 per output channel, activations FP8 per token
    kLoadTimeInt8,  // INT8 per output channel, weight-only
    kLoadTimeInt4,  // UINT4 asymmetric, groups of 128 along k, weight-only
  };
  Format format = Format::kNone;
  int64_t block_n = 0, block_k = 0;  // kFp8Block
  bool per_tensor = false;           // kCompressed*: strategy "tensor"
  int64_t group_size = 0;            // kAwq, kGptq, kLoadTimeInt4 (-1: the whole row, GPTQ)
  bool gptq_v2 = false;              // kGptq: zeros stored without v1's "minus one"
  ActQuant act_quant = ActQuant::kNone;
  int64_t act_group_size = 128;  // ActQuant::kFp8PerTokenGroup

  bool quantized() const { return format != Format::kNone; }
  bool load_time() const;
  std::string Describe() const;  // "fp8 block 128x128, activations fp8 per token group of 128"

  // From config.json text: kNone when there is no "quantization_config".
  static absl::StatusOr<QuantConfig> FromConfigJson(const std::string& config_json);
  // The checkpoint's config.json combined with the --quantization flag ("" = none; "fp8",
  // "int8", "int4"): the flag on an already quantized checkpoint is InvalidArgument, an unknown
  // value InvalidArgument listing the choices.
  static absl::StatusOr<QuantConfig> Resolve(const std::string& dir,
                                             const std::string& quantization_flag);
};

}  // namespace tandem
