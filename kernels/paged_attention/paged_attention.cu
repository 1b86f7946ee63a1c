// Paged decode attention on sm_90a (FlashDecoding). Numerics: bf16 q/K/V, fp32 scores and
// softmax (log2 domain), P rounded to bf16 for the P.V mma (as FlashAttention does), fp32
// output accumulators; a split's partial output is stored in bf16 with an fp32 log-sum (as
// vLLM's split-KV partials) and combined in fp32.
//
// A 4-warp CTA takes work items (attention_plan.h) of 16 packed rows x one key split through a
// kDecodeStages-deep cp.async pipeline of kDecodeKeys-key tiles; each warp computes a quarter
// of every tile, the warps merge at the end of the item, and the CTA that finishes the last
// split of a range combines the splits (attention_combine.cuh).
//
// FP8 cache (kF8E4M3): the pipeline stages hold the tiles' e4m3 codes and per-token scales
// (fp8_tile.cuh: 16-byte copies, the block-table-per-lane fast path for pages of >= 4 tokens).
// Two kernels (Fp8DecodeKernel, paged_attention.h): kDequant, each warp dequantizes its quarter
// of a tile into a bf16 tile in shared memory and runs the same ProcessTile; kFused, twice the
// stages (half the bytes each; swizzled; plain copies, WORKLOG.md step 14) and each warp reads its
// codes from the stage into f16 mma operands with the scales outside the dot products
// (fp8_fused_tile.cuh). bf16 and kFused run plans without merges on the stream kernel
// (stream_decode.cu: one pipeline across a CTA's items) unless TANDEM_DECODE_UNSPLIT says
// otherwise (UnsplitVariant).
#include <cuda_bf16.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/common/pdl.cuh"
#include "kernels/paged_attention/attention_combine.cuh"
#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/decode_stage_load.cuh"
#include "kernels/paged_attention/fp8_fused_tile.cuh"
#include "kernels/paged_attention/fp8_tile.cuh"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/paged_attention/stream_decode.h"

#ifdef TANDEM_DECODE_TRACE
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "base/check.h"
#endif

namespace tandem::attention {
namespace {

#ifdef TANDEM_DECODE_TRACE
// Diagnostic builds only (-DTANDEM_DECODE_TRACE, kernels/bench/runs/gpu_run_dec.sh): thread 0 of
// each CTA stamps the phases of its item with %globaltimer (ns, [e]) and clock64 ([8 + e]);
// `dep` makes the stamp wait for a value of the phase. Read by DecodeTracePrint.
constexpr int kTraceCtas = 1024, kTraceEvents = 7;
__device__ unsigned long long g_decode_trace[kTraceCtas][16];
__device__ __forceinline__ void DecodeTrace(int e, float dep) {
  if (threadIdx.x == 0 && blockIdx.x < kTraceCtas) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t) : "f"(dep) : "memory");
    g_decode_trace[blockIdx.x][e] = t;
    g_decode_trace[blockIdx.x][8 + e] = clock64();
  }
}
#define DECODE_TRACE(e, dep) DecodeTrace(e, static_cast<float>(dep))
#else
#define DECODE_TRACE(e, dep)
#endif

// Row stride (floats) of the warp merge's output rows: rows 8 banks apart, so the float2
// stores of a half-warp (4 rows x 4 threads) hit 32 distinct banks (rows D floats apart all
// started in bank 0: 8-way conflicts).
template <int D>
constexpr int MergeStride() {
  return D + 8;
}

// What the decode kernel's stages hold and how its warps compute (paged_attention.h's
// Fp8DecodeKernel for the two fp8 ones).
enum class KvMode { kBf16, kFp8Dequant, kFp8Fused };

// Pipeline depth: an fp8 stage is half a bf16 one, so the fused kernel takes twice the stages
// (the same bytes in flight per CTA as bf16, twice the keys); the dequantize kernel keeps three
// beside its bf16 tile.
// kCtas: CTAs per SM the variant is built for (__launch_bounds__); the fused kernel's three-CTA
// variant (an experiment, UnsplitVariant) keeps four stages so that three CTAs fit.
template <KvMode kMode, int kCtas = 2>
constexpr int DecodeStages() {
  if constexpr (kMode == KvMode::kFp8Fused) return kCtas == 3 ? 4 : 2 * kDecodeStages;
  return kDecodeStages;
}

