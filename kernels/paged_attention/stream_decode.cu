// The decode kernel's stream variant for plans without merges (WORKLOG.md steps 16-17), on a bf16
// cache (ProcessTile, attention_tile.cuh) or with the fused FP8 tile (fp8_fused_tile.cuh); the
// work items are the plan's (attention_plan.h). What differs from paged_attention.cu's
// DecodeKernel is the pipeline. There, a CTA restarts its ring (six fp8 stages, three bf16 ones)
// at every item: block-table entries, the prologue tiles, then the first compute, and at the end
// a warp merge through the ring's shared memory, during which nothing is read. At short contexts
// (10 tiles an item at 640 keys) that fixed cost took the fused fp8 kernel to 2.7 TB/s against
// 3.5 at 4k (step 15). Here the ring runs across items: a producer cursor walks the CTA's items
// (blockIdx.x, + gridDim.x, ...) tile by tile, kStages - 1 tiles ahead of the consumer, reading
// each next item one item ahead and each tile's block-table entries one tile ahead; so the next
// item's first tiles are in flight while the current item's last tiles compute and its warps
// merge. The merge has shared memory of its own (one [16][D + 8] fp32 buffer that the four warps
// add into in turn, 9 KB, instead of four buffers, 35 KB), so that the ring and the merge fit two
// CTAs per SM: 2 x 108 KB (fp8), 2 x 111 KB (bf16).
//
// DecodeCopies::kTma (head_dim 128, pages of 8+ keys) fills the stages with TMA copies instead
// (kTma, tma_tile.cuh, WORKLOG.md step 19): warp 0 issues a tile's copies, one lane per page
// segment, on the stage's mbarrier, and every thread waits on that barrier (no CTA barrier
// before a tile's compute); the stages are 1 KB aligned for TMA's swizzle.
//
// Split items (the cuts of a balanced plan, decode_plan.h; or a split plan, which a graph
// captured with an unsplit one may replay) are handled as in DecodeKernel: partial rows, the
// arrival counter, and the last CTA combines, staging 8 splits at a time in the merge buffer
// (the stages hold the next tiles). Empty items (a balanced plan's gaps) cost a merge's syncs.
// No PDL: the launch is plain, as DecodeKernel's unsplit variant.
#include <cuda.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/paged_attention/attention_combine.cuh"
#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/decode_stage_load.cuh"
#include "kernels/paged_attention/fp8_fused_tile.cuh"
#include "kernels/paged_attention/stream_decode.h"
#include "kernels/paged_attention/tma_encode.h"
#include "kernels/paged_attention/tma_tile.cuh"

