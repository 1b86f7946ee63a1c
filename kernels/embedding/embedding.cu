// CUDA embedding gather: one block per token copies one table row (16-byte vectors when the row
// is a multiple of 16 bytes and both buffers are aligned; element-wise otherwise). An id outside
// [0, vocab_size) — which the engine rejects before it gets here — yields a zero row rather than
// an out-of-bounds read.
#include "base/cuda_check.h"
#include "kernels/common/vec_util.cuh"
#include "kernels/embedding/embedding.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;

template <typename VecT>
__global__ void __launch_bounds__(kThreads)
    EmbeddingKernel(const __grid_constant__ EmbeddingArgs args, int64_t row_vecs) {
  const int64_t t = blockIdx.x;
  const int64_t id = args.token_ids[t];
  const bool valid = id >= 0 && id < args.vocab_size;
  const VecT* src = static_cast<const VecT*>(args.table) + id * row_vecs;
  VecT* dst = static_cast<VecT*>(args.out) + t * row_vecs;
  for (int64_t i = threadIdx.x; i < row_vecs; i += kThreads) {
    dst[i] = valid ? src[i] : VecT{};
  }
}

}  // namespace

absl::Status Embedding(const EmbeddingArgs& args, cudaStream_t stream) {
  if (args.dtype != DType::kF32 && args.dtype != DType::kBF16) {
    return absl::InvalidArgumentError("Embedding: dtype must be f32 or bf16");
  }
  if (args.num_tokens < 0 || args.hidden < 0) {
    return absl::InvalidArgumentError("Embedding: negative shape");
  }
  if (args.num_tokens == 0 || args.hidden == 0) return absl::OkStatus();
  const int64_t row_bytes = args.hidden * DTypeSize(args.dtype);
  if (row_bytes % 16 == 0 && Aligned16(args.table) && Aligned16(args.out)) {
    EmbeddingKernel<uint4><<<args.num_tokens, kThreads, 0, stream>>>(args, row_bytes / 16);
  } else if (args.dtype == DType::kF32) {
    EmbeddingKernel<uint32_t><<<args.num_tokens, kThreads, 0, stream>>>(args, args.hidden);
  } else {
    EmbeddingKernel<uint16_t><<<args.num_tokens, kThreads, 0, stream>>>(args, args.hidden);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
