// Model: one decoder forward pass over a ragged batch, reading and writing the paged KV cache.
// Implementations: the Llama-family decoder on the CPU reference kernels (and, later, CUDA).
// Thread-compatible: one engine loop calls Forward at a time.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model/model_config.h"
#include "engine/model/step_inputs.h"
#include "kernels/common/kv_layout.h"

namespace tandem {

class Model {
 public:
  virtual ~Model() = default;

  virtual const ModelConfig& config() const = 0;

  // Runs the decoder on `inputs`: stores each token's K/V at its slot of `kv_pool` (laid out as
  // `layout`, kernels/common/kv_layout.h) and writes fp32 logits for inputs.logits_rows to
  // `logits`, [logits_rows.size(), vocab_size] row-major.
  //
  // Errors say whether the batch or the backend is at fault (IsBackendUnusable below):
  //   InvalidArgument (or any code but Internal): this batch cannot run — inconsistent inputs
  //     (a token id out of range, a slot outside the pool). The engine fails the batch's
  //     requests and keeps serving.
  //   Internal: the backend is unusable and every later call would fail too — a sticky device
  //     error (an illegal memory access poisons the CUDA context), a lost device. The engine
  //     stops (engine/engine.h, Step()). base/cuda_check.h returns Internal for every CUDA,
  //     cuBLAS and NCCL failure, so a backend that checks its calls with it gets this for free;
  //     a failure known to be confined to one batch must use another code.
  virtual absl::Status Forward(const StepInputs& inputs, const KvLayout& layout, void* kv_pool,
                               float* logits) = 0;
};

// True for a model (or sampler) error that means the backend can run nothing any more.
inline bool IsBackendUnusable(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInternal;
}

// Loads config.json and the safetensors weights of the Hugging Face folder `dir`.
// NotFound / InvalidArgument / Unimplemented with a message naming the file or tensor at fault.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& dir, Backend backend);

}  // namespace tandem
