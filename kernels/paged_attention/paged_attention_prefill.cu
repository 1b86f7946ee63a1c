// PagedAttentionPrefill: dispatches to the Hopper kernel (paged_attention_prefill_sm90.cu) where
// it applies (prefill_sm90.h), else runs this file's kernel.
// Paged prefill attention on sm_90a, FlashAttention-2 style (mma.sync), for chunked prefill:
// ragged prompt chunks attend causally to their own tokens and to the pages already cached.
// A 4-warp CTA takes items of 128 packed rows with the queries staged in shared memory; the
// warps share each double-buffered 64-key tile, 32 rows each (prefill_tile.cuh). An fp8 cache
// (fp8_tile.cuh): the two stages hold fp8 codes + scales, and the CTA dequantizes each tile into
// one bf16 tile before the warps read it (the Hopper kernel takes bf16 caches only).
#include <cuda_bf16.h>

#include <atomic>
#include <cstdlib>
#include <string_view>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/paged_attention/prefill_sm90.h"
#include "kernels/paged_attention/prefill_tile.cuh"

namespace tandem::attention {
namespace {

// Copies the item's packed query rows [row_begin, row_begin + kPrefillRows) into q_s
// ([kPrefillRows][D + kRowPad]); rows past the item are zero.
template <int D>
__device__ void LoadQueryTile(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                              __nv_bfloat16* q_s) {
  constexpr int kChunksPerRow = D / 8;
  const int group = a.num_q_heads / a.num_kv_heads;
  const int64_t q_stride = a.q_stride != 0 ? a.q_stride : int64_t{a.num_q_heads} * D;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  for (int c = threadIdx.x; c < kPrefillRows * kChunksPerRow; c += kPrefillWarps * 32) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = r < it.num_rows;
    const __nv_bfloat16* src = q;
    if (valid) {
      const int packed = it.row_begin + r;
      const int64_t token = it.token_begin + packed / group;
      src = q + token * q_stride + int64_t{it.kv_head * group + packed % group} * D + col;
    }
    attention::CpAsync16(q_s + r * (D + kRowPad) + col, src, valid);
  }
}

// A 4-warp CTA per item of kPrefillRows packed rows; warp w owns rows [32 w, 32 w + 32) (two
// mma row tiles) and all warps share each double-buffered kPrefillKeys-key tile.
template <int D, bool kFp8>
__global__ void __launch_bounds__(kPrefillWarps * 32, 2)
    PrefillKernel(const __grid_constant__ PagedAttentionArgs a, const AttentionWorkItem* items,
                  const int32_t* counts, const Fp8Pages geo) {
  extern __shared__ uint4 smem_raw[];
  constexpr int kTile = TileElems<D, kPrefillKeys>();
  constexpr int kM = kPrefillRows / (16 * kPrefillWarps);
  constexpr int kStage8 = Fp8StageBytes<D, kPrefillKeys>();
  constexpr int kThreads = kPrefillWarps * 32;
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  auto* base = q_s + kPrefillRows * (D + kRowPad);
  auto* base8 = reinterpret_cast<uint8_t*>(base);  // fp8: the stages, then the bf16 tile
  auto* deq = reinterpret_cast<__nv_bfloat16*>(base8 + kPrefillStages * kStage8);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float scale_log2 = a.scale * attention::kLog2e;
  const int num_items = counts[0];
  for (int idx = blockIdx.x; idx < num_items; idx += gridDim.x) {
    const AttentionWorkItem it = items[idx];
    WarpAccum<D> acc[kM];
    int limit[kM][2];
    int min_limit = it.key_end, max_limit = 0;
    const bool active = warp * 16 * kM < it.num_rows;
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      const WarpRows<D> w = SliceRows<D>(a, it, it.row_begin + (warp * kM + mt) * 16, lane);
      attention::InitAccum(acc[mt]);
      limit[mt][0] = w.limit[0];
      limit[mt][1] = w.limit[1];
      min_limit = min(min_limit, w.min_limit);
      max_limit = max(max_limit, w.max_limit);
    }
    const KvView view{static_cast<const __nv_bfloat16*>(a.kv_layer),
                      a.block_tables + int64_t{it.seq} * a.max_pages_per_seq,
                      a.num_kv_heads,
                      a.page_size,
                      attention::PageShift(a.page_size),
                      it.kv_head};
    const int tiles = (it.key_end - it.key_begin + kPrefillKeys - 1) / kPrefillKeys;
    __syncthreads();  // the previous item no longer reads q_s or the last tile
    LoadQueryTile<D>(a, it, q_s);
    if constexpr (kFp8) {
      LoadKvTileFp8<D, kPrefillKeys, kThreads>(view, geo, it.key_begin, it.key_end, base8,
                                               threadIdx.x);
    } else {
      attention::LoadKvTile<D, kPrefillKeys, kThreads>(view, it.key_begin, it.key_end, base,
                                                       base + kTile, threadIdx.x);
    }
    attention::CpAsyncCommit();
    for (int i = 0; i < tiles; ++i) {
      if (i + 1 < tiles) {
        const int key = it.key_begin + (i + 1) * kPrefillKeys;
        if constexpr (kFp8) {
          LoadKvTileFp8<D, kPrefillKeys, kThreads>(view, geo, key, it.key_end,
                                                   base8 + ((i + 1) % 2) * kStage8, threadIdx.x);
        } else {
          __nv_bfloat16* buf = base + ((i + 1) % 2) * 2 * kTile;
          attention::LoadKvTile<D, kPrefillKeys, kThreads>(view, key, it.key_end, buf, buf + kTile,
                                                           threadIdx.x);
        }
      }
      attention::CpAsyncCommit();
      attention::CpAsyncWait<1>();
      __syncthreads();
      const __nv_bfloat16* buf = base + (i % 2) * 2 * kTile;
      if constexpr (kFp8) {
        // deq is free: the previous tile's readers passed the barrier at the loop's end.
        DequantizeTileFp8<D, kPrefillKeys, kPrefillKeys, kThreads>(base8 + (i % 2) * kStage8, 0,
                                                                   deq, deq + kTile, threadIdx.x);
        __syncthreads();
        buf = deq;
      }
      const int key0 = it.key_begin + i * kPrefillKeys;
      // Two 32-key halves: keeps the score fragments at 32 registers (no spills at D = 128).
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int k0 = key0 + half * kPrefillHalf;
        if (active && k0 < max_limit) {
          const int off = half * kPrefillHalf * (D + kRowPad);
          attention::ProcessTileM<D, kPrefillHalf, kM>(
              acc, q_s + warp * kM * 16 * (D + kRowPad), buf + off, buf + kTile + off, k0, limit,
              k0 + kPrefillHalf > min_limit, scale_log2, lane);
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      // Recomputed rather than kept live through the key loop (register pressure).
      StoreOutput(a, SliceRows<D>(a, it, it.row_begin + (warp * kM + mt) * 16, lane), acc[mt],
                  lane);
    }
  }
}

template <int D, bool kFp8>
absl::Status LaunchPrefill(const PagedAttentionArgs& a, const AttentionPlan& plan,
                           cudaStream_t stream) {
  constexpr int kBf16Tile = 2 * TileElems<D, kPrefillKeys>() * sizeof(__nv_bfloat16);
  constexpr int kSmem = kPrefillRows * (D + kRowPad) * sizeof(__nv_bfloat16) +
                        (kFp8 ? kPrefillStages * Fp8StageBytes<D, kPrefillKeys>() + kBf16Tile
                              : kPrefillStages * kBf16Tile);
  static std::atomic<int> cache[kMaxDevices];
  ASSIGN_OR_RETURN(const int per_sm,
                   BlocksPerSm(PrefillKernel<D, kFp8>, kPrefillWarps * 32, kSmem, cache));
  PrefillKernel<D, kFp8><<<NumSms() * per_sm, kPrefillWarps * 32, kSmem, stream>>>(
      a, plan.items(), plan.counts(), Fp8Geometry(a));
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::attention

namespace tandem {

absl::Status PagedAttentionPrefill(const PagedAttentionArgs& args, const AttentionPlan& plan,
                                   cudaStream_t stream) {
  if (args.num_seqs == 0) return absl::OkStatus();
  RETURN_IF_ERROR(attention::CheckArgs(args, plan));
  // The Hopper path (wgmma + TMA) where it applies; TANDEM_PREFILL_KERNEL=fa2 forces this
  // file's mma.sync kernel (benchmarks time both). Read on every call: the prefill GPU test
  // switches kernels inside one process.
  const char* forced = std::getenv("TANDEM_PREFILL_KERNEL");
  const bool fa2 = forced != nullptr && std::string_view(forced) == "fa2";
  if (!fa2 && attention::Sm90PrefillSupported(args)) {
    return attention::LaunchPrefillSm90(args, plan, stream);
  }
  const bool fp8 = args.kv_dtype == DType::kF8E4M3;
  switch (args.head_dim) {
    case 64:
      return fp8 ? attention::LaunchPrefill<64, true>(args, plan, stream)
                 : attention::LaunchPrefill<64, false>(args, plan, stream);
    case 128:
      return fp8 ? attention::LaunchPrefill<128, true>(args, plan, stream)
                 : attention::LaunchPrefill<128, false>(args, plan, stream);
  }
  return absl::InvalidArgumentError("unsupported head_dim");
}

}  // namespace tandem
