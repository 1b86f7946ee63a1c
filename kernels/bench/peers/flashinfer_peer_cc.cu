// FlashInfer's CUDA-core decode path (flashinfer_peer.h): DecodePlan, then
// BatchDecodeWithPagedKVCacheDispatched, called as FlashInfer's own batch-decode binding calls
// them for bf16 q/KV/out, head_dim 128, no RoPE, no soft cap, no sliding window.
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include "kernels/bench/peers/flashinfer_peer_workspace.h"

namespace tandem::peer {
namespace {

namespace fi = ::flashinfer;
using Bf16 = __nv_bfloat16;
using Params = fi::BatchDecodeParams<Bf16, Bf16, Bf16, int32_t>;
using Variant = fi::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                     /*soft_cap=*/false, /*alibi=*/false>;
constexpr uint32_t kD = kPeerHeadDim;
constexpr auto kNoRope = fi::PosEncodingMode::kNone;

// FlashInfer's work estimation (occupancy, split-KV choice) for one GQA group size.
template <uint32_t kGroup>
constexpr auto kEstimate =
    fi::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<kGroup, kD, kNoRope, Variant, Params>;

class CudaCoreDecode final : public FlashInferDecode {
 public:
  explicit CudaCoreDecode(const PeerBatch& b) : b_(b) {}

  // DecodePlan into workspace sized by DecodePlanWorkspaceSize; enable_cuda_graph false, as
  // the wrapper's default (a graph replaying these launches replays the same plan).
  std::string Plan(cudaStream_t stream) {
    std::vector<int32_t> indptr = b_.page_indptr;
    const int group = b_.num_q_heads / b_.num_kv_heads;
    try {
      if (group == 4) return PlanWith(kEstimate<4>, indptr.data(), stream);
      if (group == 8) return PlanWith(kEstimate<8>, indptr.data(), stream);
    } catch (const std::exception& e) {  // FlashInfer reports bad input by throwing
      return std::string("DecodePlan: ") + e.what();
    }
    return "CUDA-core peer instantiated for GQA groups 4 and 8 only, not " + std::to_string(group);
  }

  std::string Run(const void* q, void* out, const int32_t* block_table, bool pdl,
                  cudaStream_t stream) override {
    const int64_t page_elems = int64_t{2} * b_.num_kv_heads * b_.page_size * kD;
    const int64_t strides[4] = {page_elems, int64_t{b_.page_size} * kD, kD, 1};  // HND
    Bf16* k = static_cast<Bf16*>(const_cast<void*>(b_.kv));
    fi::paged_kv_t<Bf16, int32_t> kv(
        b_.num_kv_heads, b_.page_size, kD, b_.batch, fi::QKVLayout::kHND, k,
        k + int64_t{b_.num_kv_heads} * b_.page_size * kD, strides,
        const_cast<int32_t*>(block_table), const_cast<int32_t*>(b_.d_page_indptr),
        const_cast<int32_t*>(b_.d_last_page_len));
    Params p(static_cast<Bf16*>(const_cast<void*>(q)), /*q_rope_offset=*/nullptr, kv,
             static_cast<Bf16*>(out), /*lse=*/nullptr, /*alibi=*/nullptr, b_.num_q_heads,
             /*q_stride_n=*/b_.num_q_heads * kD, /*q_stride_h=*/kD, /*window_left=*/-1,
             /*soft_cap=*/0.0f, b_.sm_scale, /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
    void* ints = ws_.int_buffer;
    p.request_indices = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.request_indices_offset);
    p.kv_tile_indices = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.kv_tile_indices_offset);
    p.o_indptr = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.o_indptr_offset);
    p.kv_chunk_size_ptr = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.kv_chunk_size_ptr_offset);
    p.padded_batch_size = info_.padded_batch_size;
    Bf16* tmp_v = nullptr;
    float* tmp_s = nullptr;
    if (info_.split_kv) {
      tmp_v = fi::GetPtrFromBaseOffset<Bf16>(ws_.float_buffer, info_.v_offset);
      tmp_s = fi::GetPtrFromBaseOffset<float>(ws_.float_buffer, info_.s_offset);
    }
    try {
      const cudaError_t e = fi::BatchDecodeWithPagedKVCacheDispatched<kD, kNoRope, Variant>(
          p, tmp_v, tmp_s, pdl, stream);
      return e == cudaSuccess ? "" : std::string("BatchDecode: ") + cudaGetErrorString(e);
    } catch (const std::exception& e) {
      return std::string("BatchDecode: ") + e.what();
    }
  }

  std::string PlanSummary() const override {
    return "split_kv=" + std::to_string(int{info_.split_kv}) +
           " ctas=" + std::to_string(info_.padded_batch_size * b_.num_kv_heads);
  }

 private:
  template <typename Estimate>
  std::string PlanWith(Estimate estimate, int32_t* indptr, cudaStream_t stream) {
    size_t float_bytes = 0, int_bytes = 0;
    cudaError_t e = fi::DecodePlanWorkspaceSize<kD, kNoRope, Variant, Params>(
        float_bytes, int_bytes, indptr, b_.batch, b_.num_q_heads, b_.page_size,
        /*enable_cuda_graph=*/false, stream, estimate);
    if (e != cudaSuccess) return std::string("DecodePlanWorkspaceSize: ") + cudaGetErrorString(e);
    if (std::string err = ws_.Allocate(float_bytes, int_bytes); !err.empty()) return err;
    e = fi::DecodePlan<kD, kNoRope, Variant, Params>(
        ws_.float_buffer, ws_.float_bytes, ws_.int_buffer, ws_.pinned_int_buffer, ws_.int_bytes,
        info_, indptr, b_.batch, b_.num_q_heads, b_.page_size, /*enable_cuda_graph=*/false, stream,
        estimate);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);  // the plan's copy to the device
    return e == cudaSuccess ? "" : std::string("DecodePlan: ") + cudaGetErrorString(e);
  }

  PeerBatch b_;
  PeerWorkspace ws_;
  fi::DecodePlanInfo info_;
};

}  // namespace

std::unique_ptr<FlashInferDecode> PlanFlashInferCudaCore(const PeerBatch& batch,
                                                         cudaStream_t stream, std::string* error) {
  auto path = std::make_unique<CudaCoreDecode>(batch);
  *error = path->Plan(stream);
  if (!error->empty()) return nullptr;
  return path;
}

}  // namespace tandem::peer
