// Ops: the backend seam of the forward pass. The Llama-family model is written once against this
// interface; RefOps runs the CPU reference kernels (kernels/*/<op>_ref.cc) on host memory, and a
// CudaOps will run the CUDA kernels on device memory with the same args structs.
//
// Every pointer handed to an op is "device" memory of this backend: a weight adopted with
// AdoptWeight, a Buffer, or the KV pool. For RefOps, device memory is host memory.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/weights.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/gemm.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope_kv_store/rope_kv_store.h"
#include "kernels/silu_mul/silu_mul.h"

namespace tandem {

class Ops {
 public:
  virtual ~Ops() = default;

  // The dtype of activations and adopted weights this backend computes in.
  virtual DType compute_dtype() const = 0;

  // Takes ownership of a host weight tensor and returns its device address, valid for the
  // lifetime of this Ops (RefOps keeps the host bytes; CUDA copies them and frees the host copy).
  virtual absl::StatusOr<const void*> AdoptWeight(HostTensor tensor) = 0;
  // Scratch buffer number `id`, at least `bytes` long; grows on demand (contents then lost).
  virtual absl::StatusOr<void*> Buffer(int id, int64_t bytes) = 0;
  virtual absl::Status CopyToDevice(void* dst, const void* src, int64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, const void* src, int64_t bytes) = 0;

  virtual absl::Status Embedding(const EmbeddingArgs& args) = 0;
  virtual absl::Status RmsNorm(const RmsNormArgs& args) = 0;
  virtual absl::Status Gemm(const GemmArgs& args) = 0;
  virtual absl::Status RopeKvStore(const RopeKvStoreArgs& args) = 0;
  virtual absl::Status PagedAttention(const PagedAttentionArgs& args) = 0;
  virtual absl::Status SiluMul(const SiluMulArgs& args) = 0;
};

// The CPU reference backend: fp32 activations, ops multi-threaded through ParallelFor.
std::unique_ptr<Ops> MakeRefOps();

}  // namespace tandem