// Dynamic shared memory of the decode kernel: the K/V pipeline, reused by the warp merge.
// fp8: the stages hold fp8 tiles; kFp8Dequant adds one bf16 K/V tile the warps dequantize into.
template <int D, KvMode kMode = KvMode::kBf16, int kCtas = 2>
constexpr int DecodeSmemBytes() {
  constexpr int kBf16Tile = 2 * TileElems<D, kDecodeKeys>() * sizeof(__nv_bfloat16);
  constexpr int kStages = DecodeStages<kMode, kCtas>();
  constexpr int kFp8Stages = kStages * Fp8StageBytes<D, kDecodeKeys>();
  constexpr int kPipe = kMode == KvMode::kBf16         ? kStages * kBf16Tile
                        : kMode == KvMode::kFp8Dequant ? kFp8Stages + kBf16Tile
                                                       : kFp8Stages;
  static_assert(attention::CombineStageBytes<D, kDecodeWarps * 32>() <= kPipe,
                "the split combine stages its rows in the K/V pipeline's shared memory");
  constexpr int kMerge =
      kDecodeWarps * kDecodeRows * (MergeStride<D>() + 2) * static_cast<int>(sizeof(float));
  return kPipe > kMerge ? kPipe : kMerge;
}

// Merges the four warps' softmax states of one decode item (each warp saw a quarter of every
// tile) through shared memory and writes the output rows, or the bf16 partial rows and their
// log2-sum-exp. `smem` holds [4][16][MergeStride] fp32 outputs, then [4][16] maxima and [4][16]
// sums. Thread i then owns row i / 8 and the float4 columns 4 (i % 8) + 32 j: eight threads
// read 128 contiguous bytes of a row (conflict-free). kFused: acc.o in the fused kernel's
// permuted dim order (fp8_fused_tile.cuh), put back in order on the way into shared memory.
template <int D, bool kFused = false>
__device__ void MergeWarpsAndStore(const PagedAttentionArgs& a, const AttentionWorkItem& it,
                                   WarpAccum<D>& acc, float* smem, uint16_t* partial_out,
                                   float* partial_lse) {
  constexpr int kStride = MergeStride<D>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  float* o_s = smem;
  float* m_s = o_s + kDecodeWarps * kDecodeRows * kStride;
  float* l_s = m_s + kDecodeWarps * kDecodeRows;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    acc.l[i] += __shfl_xor_sync(0xffffffffu, acc.l[i], 1);
    acc.l[i] += __shfl_xor_sync(0xffffffffu, acc.l[i], 2);
    const int row = warp * kDecodeRows + g + 8 * i;
    if constexpr (kFused) {
      StoreFusedRow(acc, i, t, o_s + row * kStride);
    } else {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        reinterpret_cast<float2*>(o_s + row * kStride)[n * 4 + t] =
            make_float2(acc.o[n][2 * i], acc.o[n][2 * i + 1]);
      }
    }
    if (t == 0) {
      m_s[row] = acc.m[i];
      l_s[row] = acc.l[i];
    }
  }
  __syncthreads();
  static_assert(kDecodeRows * 8 == kDecodeWarps * 32, "8 threads per row");
  constexpr int kVecs = D / 32;  // float4 columns per thread
  const int r = threadIdx.x >> 3;
  const int c = (threadIdx.x & 7) * 4;
  if (r < it.num_rows) {
    float mx = -INFINITY;
    for (int w = 0; w < kDecodeWarps; ++w) mx = fmaxf(mx, m_s[w * kDecodeRows + r]);
    float e[kDecodeWarps], sum = 0.0f;
    for (int w = 0; w < kDecodeWarps; ++w) {
      const float m = m_s[w * kDecodeRows + r];
      e[w] = m == -INFINITY ? 0.0f : exp2f(m - mx);
      sum += e[w] * l_s[w * kDecodeRows + r];
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    uint2 packed[kVecs];  // 4 bf16 per float4 column
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int w = 0; w < kDecodeWarps; ++w) {
        const float4 o =
            *reinterpret_cast<const float4*>(o_s + (w * kDecodeRows + r) * kStride + c + 32 * j);
        x.x += e[w] * o.x, x.y += e[w] * o.y, x.z += e[w] * o.z, x.w += e[w] * o.w;
      }
      packed[j] = make_uint2(attention::PackBf16(x.x * inv, x.y * inv),
                             attention::PackBf16(x.z * inv, x.w * inv));
    }
    uint16_t* dst = MergedRowDst<D>(a, it, r, c == 0, mx, sum, partial_out, partial_lse);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) *reinterpret_cast<uint2*>(dst + c + 32 * j) = packed[j];
  }
}