namespace tandem::attention {
namespace {

// The ring's depth, as DecodeKernel's: six fp8 stages (half-size tiles), three bf16 ones.
template <bool kFp8>
constexpr int StreamStages() {
  return kFp8 ? 2 * kDecodeStages : kDecodeStages;
}
constexpr int kStreamCombineBatch = 8;  // splits staged per combine round

// Row stride (floats) of the merge buffer: D + 8, as DecodeKernel's merge rows.
template <int D>
constexpr int StreamMergeStride() {
  return D + 8;
}

// The merge buffer: [16][StreamMergeStride] fp32 rows, then [4][16] maxima and [4][16] sums.
template <int D>
constexpr int StreamMergeBytes() {
  constexpr int kRows = kDecodeRows * StreamMergeStride<D>() * static_cast<int>(sizeof(float));
  static_assert(CombineStageBytes<D, kDecodeWarps * 32, kStreamCombineBatch>() <= kRows,
                "the split combine stages its rows in the merge buffer's rows");
  return kRows + 2 * kDecodeWarps * kDecodeRows * static_cast<int>(sizeof(float));
}

// One stage: the fp8 tile's codes and scales, or the bf16 K and V tiles.
template <int D, bool kFp8>
constexpr int StreamStageBytes() {
  return kFp8 ? Fp8StageBytes<D, kDecodeKeys>()
              : 2 * TileElems<D, kDecodeKeys>() * static_cast<int>(sizeof(__nv_bfloat16));
}

// The distance between stages: TMA stages (kTma) start on 1024-byte swizzle atoms, and their
// bf16 tiles are unpadded (tma_tile.cuh: 32 KB, not 34.8).
template <int D, bool kFp8, bool kTma>
constexpr int StreamStageStride() {
  if constexpr (kTma && !kFp8) return 2 * kDecodeKeys * D * static_cast<int>(sizeof(__nv_bfloat16));
  constexpr int kBytes = StreamStageBytes<D, kFp8>();
  return kTma ? (kBytes + 1023) / 1024 * 1024 : kBytes;
}

// TMA stages: the stages, the merge buffer, one mbarrier per stage, and 1 KB to align the first
// stage (dynamic shared memory is only 16-byte aligned): fp8 2 x 112 KB, bf16 2 x 106 KB, still
// two CTAs per SM.
template <int D, bool kFp8, bool kTma = false>
constexpr int StreamSmemBytes() {
  return StreamStages<kFp8>() * StreamStageStride<D, kFp8, kTma>() + StreamMergeBytes<D>() +
         (kTma ? StreamStages<kFp8>() * 8 + 1024 : 0);
}

// Merges the four warps' softmax states of one item into `merge` (StreamMergeBytes) and writes
// the output rows, or the bf16 partial rows and their log2-sum-exp (MergeWarpsAndStore's
// contract, paged_attention.cu). The warps add their rows, scaled to the rows' common maximum,
// into the one buffer in turn (warp 0 stores); only rows below it.num_rows are merged.
// Row g + 8 i of this thread's accumulators, times e, into `row` in head-dim order (kAdd: added
// to it): the fused fp8 tile's permuted layout (StoreFusedRow), or the bf16 tile's mma layout
// (o[n][2 i], o[n][2 i + 1] are dims 8 n + 2 t, + 1).
template <int D, bool kFp8, bool kAdd>
__device__ __forceinline__ void StoreRow(const WarpAccum<D>& acc, int i, int t, float* row,
                                         float e) {
  if constexpr (kFp8) {
    StoreFusedRow<D, kAdd>(acc, i, t, row, e);
  } else {
    auto* dst = reinterpret_cast<float2*>(row);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      float2 v = make_float2(acc.o[n][2 * i] * e, acc.o[n][2 * i + 1] * e);
      if constexpr (kAdd) {
        const float2 old = dst[n * 4 + t];
        v.x += old.x, v.y += old.y;
      }
      dst[n * 4 + t] = v;
    }
  }
}

template <int D, bool kFp8>
__device__ void MergeChainAndStore(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                                   WarpAccum<D>& acc, float* merge, uint16_t* partial_out,
                                   float* partial_lse) {
  constexpr int kStride = StreamMergeStride<D>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float* o_s = merge;
  float* m_s = o_s + kDecodeRows * kStride;
  float* l_s = m_s + kDecodeWarps * kDecodeRows;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    acc.l[i] += __shfl_xor_sync(0xffffffffu, acc.l[i], 1);
    acc.l[i] += __shfl_xor_sync(0xffffffffu, acc.l[i], 2);
    if (t == 0) {
      m_s[warp * kDecodeRows + g + 8 * i] = acc.m[i];
      l_s[warp * kDecodeRows + g + 8 * i] = acc.l[i];
    }
  }
  __syncthreads();
  float e[2];  // this warp's weight in the merged rows g, g + 8
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, m_s[w * kDecodeRows + g + 8 * i]);
    e[i] = acc.m[i] == -INFINITY ? 0.0f : exp2f(acc.m[i] - mx);
  }
  const int halves = it.num_rows > 8 ? 2 : 1;  // rows g + 8 hold packed rows only past 8
  for (int w = 0; w < kDecodeWarps; ++w) {
    if (warp == w) {
      for (int i = 0; i < halves; ++i) {
        float* row = o_s + (g + 8 * i) * kStride;
        if (w == 0) {
          StoreRow<D, kFp8, false>(acc, i, t, row, e[i]);
        } else {
          StoreRow<D, kFp8, true>(acc, i, t, row, e[i]);
        }
      }
    }
    __syncthreads();
  }
  static_assert(kDecodeRows * 8 == kDecodeWarps * 32, "8 threads per row");
  constexpr int kVecs = D / 32;  // float4 columns per thread
  const int r = threadIdx.x >> 3;
  const int c = (threadIdx.x & 7) * 4;
  if (r >= it.num_rows) return;
  float mx = -INFINITY;
  for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, m_s[w * kDecodeRows + r]);
  float sum = 0.0f;
  for (int w = 0; w < kDecodeWarps; ++w) {
    const float m = m_s[w * kDecodeRows + r];
    sum += (m == -INFINITY ? 0.0f : exp2f(m - mx)) * l_s[w * kDecodeRows + r];
  }
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  uint16_t* dst = MergedRowDst<D>(a, it, r, c == 0, mx, sum, partial_out, partial_lse);
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const float4 x = *reinterpret_cast<const float4*>(o_s + r * kStride + c + 32 * j);
    *reinterpret_cast<uint2*>(dst + c + 32 * j) =
        make_uint2(PackBf16(x.x * inv, x.y * inv), PackBf16(x.z * inv, x.w * inv));
  }
}

