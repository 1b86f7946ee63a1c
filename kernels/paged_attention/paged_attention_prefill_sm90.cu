// Paged prefill attention on sm_90a, FlashAttention-3 style: TMA loads of the K/V pages into a
// ring of shared-memory stages guarded by mbarriers, warp specialisation (one producer warp, two
// consumer warpgroups of 64 rows each with the registers moved to them by setmaxnreg), and
// wgmma for S = Q K^T (both operands from shared memory) and O += P V (P from registers, V
// transposed through its descriptor). Online softmax in fp32 with exp2. head_dim 128 only; the
// plan's items (attention_plan.h: 128 packed rows, keys [0, key_end)) are the CTA tiles.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/prefill_sm90.h"
#include "kernels/paged_attention/prefill_wgmma.cuh"
#include "kernels/paged_attention/tma_util.cuh"

namespace tandem::attention::sm90 {
namespace {

constexpr int kD = 128;
constexpr int kWgRows = 64;                       // rows per consumer warpgroup
constexpr int kKeys = 128;                        // keys per K/V tile
constexpr int kRowBytes = 128;                    // one swizzled row: 64 bf16
constexpr int kQHalfBytes = kWgRows * kRowBytes;  // 8 KB: 64 rows x 64 dims
constexpr int kKvHalfBytes = kKeys * kRowBytes;   // 16 KB: 128 keys x 64 dims
constexpr int kThreads = 384;                     // warpgroup 0: producer; 1, 2: consumers
constexpr int kConsumerWarps = 8;
constexpr int kProducerRegs = 40;
constexpr int kConsumerRegs = 232;  // 128 * 40 + 256 * 232 = 64512 <= 65536
static_assert(kPrefillRows == 2 * kWgRows, "a plan item is the two consumer warpgroups' rows");

// Every tile is [half][rows][128 bytes], 128-byte swizzled (prefill_wgmma.cuh), 1024-aligned.
template <int kStages>
struct Smem {
  uint8_t q[2][2][kQHalfBytes];  // [warpgroup][half of head_dim]
  uint8_t k[kStages][2][kKvHalfBytes];
  uint8_t v[kStages][2][kKvHalfBytes];
  uint64_t full[kStages];    // K and V of the stage landed (TMA bytes, or the producer's arrive)
  uint64_t empty[kStages];   // all consumer warps are done with the stage
  uint64_t landed[kStages];  // tail tiles: the TMA bytes landed, before the producer's fix-up
};

__device__ __forceinline__ int CeilDiv(int a, int b) { return (a + b - 1) / b; }

// Producer (one warp). For each tile: wait until the stage is free, then lane j < (chunks with
// a visible key) copies chunk j — `chunk` keys of one page, both head_dim halves of K and V —
// with four TMA boxes. A tile that reaches past key_end lands on `landed` instead; the warp then
// zeroes the V rows >= key_end (unwritten cache rows may hold NaN, and 0 * NaN is NaN in P V)
// and arrives on `full` itself.
template <int kStages>
__device__ void Produce(const PagedAttentionArgs& a, const CUtensorMap* map,
                        const AttentionWorkItem* items, int num_items, Smem<kStages>& sm,
                        int lane) {
  const int chunk = min(a.page_size, kKeys);
  const int shift = PageShift(a.page_size);
  const uint32_t chunk_bytes = chunk * kD * 2 * 2;  // K and V
  uint32_t cnt = 0, landed_parity = 0;
  for (int idx = blockIdx.x; idx < num_items; idx += gridDim.x) {
    const AttentionWorkItem it = items[idx];
    const int32_t* table = a.block_tables + int64_t{it.seq} * a.max_pages_per_seq;
    const int tiles = CeilDiv(it.key_end - it.key_begin, kKeys);
    for (int t = 0; t < tiles; ++t, ++cnt) {
      const int stage = cnt % kStages;
      MbarWait(&sm.empty[stage], ((cnt / kStages) & 1) ^ 1);
      const int key0 = it.key_begin + t * kKeys;
      const int valid = min(it.key_end - key0, kKeys);
      const int chunks = CeilDiv(valid, chunk);
      uint64_t* bar = valid < kKeys ? &sm.landed[stage] : &sm.full[stage];
      if (lane == 0) MbarArriveExpectTx(bar, chunks * chunk_bytes);
      __syncwarp();
      if (lane < chunks) {
        const int key = key0 + lane * chunk;
        const int64_t page = table[key >> shift];
        const int k_row = static_cast<int>(
            ((page * 2) * a.num_kv_heads + it.kv_head) * a.page_size + (key & (a.page_size - 1)));
        const int v_row = k_row + a.num_kv_heads * a.page_size;
        const int off = lane * chunk * kRowBytes;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          TmaLoad2d(sm.k[stage][h] + off, map, h * 64, k_row, bar);
          TmaLoad2d(sm.v[stage][h] + off, map, h * 64, v_row, bar);
        }
      }
      if (valid < kKeys) {
        MbarWait(bar, (landed_parity >> stage) & 1);
        landed_parity ^= 1u << stage;
        const uint4 zero = make_uint4(0, 0, 0, 0);
        for (int p = valid * 16 + lane; p < kKeys * 16; p += 32) {
          // Whole 128-byte rows: the swizzle only permutes chunks inside a row.
          const int row = p >> 4, h = (p >> 3) & 1, c = p & 7;
          reinterpret_cast<uint4*>(sm.v[stage][h] + row * kRowBytes)[c] = zero;
        }
        FenceProxyAsync();
        __syncwarp();
        if (lane == 0) MbarArrive(&sm.full[stage]);
      }
    }
  }
}

// Copies the warpgroup's 64 packed query rows into its swizzled Q tile (rows past the item: 0).
__device__ void LoadQuery(const PagedAttentionArgs& a, const AttentionWorkItem& it, int row0,
                          uint8_t (&q_s)[2][kQHalfBytes], int tid) {
  const int group = a.num_q_heads / a.num_kv_heads;
  const int64_t q_stride = a.q_stride != 0 ? a.q_stride : int64_t{a.num_q_heads} * kD;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  uint4 v[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = tid + i * 128, r = c >> 4, ch = c & 15;
    v[i] = make_uint4(0, 0, 0, 0);
    if (row0 + r < it.num_rows) {
      const int packed = it.row_begin + row0 + r;
      const int64_t token = it.token_begin + packed / group;
      const int head = it.kv_head * group + packed % group;
      v[i] = *reinterpret_cast<const uint4*>(q + token * q_stride + int64_t{head} * kD + ch * 8);
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = tid + i * 128, r = c >> 4, ch = c & 15;
    reinterpret_cast<uint4*>(q_s[ch >> 3] + r * kRowBytes)[(ch & 7) ^ (r & 7)] = v[i];
  }
}

// Online softmax of one 64 x 128 score tile (raw Q K^T in s, this thread's rows g and g + 8 of
// its warp); turns s into P (unnormalised, as bf16 A fragments) and rescales o and l.
__device__ __forceinline__ void Softmax(float (&s)[64], float (&o)[64], float (&m)[2],
                                        float (&l)[2], uint32_t (&p)[8][4], int key0,
                                        const int (&limit)[2], bool masked, float scale_log2,
                                        int quad) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    if (masked && key0 + (i >> 2) * 8 + 2 * quad + (i & 1) >= limit[(i >> 1) & 1]) {
      s[i] = -INFINITY;
    }
    mx[(i >> 1) & 1] = fmaxf(mx[(i >> 1) & 1], s[i]);
  }
  float base[2], corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m[r], mx[r] * scale_log2);
    base[r] = m_new == -INFINITY ? 0.0f : m_new;  // no visible key yet: no NaN
    corr[r] = exp2f(m[r] - base[r]);
    m[r] = m_new;
    l[r] *= corr[r];
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int r = (i >> 1) & 1;
    s[i] = exp2f(fmaf(s[i], scale_log2, -base[r]));
    l[r] += s[i];
    o[i] *= corr[r];
  }
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    p[kk][0] = PackBf16(s[8 * kk + 0], s[8 * kk + 1]);
    p[kk][1] = PackBf16(s[8 * kk + 2], s[8 * kk + 3]);
    p[kk][2] = PackBf16(s[8 * kk + 4], s[8 * kk + 5]);
    p[kk][3] = PackBf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// One consumer warpgroup: rows [row0, row0 + 64) of every item of this CTA.