// One CTA per work item at a time: the four warps share a DecodeStages-deep cp.async pipeline
// of kDecodeKeys-key tiles; warp w computes keys [16 w, 16 w + 16) of every tile with its own
// online softmax, and the states are merged at the end of the item.
// kSplit: the variant for plans with split merges (small batches, a few tiles per item, where
// start-up and tail latency dominate): the CTA's first item is read speculatively together
// with the item count (slot blockIdx.x exists up to max_items) and the next one while the K/V
// stream, the merge item is read ahead (no dependent load before the arrival counter), and the
// K/V copies are evict-first (bf16 only: step 14 says why not fp8), so the plan, block tables,
// queries and partials stay in L2. For plans without merges (large batches) none of this pays, and
// the hint costs bandwidth. Launched with PDL (PagedAttentionArgs::overlap_launch), a CTA issues
// its first item's prologue copies before griddepcontrol.wait when they all end before the item's
// first new token (the one position range the kernel ahead in the stream may be writing);
// everything else comes after it. Without PDL the wait is a no-op.
template <int D, bool kSplit, KvMode kMode, int kCtas = 2>
__global__ void __launch_bounds__(kDecodeWarps * 32, kCtas)
    DecodeKernel(const __grid_constant__ PagedAttentionArgs a, const AttentionWorkItem* items,
                 const AttentionMergeItem* merges, const int32_t* counts, int32_t* counters,
                 uint16_t* partial_out, float* partial_lse, int max_items, const Fp8Pages geo) {
  extern __shared__ uint4 smem_raw[];
  constexpr bool kFp8 = kMode != KvMode::kBf16;
  constexpr bool kFused = kMode == KvMode::kFp8Fused;
  constexpr int kStages = DecodeStages<kMode, kCtas>();
  constexpr int kTile = TileElems<D, kDecodeKeys>();
  constexpr int kSub = kDecodeWarpKeys * (D + kRowPad);  // one warp's quarter of a tile
  constexpr int kStage8 = Fp8StageBytes<D, kDecodeKeys>();
  auto* base = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  auto* base8 = reinterpret_cast<uint8_t*>(smem_raw);
  // kFp8Dequant: the bf16 tile after the fp8 stages; warp w dequantizes into its quarter.
  auto* deq = reinterpret_cast<__nv_bfloat16*>(base8 + kStages * kStage8);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float scale_log2 = a.scale * attention::kLog2e;
  bool waited = false;  // griddepcontrol.wait passed: q, the new K/V rows and outputs are ours
  AttentionWorkItem next_it{};
  uint64_t policy = 0;
  if constexpr (kSplit) {
    if (static_cast<int>(blockIdx.x) < max_items) next_it = items[blockIdx.x];
    policy = attention::EvictFirstPolicy();
  }
  // Issues the copies of the tile at key0 into stage `stage` (bf16 or fp8).
  auto load_tile = [&](const KvView& view, int32_t entries, int key0, int key_end, int stage) {
    if constexpr (kFp8) {
      // No L2 hint on fp8 copies: with it, ptxas (CUDA 13.0) encoded the fused split
      // variant's copies with an odd uniform-register descriptor, an illegal instruction
      // (WORKLOG.md step 14).
      LoadDecodeTileFp8<D, kFused, false>(view, geo, entries, key0, key_end,
                                          base8 + stage * kStage8, policy);
    } else {
      LoadDecodeTile<D, kSplit>(view, entries, key0, key_end, base + stage * 2 * kTile, policy);
    }
  };
  DECODE_TRACE(0, 0);
  const int num_items = counts[0];
  for (int idx = blockIdx.x; idx < num_items; idx += gridDim.x) {
    // The CTA's last item: the next kernel (PDL) may be scheduled as CTAs finish.
    if (idx + static_cast<int>(gridDim.x) >= num_items) AllowDependentLaunch();
    if constexpr (!kSplit) next_it = items[idx];
    const AttentionWorkItem it = next_it;
    AttentionMergeItem mi{};
    if constexpr (kSplit) {
      if (it.merge >= 0) mi = merges[it.merge];
    }
    const KvView view{static_cast<const __nv_bfloat16*>(a.kv_layer),
                      a.block_tables + int64_t{it.seq} * a.max_pages_per_seq,
                      a.num_kv_heads,
                      a.page_size,
                      attention::PageShift(a.page_size),
                      it.kv_head};
    const int tiles = (it.key_end - it.key_begin + kDecodeKeys - 1) / kDecodeKeys;
    DECODE_TRACE(1, tiles);
    __syncthreads();  // the previous item's merge no longer reads shared memory
    // K/V loads first: they are the long pole; the queries load while they fly. The block-table
    // entries of a tile are read one tile ahead of its copies. Before the dependency wait only
    // when every prologue tile ends at or before the item's first new token.
    const int prologue = min(tiles, kStages - 1);
    if (!waited && it.key_begin + prologue * kDecodeKeys > it.first_pos) {
      cudaGridDependencySynchronize();
      waited = true;
    }
    int32_t entries[kStages];
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      entries[s] = DecodeTileEntries(view, it.key_begin + s * kDecodeKeys, it.key_end);
    }
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < tiles) load_tile(view, entries[s], it.key_begin + s * kDecodeKeys, it.key_end, s);
      attention::CpAsyncCommit();
    }
    if (!waited) {
      cudaGridDependencySynchronize();
      waited = true;
    }
    int32_t next_entries = entries[kStages - 1];
    if constexpr (kSplit) {
      if (idx + static_cast<int>(gridDim.x) < num_items) next_it = items[idx + gridDim.x];
    }
    const WarpRows<D> w = SliceRows<D>(a, it, it.row_begin, lane);
    WarpAccum<D> acc;
    attention::InitAccum(acc);
    FusedState fused;
    if constexpr (kFused) {
      fused.k_factor = LoadQueryFused(acc, w.q[0], w.q[1], lane, scale_log2);
    } else {
      attention::LoadQuery(acc, w.q[0], w.q[1], lane & 3);
    }
    for (int i = 0; i < tiles; ++i) {
      const int next = i + kStages - 1;
      if (next < tiles) {
        load_tile(view, next_entries, it.key_begin + next * kDecodeKeys, it.key_end,
                  next % kStages);
      }
      attention::CpAsyncCommit();
      next_entries = DecodeTileEntries(view, it.key_begin + (next + 1) * kDecodeKeys, it.key_end);
      attention::CpAsyncWait<kStages - 1>();
      __syncthreads();
      if (i == 0) DECODE_TRACE(2, 0);
      const int key0 = it.key_begin + i * kDecodeKeys + warp * kDecodeWarpKeys;
      const bool masked = key0 + kDecodeWarpKeys > w.min_limit;
      if (key0 < w.max_limit) {
        if constexpr (kFused) {
          ProcessTileFused<D, kDecodeKeys>(acc, fused, base8 + (i % kStages) * kStage8,
                                           warp * kDecodeWarpKeys, key0, w.limit, masked, lane);
        } else {
          const __nv_bfloat16* buf = base + (i % kStages) * 2 * kTile + warp * kSub;
          if constexpr (kFp8) {
            buf = deq + warp * kSub;
            DequantizeTileFp8<D, kDecodeKeys, kDecodeWarpKeys, 32>(
                base8 + (i % kStages) * kStage8, warp * kDecodeWarpKeys, deq + warp * kSub,
                deq + kTile + warp * kSub, lane);
            __syncwarp();
          }
          attention::ProcessTile<D, kDecodeWarpKeys>(acc, buf, buf + kTile, key0, w.limit, masked,
                                                     scale_log2, lane);
        }
      }
      __syncthreads();
    }
    DECODE_TRACE(3, acc.m[0]);
    if constexpr (kFused) FinishFused(acc, fused);
    MergeWarpsAndStore<D, kFused>(a, it, acc, reinterpret_cast<float*>(smem_raw), partial_out,
                                  partial_lse);
    DECODE_TRACE(4, 0);
    if (it.merge >= 0) {
      if constexpr (!kSplit) mi = merges[it.merge];
      const bool last = attention::ArriveLast(counters + it.merge, mi.num_splits);
      DECODE_TRACE(5, last);
      if (last) {
        attention::CombineSplits<D, kDecodeWarps * 32>(a, mi, partial_out, partial_lse,
                                                       reinterpret_cast<uint16_t*>(smem_raw));
        DECODE_TRACE(6, 0);
      }
    }
  }
}

