// Deterministic random weights for generated checkpoints (make-model). Each element is a pure
// function of (seed, tensor name, element index) through a counter-based generator, so the bytes
// never depend on write order, sharding or threading, and a test can re-create exactly the
// checkpoint a golden file was produced from.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/hf_tensors.h"
#include "engine/model/model_config.h"
#include "engine/model/safetensors_writer.h"

namespace tandem {

// The value (before rounding to the tensor's dtype) of element `index` of `tensor`. Scales keep
// tiny models' logits well spread (std ~3, so greedy argmax ties are vanishingly rare) and every
// layer's contribution O(1):
//   projections uniform with std 1/sqrt(fan_in) (o_proj, down_proj: 4/sqrt(fan_in)); biases uniform
//   in [-0.5, 0.5]; norm weights 1 + uniform [-0.25, 0.25]; embeddings and lm_head std
//   3/sqrt(hidden) (with RMS-normalised hidden states, logits then have std ~3).
float RandomWeight(uint64_t seed, const HfTensor& tensor, int64_t index);
// Elements [first, first + count) of `tensor` (RandomWeight) into `out` as `dtype` (F32, BF16
// or F16), in parallel.
void FillRandomWeights(uint64_t seed, const HfTensor& tensor, DType dtype, int64_t first,
                       int64_t count, uint8_t* out);

// Writes the safetensors files of a random checkpoint of `config` to `dir` (which must exist).
absl::Status WriteRandomWeights(const ModelConfig& config, uint64_t seed, const std::string& dir,
                                const CheckpointWriteOptions& options);

}  // namespace tandem