// The producer's place in the CTA's tile stream: the next tile to issue (item idx, keys
// [key0, key_end) of its sequence and KV head, the tile's block-table entries) and the item after
// it (read one item ahead). idx >= the item count: the stream has ended. CTA-uniform.
struct TileCursor {
  int idx;
  int seq, kv_head, key0, key_end;
  int32_t entries;
  int next_seq, next_kv_head, next_key_begin, next_key_end;
};

// kTma: the stages are filled by TMA copies (tma_tile.cuh) that warp 0 issues and every thread
// waits for on the stage's mbarrier, instead of every thread's cp.async and a CTA barrier;
// `kv_map` is the layer's (Fp8CodesTensorMap, Bf16KvRowsTensorMap; unused otherwise).
template <int D, bool kFp8, bool kTma>
__global__ void __launch_bounds__(kDecodeWarps * 32, 2)
    StreamDecodeKernel(const __grid_constant__ PagedAttentionArgs a, const AttentionWorkItem* items,
                       const AttentionMergeItem* merges, const int32_t* counts, int32_t* counters,
                       uint16_t* partial_out, float* partial_lse, const Fp8Pages geo,
                       const __grid_constant__ CUtensorMap kv_map) {
  static_assert(!kTma || D == 128, "TMA stages: head_dim 128");
  extern __shared__ uint4 smem_raw[];
  constexpr int kStages = StreamStages<kFp8>();
  constexpr int kStageBytes = StreamStageStride<D, kFp8, kTma>();
  constexpr int kTile = TileElems<D, kDecodeKeys>();     // bf16: one K or V tile
  constexpr int kSub = kDecodeWarpKeys * (D + kRowPad);  // bf16: one warp's quarter
  uint8_t* stages = reinterpret_cast<uint8_t*>(smem_raw);
  if constexpr (kTma) {
    const auto base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
    stages += (1024 - base % 1024) % 1024;
  }
  float* merge = reinterpret_cast<float*>(stages + kStages * kStageBytes);
  // kTma: stage s's barrier completes a phase when its tile's bytes have landed.
  uint64_t* bars =
      reinterpret_cast<uint64_t*>(reinterpret_cast<uint8_t*>(merge) + StreamMergeBytes<D>());
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float scale_log2 = a.scale * kLog2e;
  const int stride = gridDim.x;
  const int page_shift = PageShift(a.page_size);
  const int num_items = counts[0];
  auto view_of = [&](int seq, int kv_head) {
    return KvView{static_cast<const __nv_bfloat16*>(a.kv_layer),
                  a.block_tables + int64_t{seq} * a.max_pages_per_seq,
                  a.num_kv_heads,
                  a.page_size,
                  page_shift,
                  kv_head};
  };
  // Moves the cursor to the next item with keys (taking the one read ahead, reading the next).
  auto next_item = [&](TileCursor& p) {
    do {
      p.idx += stride;
      p.seq = p.next_seq, p.kv_head = p.next_kv_head;
      p.key0 = p.next_key_begin, p.key_end = p.next_key_end;
      p.next_key_begin = p.next_key_end = 0;
      if (p.idx + stride < num_items) {
        const AttentionWorkItem& n = items[p.idx + stride];
        p.next_seq = n.seq, p.next_kv_head = n.kv_head;
        p.next_key_begin = n.key_begin, p.next_key_end = n.key_end;
      }
    } while (p.idx < num_items && p.key0 >= p.key_end);
    if (p.idx < num_items)
      p.entries = DecodeTileEntries(view_of(p.seq, p.kv_head), p.key0, p.key_end);
  };
  // Issues the cursor's tile into `stage` (nothing once the stream has ended) and, for cp.async,
  // commits a copy group either way, so that the consumer's wait counts one group per tile (a
  // TMA stage's barrier needs nothing for a tile that does not exist: the consumer only waits
  // for tiles that were issued).
  auto produce = [&](TileCursor& p, int stage) {
    if (p.idx < num_items) {
      const KvView view = view_of(p.seq, p.kv_head);
      if constexpr (kTma) {
        if (warp == 0) {
          IssueTileTma<D, kFp8>(view, geo, &kv_map, p.entries, p.key0, p.key_end,
                                stages + stage * kStageBytes, bars + stage, lane);
        }
      } else if constexpr (kFp8) {
        LoadDecodeTileFp8<D, true, false>(view, geo, p.entries, p.key0, p.key_end,
                                          stages + stage * kStageBytes, 0);
      } else {
        LoadDecodeTile<D, false>(view, p.entries, p.key0, p.key_end,
                                 reinterpret_cast<__nv_bfloat16*>(stages + stage * kStageBytes), 0);
      }
      p.key0 += kDecodeKeys;
      if (p.key0 < p.key_end) {
        p.entries = DecodeTileEntries(view, p.key0, p.key_end);
      } else {
        next_item(p);
      }
    }
    if constexpr (!kTma) CpAsyncCommit();
  };

  // This launch's inputs (q, the cache) are complete: the kernel launches without PDL, so this
  // returns at once; it keeps the kernel correct if it ever is launched with it.
  cudaGridDependencySynchronize();
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) sm90::MbarInit(bars + s, 1);
      sm90::FenceBarrierInit();
    }
    __syncthreads();
  }
  TileCursor p{};
  p.idx = static_cast<int>(blockIdx.x) - stride;
  if (static_cast<int>(blockIdx.x) < num_items) {
    const AttentionWorkItem& n = items[blockIdx.x];
    p.next_seq = n.seq, p.next_kv_head = n.kv_head;
    p.next_key_begin = n.key_begin, p.next_key_end = n.key_end;
  }
  next_item(p);
  for (int s = 0; s < kStages - 1; ++s) produce(p, s);

  int stage = 0;       // the consumer's: the stage of the next tile to compute
  uint32_t phase = 0;  // kTma: the parity of that stage's next completion
  AttentionWorkItem next_it{};
  if (static_cast<int>(blockIdx.x) < num_items) next_it = items[blockIdx.x];
  for (int idx = blockIdx.x; idx < num_items; idx += stride) {
    const AttentionWorkItem it = next_it;
    if (idx + stride < num_items) next_it = items[idx + stride];
    const int tiles = (it.key_end - it.key_begin + kDecodeKeys - 1) / kDecodeKeys;
    const WarpRows<D> w = SliceRows<D>(a, it, it.row_begin, lane);
    WarpAccum<D> acc;
    InitAccum(acc);
    FusedState fused;
    if constexpr (kFp8) {
      fused.k_factor = LoadQueryFused<D, kTma>(acc, w.q[0], w.q[1], lane, scale_log2);
    } else {
      LoadQuery(acc, w.q[0], w.q[1], lane & 3);
    }
    for (int i = 0; i < tiles; ++i) {
      produce(p, stage == 0 ? kStages - 1 : stage - 1);  // the ring's free stage
      uint8_t* st = stages + stage * kStageBytes;
      const int tile_key0 = it.key_begin + i * kDecodeKeys;
      if constexpr (kTma) {
        sm90::MbarWait(bars + stage, phase);
        if (tile_key0 + kDecodeKeys > it.key_end) {
          ZeroTailRows<D, kFp8>(st, it.key_end - tile_key0, warp, lane);
        }
      } else {
        CpAsyncWait<kStages - 1>();
        __syncthreads();
      }
      const int key0 = tile_key0 + warp * kDecodeWarpKeys;
      const bool masked = key0 + kDecodeWarpKeys > w.min_limit;
      if (key0 < w.max_limit) {
        if constexpr (kFp8) {
          ProcessTileFused<D, kDecodeKeys, kTma>(acc, fused, st, warp * kDecodeWarpKeys, key0,
                                                 w.limit, masked, lane);
        } else if constexpr (kTma) {
          const auto* buf =
              reinterpret_cast<const __nv_bfloat16*>(st) + warp * kDecodeWarpKeys * 64;
          ProcessTile<D, kDecodeWarpKeys, true>(acc, buf, buf + 2 * kTmaHalfElems, key0, w.limit,
                                                masked, scale_log2, lane);
        } else {
          const auto* buf = reinterpret_cast<const __nv_bfloat16*>(st) + warp * kSub;
          ProcessTile<D, kDecodeWarpKeys>(acc, buf, buf + kTile, key0, w.limit, masked, scale_log2,
                                          lane);
        }
      }
      __syncthreads();  // the stage is free for the producer
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    if (tiles == 0) __syncthreads();  // the previous item's merge no longer reads `merge`
    if constexpr (kFp8) FinishFused(acc, fused);
    MergeChainAndStore<D, kFp8>(a, it, acc, merge, partial_out, partial_lse);
    if (it.merge >= 0) {
      const AttentionMergeItem mi = merges[it.merge];
      if (ArriveLast(counters + it.merge, mi.num_splits)) {
        CombineSplits<D, kDecodeWarps * 32, kStreamCombineBatch>(
            a, mi, partial_out, partial_lse, reinterpret_cast<uint16_t*>(merge));
      }
    }
  }
}