// PDL (a.overlap_launch) only for the split variant: there each launch is a few microseconds and
// the overlap took 10-14% off (H200, WORKLOG.md step 10); plans without splits measured -2.4% to
// +1.9% with it (contexts of 16k lost), so they launch plain.
template <int D, bool kSplit, KvMode kMode, int kCtas = 2>
absl::Status LaunchDecodeKernel(const PagedAttentionArgs& a, const AttentionPlan& plan,
                                cudaStream_t stream) {
  constexpr int kSmem = DecodeSmemBytes<D, kMode, kCtas>();
  static std::atomic<int> cache[kMaxDevices];
  ASSIGN_OR_RETURN(const int per_sm, BlocksPerSm(DecodeKernel<D, kSplit, kMode, kCtas>,
                                                 kDecodeWarps * 32, kSmem, cache));
  const Fp8Pages geo = Fp8Geometry(a);
  CUDA_RETURN_IF_ERROR(LaunchMaybePdl(
      DecodeKernel<D, kSplit, kMode, kCtas>, dim3(static_cast<unsigned>(NumSms() * per_sm)),
      dim3(kDecodeWarps * 32), kSmem, stream, /*pdl=*/kSplit && a.overlap_launch, a, plan.items(),
      plan.merges(), plan.counts(), plan.merge_counters(), plan.partial_out(), plan.partial_lse(),
      plan.capacity().max_items, geo));
  return absl::OkStatus();
}

