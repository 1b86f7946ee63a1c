// The FlashInfer side of the decode-attention peer benchmark (flashinfer_peer_main.cu): its two
// bf16 decode paths, planned once per batch and run from raw device pointers, so the harness
// never sees a FlashInfer type and only flashinfer_peer_{cc,tc}.cu include FlashInfer's headers.
//
// FlashInfer is not part of tandem: its headers are fetched into a git-ignored folder and this
// benchmark is built only when TANDEM_FLASHINFER_INCLUDE names them
// (kernels/bench/runs/stage_flashinfer_peer.sh). The binary links nothing but the CUDA runtime
// (statically), so it travels to the GPU machine alone; errors are therefore plain strings
// (empty: success), not absl::Status.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::peer {

inline constexpr int kPeerHeadDim = 128;  // the only head_dim instantiated

// One decode step's batch over a paged bf16 KV pool in tandem's layout (kernels/common/
// kv_layout.h): pool [num_pages][2][num_kv_heads][page_size][head_dim], K then V, each head's
// tokens contiguous. For FlashInfer that is its HND layout with K and V of a page interleaved,
// which its paged_kv_t expresses through strides (page stride 2 * num_kv_heads * page_size *
// head_dim, V = K + num_kv_heads * page_size * head_dim).
struct PeerBatch {
  int batch = 0;
  int num_q_heads = 0;
  int num_kv_heads = 0;
  int page_size = 0;
  float sm_scale = 0;
  // Host copies: sequence s owns block-table entries [page_indptr[s], page_indptr[s + 1]), all
  // full but the last, which holds last_page_len[s] in [1, page_size] tokens.
  std::vector<int32_t> page_indptr;    // [batch + 1]
  std::vector<int32_t> last_page_len;  // [batch]
  // Device: the pool (bf16, see above) and the same two arrays, plus qo_indptr = 0, 1, .., batch
  // (one query token per sequence; the tensor-core path reads it).
  const void* kv = nullptr;
  const int32_t* d_page_indptr = nullptr;    // [batch + 1]
  const int32_t* d_last_page_len = nullptr;  // [batch]
  const int32_t* d_qo_indptr = nullptr;      // [batch + 1]
};

// One planned FlashInfer decode path for one PeerBatch (its plan: split-KV choice, work items
// and workspace, made once like FlashInfer's wrappers' plan()).
class FlashInferDecode {
 public:
  virtual ~FlashInferDecode() = default;
  // Enqueues one decode on `stream`: q and out [batch, num_q_heads, head_dim] bf16, contiguous;
  // `block_table` (device) holds page_indptr.back() page ids. Launches only (no allocation, no
  // synchronization), so a CUDA graph can capture it. pdl: programmatic dependent launch, as
  // FlashInfer's Python wrappers enable by default on Hopper. Returns "" or the error.
  virtual std::string Run(const void* q, void* out, const int32_t* block_table, bool pdl,
                          cudaStream_t stream) = 0;
  // What the plan chose, as key=value words for the PEER line ("split_kv=1 ctas=...").
  virtual std::string PlanSummary() const = 0;
};

// The CUDA-core path: BatchDecodeWithPagedKVCache (DecodePlan + the decode kernel, split-KV and
// its merge when the plan splits). Group sizes 4 and 8. nullptr and *error on failure.
std::unique_ptr<FlashInferDecode> PlanFlashInferCudaCore(const PeerBatch& batch,
                                                         cudaStream_t stream, std::string* error);

// The tensor-core path: the batch prefill kernel over paged KV with one query token per request
// (PrefillPlan + BatchPrefillWithPagedKVCache, CTA_TILE_Q 16, no mask), which is what
// BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True) runs for bf16 (its fa2 backend).
std::unique_ptr<FlashInferDecode> PlanFlashInferTensorCore(const PeerBatch& batch,
                                                           cudaStream_t stream, std::string* error);

}  // namespace tandem::peer