template <int kStages>
__device__ void Consume(const PagedAttentionArgs& a, const AttentionWorkItem* items, int num_items,
                        Smem<kStages>& sm, int wg, int tid) {
  const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, quad = lane & 3;
  const int group = a.num_q_heads / a.num_kv_heads;
  const float scale_log2 = a.scale * kLog2e;
  const int row0 = wg * kWgRows;
  uint32_t cnt = 0;
  for (int idx = blockIdx.x; idx < num_items; idx += gridDim.x) {
    const AttentionWorkItem it = items[idx];
    NamedBarrierSync(1 + wg, 128);  // the previous item's wgmma no longer read q_s
    LoadQuery(a, it, row0, sm.q[wg], tid);
    FenceProxyAsync();
    NamedBarrierSync(1 + wg, 128);
    const bool active = row0 < it.num_rows;
    const int last = min(row0 + kWgRows, it.num_rows) - 1;
    const int min_limit = min(it.first_pos + (it.row_begin + row0) / group + 1, it.key_end);
    const int max_limit =
        active ? min(it.first_pos + (it.row_begin + last) / group + 1, it.key_end) : 0;
    int limit[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + warp * 16 + g + 8 * r;
      limit[r] = row < it.num_rows
                     ? min(it.first_pos + (it.row_begin + row) / group + 1, it.key_end)
                     : it.key_end;
    }
    float o[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.0f;
    const int tiles = CeilDiv(it.key_end - it.key_begin, kKeys);
    for (int t = 0; t < tiles; ++t, ++cnt) {
      const int stage = cnt % kStages;
      MbarWait(&sm.full[stage], (cnt / kStages) & 1);
      const int key0 = it.key_begin + t * kKeys;
      if (key0 < max_limit) {
        float s[64];
        WgmmaFence();
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks) {
          const int h = ks >> 2, off = (ks & 3) * 32;
          WgmmaSs(s, SmemDesc(sm.q[wg][h] + off, 16, kSwizzleAtomBytes),
                  SmemDesc(sm.k[stage][h] + off, 16, kSwizzleAtomBytes), ks);
        }
        WgmmaCommit();
        WgmmaWait<0>();
        FenceRegs(s);
        uint32_t p[8][4];
        Softmax(s, o, m, l, p, key0, limit, key0 + kKeys > min_limit, scale_log2, quad);
        WgmmaFence();
#pragma unroll
        for (int kk = 0; kk < kKeys / 16; ++kk) {
          WgmmaRsTransB(
              o, p[kk],
              SmemDesc(sm.v[stage][0] + kk * 16 * kRowBytes, kKvHalfBytes, kSwizzleAtomBytes));
        }
        WgmmaCommit();
        WgmmaWait<0>();
        FenceRegs(o);
      }
      __syncwarp();
      if (lane == 0) MbarArrive(&sm.empty[stage]);
    }
    if (!active) continue;
    auto* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
      const int row = row0 + warp * 16 + g + 8 * r;
      if (row >= it.num_rows) continue;
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      const int packed = it.row_begin + row;
      const int64_t token = it.token_begin + packed / group;
      const int head = it.kv_head * group + packed % group;
      auto* dst = reinterpret_cast<uint32_t*>(out + (token * a.num_q_heads + head) * kD);
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        dst[j * 4 + quad] = PackBf16(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
      }
    }
  }
}

