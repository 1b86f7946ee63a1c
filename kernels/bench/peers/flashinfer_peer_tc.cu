// FlashInfer's tensor-core decode path (flashinfer_peer.h): PrefillPlan over one query token per
// request, then BatchPrefillWithPagedKVCacheDispatched (FA2 kernel, mma over the packed query
// heads of a KV group, no mask), as FlashInfer's batch-prefill binding calls them when
// BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True) runs bf16 (backend fa2). Only
// CTA_TILE_Q 16 is instantiated: the tile its planner picks for packed query lengths <= 16
// (group 4 and 8 at one token); another choice is reported as an error, not run.
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include "kernels/bench/peers/flashinfer_peer_workspace.h"

namespace tandem::peer {
namespace {

namespace fi = ::flashinfer;
using Bf16 = __nv_bfloat16;
using Params = fi::BatchPrefillPagedParams<Bf16, Bf16, Bf16, int32_t>;
using Variant = fi::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/false,
                                     /*soft_cap=*/false, /*alibi=*/false>;
constexpr uint32_t kD = kPeerHeadDim;
constexpr uint32_t kCtaTileQ = 16;

class TensorCoreDecode final : public FlashInferDecode {
 public:
  explicit TensorCoreDecode(const PeerBatch& b) : b_(b) {}

  // PrefillPlan with the decode wrapper's arguments: page indptr as kv_indptr, total rows =
  // batch, no CUDA graph, window -1, fixed_split_size -1, split-KV allowed, uniform_q_len 0.
  std::string Plan(cudaStream_t stream) {
    std::vector<int32_t> qo(b_.batch + 1), kv = b_.page_indptr;
    for (int i = 0; i <= b_.batch; ++i) qo[i] = i;
    size_t float_bytes = 0, int_bytes = 0;
    try {
      cudaError_t e = fi::PrefillPlanWorkspaceSize<int32_t>(
          float_bytes, int_bytes, qo.data(), kv.data(), b_.batch, b_.batch, b_.num_q_heads,
          b_.num_kv_heads, kD, kD, b_.page_size, /*enable_cuda_graph=*/false, sizeof(Bf16),
          /*window_left=*/-1, /*fixed_split_size=*/-1, /*disable_split_kv=*/false,
          /*num_colocated_ctas=*/0, /*uniform_q_len=*/0, stream, sizeof(Bf16));
      if (e != cudaSuccess)
        return std::string("PrefillPlanWorkspaceSize: ") + cudaGetErrorString(e);
      if (std::string err = ws_.Allocate(float_bytes, int_bytes); !err.empty()) return err;
      e = fi::PrefillPlan<int32_t>(ws_.float_buffer, ws_.float_bytes, ws_.int_buffer,
                                   ws_.pinned_int_buffer, ws_.int_bytes, info_, qo.data(),
                                   kv.data(), b_.batch, b_.batch, b_.num_q_heads, b_.num_kv_heads,
                                   kD, kD, b_.page_size, /*enable_cuda_graph=*/false, sizeof(Bf16),
                                   /*window_left=*/-1, /*fixed_split_size=*/-1,
                                   /*disable_split_kv=*/false, /*num_colocated_ctas=*/0,
                                   /*uniform_q_len=*/0, stream, sizeof(Bf16));
      if (e == cudaSuccess) e = cudaStreamSynchronize(stream);  // the plan's copy to the device
      if (e != cudaSuccess) return std::string("PrefillPlan: ") + cudaGetErrorString(e);
    } catch (const std::exception& e) {  // FlashInfer reports bad input by throwing
      return std::string("PrefillPlan: ") + e.what();
    }
    if (info_.cta_tile_q != kCtaTileQ) {
      return "PrefillPlan chose cta_tile_q " + std::to_string(info_.cta_tile_q) +
             "; only 16 is instantiated";
    }
    return "";
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
    Params p(static_cast<Bf16*>(const_cast<void*>(q)), kv, /*custom_mask=*/nullptr,
             const_cast<int32_t*>(b_.d_qo_indptr), /*mask_indptr=*/nullptr,
             /*q_rope_offset=*/nullptr, static_cast<Bf16*>(out), /*lse=*/nullptr,
             /*alibi=*/nullptr, b_.num_q_heads, /*q_stride_n=*/b_.num_q_heads * kD,
             /*q_stride_h=*/kD, /*window_left=*/-1, /*soft_cap=*/0.0f, b_.sm_scale,
             /*rope_scale=*/1.0f, /*rope_theta=*/1e4f);
    void* ints = ws_.int_buffer;
    p.request_indices = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.request_indices_offset);
    p.qo_tile_indices = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.qo_tile_indices_offset);
    p.kv_tile_indices = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.kv_tile_indices_offset);
    p.o_indptr = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.o_indptr_offset);
    p.kv_chunk_size_ptr = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.kv_chunk_size_ptr_offset);
    Bf16* tmp_v = nullptr;
    float* tmp_s = nullptr;
    if (info_.split_kv) {
      p.merge_indptr = fi::GetPtrFromBaseOffset<int32_t>(ints, info_.merge_indptr_offset);
      tmp_v = fi::GetPtrFromBaseOffset<Bf16>(ws_.float_buffer, info_.v_offset);
      tmp_s = fi::GetPtrFromBaseOffset<float>(ws_.float_buffer, info_.s_offset);
    }
    p.padded_batch_size = info_.padded_batch_size;
    p.max_total_num_rows = info_.total_num_rows;
    try {
      const cudaError_t e =
          fi::BatchPrefillWithPagedKVCacheDispatched<kCtaTileQ, kD, kD, fi::PosEncodingMode::kNone,
                                                     /*fp16_qk_reduction=*/false,
                                                     fi::MaskMode::kNone, Variant>(p, tmp_v, tmp_s,
                                                                                   pdl, stream);
      return e == cudaSuccess ? "" : std::string("BatchPrefill: ") + cudaGetErrorString(e);
    } catch (const std::exception& e) {
      return std::string("BatchPrefill: ") + e.what();
    }
  }

  std::string PlanSummary() const override {
    return "split_kv=" + std::to_string(int{info_.split_kv}) +
           " ctas=" + std::to_string(info_.padded_batch_size * b_.num_kv_heads);
  }

 private:
  PeerBatch b_;
  PeerWorkspace ws_;
  fi::PrefillPlanInfo info_;
};

}  // namespace

std::unique_ptr<FlashInferDecode> PlanFlashInferTensorCore(const PeerBatch& batch,
                                                           cudaStream_t stream,
                                                           std::string* error) {
  auto path = std::make_unique<TensorCoreDecode>(batch);
  *error = path->Plan(stream);
  if (!error->empty()) return nullptr;
  return path;
}

}  // namespace tandem::peer