// How plans without merges (large batches) run on a bf16 cache and on the fused FP8 kernel:
// kStream, the stream kernel (stream_decode.cu: one pipeline per CTA across its items; WORKLOG.md
// steps 16-17); kRing, this file's DecodeKernel (its ring restarted at every item); kRing3, the
// fused kernel's four-stage variant with three CTAs per SM (step 15; bf16 takes kRing).
// TANDEM_DECODE_UNSPLIT = "stream" | "ring" | "ring3" (read once per process; unset or empty:
// kStream; another value fails every such launch). The dequantize kernel always runs its ring;
// plans that split key ranges (AttentionPlan::split_kv) take the split variant whatever the
// choice; balanced plans (merges only where a unit is cut between two CTAs) count as unsplit.
enum class Unsplit { kStream, kRing, kRing3 };

absl::StatusOr<Unsplit> UnsplitVariant() {
  static const absl::StatusOr<Unsplit> variant = []() -> absl::StatusOr<Unsplit> {
    const char* v = std::getenv("TANDEM_DECODE_UNSPLIT");
    if (v == nullptr || *v == '\0' || std::string_view(v) == "stream") return Unsplit::kStream;
    if (std::string_view(v) == "ring") return Unsplit::kRing;
    if (std::string_view(v) == "ring3") return Unsplit::kRing3;
    return absl::InvalidArgumentError(
        std::string("TANDEM_DECODE_UNSPLIT must be stream, ring or ring3, not \"") + v + "\"");
  }();
  return variant;
}

template <int D, KvMode kMode>
absl::Status LaunchDecodeMode(const PagedAttentionArgs& a, const AttentionPlan& plan,
                              cudaStream_t stream) {
  if (plan.split_kv()) return LaunchDecodeKernel<D, true, kMode>(a, plan, stream);
  if constexpr (kMode != KvMode::kFp8Dequant) {
    ASSIGN_OR_RETURN(const Unsplit variant, UnsplitVariant());
    if (variant == Unsplit::kStream) return LaunchStreamDecode(a, plan, stream);
    if (kMode == KvMode::kFp8Fused && variant == Unsplit::kRing3) {
      return LaunchDecodeKernel<D, false, kMode, 3>(a, plan, stream);
    }
  }
  return LaunchDecodeKernel<D, false, kMode>(a, plan, stream);
}