template <int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillSm90Kernel(const __grid_constant__ PagedAttentionArgs a,
                      const __grid_constant__ CUtensorMap kv_map, const AttentionWorkItem* items,
                      const int32_t* counts) {
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<Smem<kStages>*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kSwizzleAtomBytes - 1) &
      ~uintptr_t{kSwizzleAtomBytes - 1});
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&sm.full[s], 1);
      MbarInit(&sm.empty[s], kConsumerWarps);
      MbarInit(&sm.landed[s], 1);
    }
    FenceBarrierInit();
  }
  __syncthreads();
  const int num_items = counts[0];
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    RegDealloc<kProducerRegs>();
    if (threadIdx.x < 32) Produce(a, &kv_map, items, num_items, sm, threadIdx.x);
  } else {
    RegAlloc<kConsumerRegs>();
    Consume(a, items, num_items, sm, wg - 1, threadIdx.x - 128 * wg);
  }
}

// The K/V cache of one layer as a 2D tensor of rows of head_dim (kv_layout.h: a (page, K/V,
// head) is page_size consecutive rows); boxes of 64 dims x min(page_size, kKeys) rows.
absl::StatusOr<CUtensorMap> KvTensorMap(const PagedAttentionArgs& a) {
  static const auto encode = []() -> PFN_cuTensorMapEncodeTiled_v12000 {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return absl::InternalError("cuTensorMapEncodeTiled not found");
  CUtensorMap map;
  // Rows: any row a coordinate can name (int32); the block tables keep the copies in the pool.
  const cuuint64_t dims[2] = {kD, cuuint64_t{0x7fffffff}};
  const cuuint64_t strides[1] = {kD * sizeof(__nv_bfloat16)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(std::min(a.page_size, kKeys))};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(a.kv_layer), dims,
             strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled failed: ", int{r}));
  }
  return map;
}

template <int kStages>
absl::Status Launch(const PagedAttentionArgs& a, const AttentionPlan& plan, cudaStream_t stream) {
  ASSIGN_OR_RETURN(const CUtensorMap map, KvTensorMap(a));
  constexpr int kSmem = sizeof(Smem<kStages>) + kSwizzleAtomBytes;
  static std::atomic<int> cache[kMaxDevices];
  ASSIGN_OR_RETURN(const int per_sm,
                   BlocksPerSm(PrefillSm90Kernel<kStages>, kThreads, kSmem, cache));
  PrefillSm90Kernel<kStages>
      <<<NumSms() * per_sm, kThreads, kSmem, stream>>>(a, map, plan.items(), plan.counts());
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::attention::sm90

namespace tandem::attention {

bool Sm90PrefillSupported(const PagedAttentionArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.dtype == DType::kBF16 && a.kv_dtype == DType::kBF16 && a.head_dim == 128 &&
         a.page_size >= 8 && PageShift(a.page_size) >= 0 && aligned(a.q) && aligned(a.kv_layer) &&
         a.q_stride % 8 == 0;
}

absl::Status LaunchPrefillSm90(const PagedAttentionArgs& a, const AttentionPlan& plan,
                               cudaStream_t stream) {
  // 3 stages of 64 KB (K and V of 128 keys) fit beside the 32 KB of queries in 227 KB.
  const char* stages = std::getenv("TANDEM_PREFILL_STAGES");
  if (stages != nullptr && std::atoi(stages) == 2) return sm90::Launch<2>(a, plan, stream);
  return sm90::Launch<3>(a, plan, stream);
}

}  // namespace tandem::attention