// The TMA stages' tensor map of one layer's fp8 codes (kv_layout.h): [page][2 H P code rows of
// D bytes], the scales after them in each page being skipped by the page stride; boxes of one
// page segment (TmaSegmentRows rows), 128-byte swizzle. The page extent is any page id the
// pool can have below 2^40 bytes (the block tables keep the copies inside the pool).
absl::StatusOr<CUtensorMap> Fp8CodesTensorMap(const PagedAttentionArgs& a, const Fp8Pages& geo) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled not found");
  const auto page_bytes = static_cast<cuuint64_t>(geo.page_bytes);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(a.head_dim),
                              cuuint64_t{2} * a.num_kv_heads * a.page_size,
                              std::min<cuuint64_t>(0x7fffffff, (cuuint64_t{1} << 40) / page_bytes)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(a.head_dim), page_bytes};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(a.head_dim),
                             static_cast<cuuint32_t>(std::min(a.page_size, kDecodeKeys)), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(a.kv_layer), dims, strides,
             box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled (fp8 codes) failed: ", int{r}));
  }
  return map;
}

// The copies a.decode_copies asks for; kDefault takes TANDEM_DECODE_COPIES, read once per
// process (this runs for every layer of every step), else the cache's builtin filling.
absl::StatusOr<DecodeCopies> Copies(const PagedAttentionArgs& a) {
  static const char* const env = std::getenv("TANDEM_DECODE_COPIES");
  return ResolveDecodeCopies(a.decode_copies, env, a.kv_dtype);
}