// The fp8 kernel of a.fp8_decode; kDefault takes TANDEM_FP8_DECODE, read once per process (the
// decode host path runs every layer of every step).
absl::StatusOr<Fp8DecodeKernel> Fp8Kernel(const PagedAttentionArgs& a) {
  if (a.fp8_decode != Fp8DecodeKernel::kDefault) return a.fp8_decode;
  static const absl::StatusOr<Fp8DecodeKernel> from_env =
      ResolveFp8DecodeKernel(Fp8DecodeKernel::kDefault, std::getenv("TANDEM_FP8_DECODE"));
  return from_env;
}

// The variant follows the plan's last build (its host-side split_kv). Both variants
// compute the same function for any plan, so a graph captured with one plan and replayed with
// a rebuilt one stays correct; only the choice of variant is the captured one.
template <int D>
absl::Status LaunchDecode(const PagedAttentionArgs& a, const AttentionPlan& plan,
                          cudaStream_t stream) {
  if (a.kv_dtype == DType::kF8E4M3) {
    ASSIGN_OR_RETURN(const Fp8DecodeKernel kernel, Fp8Kernel(a));
    if (kernel == Fp8DecodeKernel::kFused) {
      return LaunchDecodeMode<D, KvMode::kFp8Fused>(a, plan, stream);
    }
    return LaunchDecodeMode<D, KvMode::kFp8Dequant>(a, plan, stream);
  }
  return LaunchDecodeMode<D, KvMode::kBf16>(a, plan, stream);
}

}  // namespace
}  // namespace tandem::attention

namespace tandem {

#ifdef TANDEM_DECODE_TRACE
void DecodeTraceClear() {
  static unsigned long long zeros[attention::kTraceCtas][16] = {};
  CHECK_EQ(cudaMemcpyToSymbol(attention::g_decode_trace, zeros, sizeof(zeros)), cudaSuccess);
}

// Prints the phase stamps of the last launch (after DecodeTraceClear): per event, over the CTAs
// that stamped it, min / p50 / p90 / max in us after the earliest kernel entry; then per-CTA
// phase lengths from clock64 (p50 / max, cycles / 1.98 GHz).
void DecodeTracePrint(const char* label) {
  static unsigned long long t[attention::kTraceCtas][16];
  CHECK_EQ(cudaMemcpyFromSymbol(t, attention::g_decode_trace, sizeof(t)), cudaSuccess);
  unsigned long long t0 = ~0ull;
  for (const auto& c : t) {
    if (c[1] != 0) t0 = std::min(t0, c[0]);
  }
  auto stats = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    if (v.empty()) return std::string("-");
    const auto at = [&](double f) { return v[static_cast<size_t>(f * (v.size() - 1))]; };
    char buf[96];
    std::snprintf(buf, sizeof(buf), "n=%zu %.2f/%.2f/%.2f/%.2f", v.size(), v.front(), at(0.5),
                  at(0.9), v.back());
    return std::string(buf);
  };
  std::string line = std::string("TRACE ") + label + " abs(us min/p50/p90/max):";
  for (int e = 0; e < attention::kTraceEvents; ++e) {
    std::vector<double> v;
    for (const auto& c : t) {
      if (c[1] != 0 && c[e] != 0) v.push_back((c[e] - t0) * 1e-3);
    }
    line += " e" + std::to_string(e) + "[" + stats(v) + "]";
  }
  line += " | phase(us min/p50/p90/max):";
  for (int e = 1; e < attention::kTraceEvents; ++e) {
    std::vector<double> v;
    for (const auto& c : t) {
      if (c[1] != 0 && c[e] != 0 && c[e - 1] != 0) v.push_back((c[8 + e] - c[8 + e - 1]) / 1980.0);
    }
    line += " " + std::to_string(e - 1) + "-" + std::to_string(e) + "[" + stats(v) + "]";
  }
  std::printf("%s\n", line.c_str());
}
#endif

absl::Status PagedAttentionDecode(const PagedAttentionArgs& args, const AttentionPlan& plan,
                                  cudaStream_t stream) {
  if (args.num_seqs == 0) return absl::OkStatus();
  RETURN_IF_ERROR(attention::CheckArgs(args, plan));
  switch (args.head_dim) {
    case 64:
      return attention::LaunchDecode<64>(args, plan, stream);
    case 128:
      return attention::LaunchDecode<128>(args, plan, stream);
  }
  return absl::InvalidArgumentError("unsupported head_dim");
}

}  // namespace tandem