// Whether the TMA stages take `a` when `copies` asks for them (else the cp.async ones run):
// head_dim 128, power-of-two pages of kTmaMinPage keys or more, a 16-byte aligned layer.
bool TmaStages(const PagedAttentionArgs& a, DecodeCopies copies) {
  return copies == DecodeCopies::kTma && a.head_dim == 128 && a.page_size >= kTmaMinPage &&
         PageShift(a.page_size) >= 0 && reinterpret_cast<uintptr_t>(a.kv_layer) % 16 == 0;
}

template <int D, bool kFp8, bool kTma = false>
absl::Status Launch(const PagedAttentionArgs& a, const AttentionPlan& plan, cudaStream_t stream) {
  constexpr int kSmem = StreamSmemBytes<D, kFp8, kTma>();
  static std::atomic<int> cache[kMaxDevices];
  ASSIGN_OR_RETURN(const int per_sm,
                   BlocksPerSm(StreamDecodeKernel<D, kFp8, kTma>, kDecodeWarps * 32, kSmem, cache));
  const Fp8Pages geo = Fp8Geometry(a);
  CUtensorMap map{};
  if constexpr (kTma && kFp8) {
    ASSIGN_OR_RETURN(map, Fp8CodesTensorMap(a, geo));
  } else if constexpr (kTma) {  // boxes of one page segment (TmaSegmentRows)
    ASSIGN_OR_RETURN(
        map, Bf16KvRowsTensorMap(a.kv_layer, a.head_dim, std::min(a.page_size, kDecodeKeys)));
  }
  // Balanced plans lay CTA c's pieces out at a stride of DecodeSlots(): launch that many CTAs
  // (any grid computes the same function; only the balance needs this one).
  const int grid = std::min(NumSms() * per_sm, AttentionPlan::DecodeSlots());
  StreamDecodeKernel<D, kFp8, kTma><<<grid, kDecodeWarps * 32, kSmem, stream>>>(
      a, plan.items(), plan.merges(), plan.counts(), plan.merge_counters(), plan.partial_out(),
      plan.partial_lse(), geo, map);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchStreamDecode(const PagedAttentionArgs& a, const AttentionPlan& plan,
                                cudaStream_t stream) {
  const bool fp8 = a.kv_dtype == DType::kF8E4M3;
  ASSIGN_OR_RETURN(const DecodeCopies copies, Copies(a));
  switch (a.head_dim) {
    case 64:
      return fp8 ? Launch<64, true>(a, plan, stream) : Launch<64, false>(a, plan, stream);
    case 128:
      if (TmaStages(a, copies)) {
        return fp8 ? Launch<128, true, true>(a, plan, stream)
                   : Launch<128, false, true>(a, plan, stream);
      }
      return fp8 ? Launch<128, true>(a, plan, stream) : Launch<128, false>(a, plan, stream);
  }
  return absl::InvalidArgumentError("unsupported head_dim");
}

}  // namespace tandem::attention
