// Mixed-input tensor-core GEMM for weight-only INT8 / UINT4 codes and bf16 activations, steps of
// up to kQuantTcMaxM tokens (quant_gemm.h for the layout and the contract; WORKLOG.md step 7 for
// why each choice).
//
// Swapped operands: c^T[n, m] = dequant(w)[n, k] · a^T, so the weight is the A operand of
// mma.sync.m16n8k16 (16 weight rows per row tile) and the tokens are its 8-wide N dimension (kNt
// n-tiles, m rounded up to 8 * kNt; padding tokens read zero activations and are not stored).
//
// A chunk is 64 code bytes of a row (int8: 64 k, uint4: 128 k). Lane (g, t) (g = lane / 4,
// t = lane % 4) loads bytes [16t, 16t + 16) of the chunk for rows g and g + 8 of each row tile:
// one 16-byte L1-bypassing load each, straight into registers. A dot product over k does not
// care about the order of k, so inside a chunk the mma's logical k is permuted such that those
// 16 bytes are exactly the lane's A-fragment elements for all the chunk's mma steps; the lane's
// B fragments (the same logical k, which the mma pairs with the same t) are read from a at the
// matching actual k's:
//   int8,  step s (0..3):  logical 2t+e -> 16t + 4s + e,    2t+8+e -> 16t + 4s + 2 + e
//   uint4, step s = 2w+q:  logical 2t+e -> 32t + 8w + 2q + 4e, 2t+8+e -> 32t + 8w + 2q + 1 + 4e
// (e = 0, 1). So a lane reads its activations as 16-byte vectors of a's rows at [16t, 16t + 16)
// (int8) or [32t, 32t + 32) (uint4) of the chunk: a few byte permutes (uint4) and no shared
// memory; a is small ([m, k] bf16) and is read through L1 / L2.
//
// Codes become exact bf16 pairs without the integer-to-float unit:
//   int8:  byte ^ 0x80 permuted into the mantissa of 2^23, minus 2^23 + 128 (exact fp32), and the
//          high halves of two floats packed by one permute (values -128..127: exact in bf16);
//   uint4: two nibbles masked into the mantissas of bf16 128.0 (0x4300: one ulp is 1), then one
//          bf16x2 subtraction of 128 + zero (0..16): exact, the result is -16..15.
// The mma accumulates one scale group (group_size % chunk == 0, or the whole row) in fp32; at a
// group change the partial is multiplied by the row's group scale in fp32 and added to the
// running fp32 sum. So only fp32 summation order and the final bf16 rounding differ from
// QuantGemmRef.
//
// Split-K inside a block: the block's kWarps warps own the block's 16 * kRowTiles rows together,
// chunk c going to warp c % kWarps; the warps' sums are added in a fixed tree in shared memory
// (deterministic). Unsplit, warp 0 then adds bias / the old c and stores bf16.
//
// Split-K across blocks (quant_gemm_tc_split.h; grid.y = splits): block (tile, s) runs the chunks
// of split s only, and warp 0 writes its sums to the workspace as they lie in its registers
// (partials[tile][s][i][lane], i its accumulator index: 128-byte lines). Then the classic
// last-block pattern: __threadfence, one atomicAdd on the tile's counter; the block that sees
// splits - 1 resets the counter to zero (for the next call and graph replays) and, with all 256
// threads, sums the tile's partials in split order 0, 1, ... (the bits do not depend on which
// block came last), adds bias / the old c and stores bf16. A split is a range of whole scale
// groups (or of chunks when one scale covers the row), so scales are applied per group in fp32 as
// unsplit.
//
// With QuantGemmArgs::overlap_launch (PDL) the first chunks' code loads are issued before
// griddepcontrol.wait; a, bias, c and the workspace are touched only after it.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/vec_util.cuh"
#include "kernels/quant_gemm/quant_gemm.h"
#include "kernels/quant_gemm/quant_tc_fragments.cuh"

namespace tandem {
namespace {

using quant_tc::AFragment;
using quant_tc::BFragment;
using quant_tc::ChunkK;
using quant_tc::Code;
using quant_tc::DeviceSms;
using quant_tc::kChunkBytes;
using quant_tc::kSymmetricZero;
using quant_tc::LaneAVectors;
using quant_tc::LaneK;
using quant_tc::LoadA16;
using quant_tc::Mma;
using quant_tc::Uint4Zero2;

constexpr int kWarps = static_cast<int>(kQuantTcBlockWarps);
constexpr int kThreads = 32 * kWarps;
constexpr int kRowTiles = 2;  // 16-row mma tiles per block (32 rows)
constexpr int kBlockRows = 16 * kRowTiles;
static_assert(kBlockRows == kQuantTcBlockRows);
constexpr int kUnroll = 2;  // chunks in flight per warp

struct Params {
  const __nv_bfloat16* a;     // [m, k]
  const __nv_bfloat16* bias;  // [n] or null
  __nv_bfloat16* c;           // [m, n]
  const uint8_t* w;           // [n, row_bytes]
  const float* scales;        // [n, num_groups]
  const uint8_t* zeros;       // [n, num_groups] or null (uint4 only)
  float* partials;            // [row tiles, splits, kVals, 32] (splits > 1)
  uint32_t* counters;         // [row tiles], zero between calls (splits > 1)
  int m, n, k, group_size, num_groups, row_bytes, num_chunks;
  int splits, chunks_per_split;
  bool accumulate;
};

// One chunk of every row tile into acc: w[rt][h] holds the lane's 16 code bytes of row
// 16 rt + g + 8h; zero2[rt][h] the uint4 zero point (unused for int8).
template <Code kCode, int kNt, bool kPdl>
__device__ __forceinline__ void MmaChunk(const Params& p, int chunk, const uint4 (&w)[kRowTiles][2],
                                         const uint32_t (&zero2)[kRowTiles][2],
                                         float (&acc)[kRowTiles][kNt][4]) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int k0 = chunk * ChunkK<kCode>() + LaneK<kCode>() * t;
#pragma unroll
  for (int v = 0; v < LaneAVectors<kCode>(); ++v) {  // a's 16-byte vector v: two mma steps
    uint4 av[kNt];
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const int tok = nt * 8 + g;
      av[nt] = tok < p.m ? LoadA16<kPdl>(p.a + static_cast<int64_t>(tok) * p.k + k0 + 8 * v)
                         : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int s = 2 * v + q;
      uint32_t b[kNt][2];
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) BFragment<kCode>(av[nt], q, b[nt][0], b[nt][1]);
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt) {
        uint32_t frag[4];
        AFragment<kCode>(w[rt], s, zero2[rt], frag);
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) Mma(acc[rt][nt], frag, b[nt][0], b[nt][1]);
      }
    }
  }
}

template <int kNt>
__device__ __forceinline__ void FoldGroup(const Params& p, int64_t row0, int group,
                                          float (&acc)[kRowTiles][kNt][4],
                                          float (&sum)[kRowTiles][kNt][4]) {
  const int g = (threadIdx.x % 32) / 4;
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = min(row0 + 16 * rt + g + 8 * h, static_cast<int64_t>(p.n) - 1);
      const float scale = __ldg(p.scales + row * p.num_groups + group);
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          sum[rt][nt][2 * h + e] = fmaf(acc[rt][nt][2 * h + e], scale, sum[rt][nt][2 * h + e]);
          acc[rt][nt][2 * h + e] = 0.0f;
        }
      }
    }
  }
}

// The block's output value of lane `lane`'s accumulator i (i = (rt * kNt + nt) * 4 + r: row
// 16 rt + g + 8 (r / 2), token 8 nt + 2t + r % 2), plus bias and the old c, rounded once to bf16;
// padding rows and tokens are not stored.
template <int kNt>
__device__ __forceinline__ void StoreOut(const Params& p, int64_t row0, int i, int lane, float v) {
  const int g = lane / 4, t = lane % 4, r = i % 4, nt = i / 4 % kNt, rt = i / (4 * kNt);
  const int64_t row = row0 + 16 * rt + g + 8 * (r / 2);
  const int tok = 8 * nt + 2 * t + r % 2;
  if (row >= p.n || tok >= p.m) return;
  __nv_bfloat16* c = p.c + static_cast<int64_t>(tok) * p.n + row;
  if (p.bias != nullptr) v += __bfloat162float(p.bias[row]);
  if (p.accumulate) v += __bfloat162float(*c);
  *c = __float2bfloat16_rn(v);
}

template <Code kCode, int kNt, bool kPdl>
__global__ void __launch_bounds__(kThreads, 1) QuantGemmTcKernel(const __grid_constant__ Params p) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kBlockRows;
  const int c_begin = static_cast<int>(blockIdx.y) * p.chunks_per_split;
  const int c_end = min(p.num_chunks, c_begin + p.chunks_per_split);
  float acc[kRowTiles][kNt][4] = {};
  float sum[kRowTiles][kNt][4] = {};
  int group = -1;  // the scale group acc holds
  bool waited = false;
  for (int c0 = c_begin + warp; c0 < c_end; c0 += kWarps * kUnroll) {
    uint4 w[kUnroll][kRowTiles][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * kWarps;
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = row0 + 16 * rt + g + 8 * h;
          w[u][rt][h] = (c < c_end && row < p.n)
                            ? LoadStreaming16(p.w + row * p.row_bytes +
                                              static_cast<int64_t>(c) * kChunkBytes + 16 * t)
                            : make_uint4(0, 0, 0, 0);
        }
      }
    }
    if constexpr (kPdl) {
      if (!waited) PdlWaitThenRelease();
    }
    waited = true;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * kWarps;
      if (c >= c_end) break;
      const int cg = c * ChunkK<kCode>() / p.group_size;
      if (cg != group) {
        if (group >= 0) FoldGroup<kNt>(p, row0, group, acc, sum);
        group = cg;
      }
      uint32_t zero2[kRowTiles][2] = {};
      if constexpr (kCode == Code::kUint4) {
#pragma unroll
        for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t row = min(row0 + 16 * rt + g + 8 * h, static_cast<int64_t>(p.n) - 1);
            zero2[rt][h] = Uint4Zero2(p.zeros != nullptr ? __ldg(p.zeros + row * p.num_groups + cg)
                                                         : kSymmetricZero);
          }
        }
      }
      MmaChunk<kCode, kNt, kPdl>(p, c, w[u], zero2, acc);
    }
  }
  if (group >= 0) FoldGroup<kNt>(p, row0, group, acc, sum);
  if constexpr (kPdl) {
    if (!waited) PdlWaitThenRelease();
  }

  // Fixed-order tree over the warps: warps [h, 2h) hand their sums to warps [0, h).
  constexpr int kVals = kRowTiles * kNt * 4;
  __shared__ float red[kWarps / 2][kVals][32];
#pragma unroll
  for (int half = kWarps / 2; half >= 1; half /= 2) {
    if (warp >= half && warp < 2 * half) {
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i)
            red[warp - half][(rt * kNt + nt) * 4 + i][lane] = sum[rt][nt][i];
    }
    __syncthreads();
    if (warp < half) {
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
          for (int i = 0; i < 4; ++i) sum[rt][nt][i] += red[warp][(rt * kNt + nt) * 4 + i][lane];
    }
    __syncthreads();
  }
  if (p.splits == 1) {
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < kVals; ++i)
      StoreOut<kNt>(p, row0, i, lane, sum[i / (4 * kNt)][i / 4 % kNt][i % 4]);
    return;
  }
  // Split: this block's sums into the workspace, then the tile's last block sums them all.
  float* tile_partials = p.partials + static_cast<int64_t>(blockIdx.x) * p.splits * kVals * 32;
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < kVals; ++i) {
      __stcg(tile_partials + (static_cast<int64_t>(blockIdx.y) * kVals + i) * 32 + lane,
             sum[i / (4 * kNt)][i / 4 % kNt][i % 4]);
    }
  }
  __threadfence();  // the partials are visible device-wide before the arrival is counted
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) {
    const uint32_t arrived = atomicAdd(p.counters + blockIdx.x, 1u);
    last = arrived == static_cast<uint32_t>(p.splits - 1);
    if (last) p.counters[blockIdx.x] = 0;  // every split has arrived: ready for the next call
    __threadfence();
  }
  __syncthreads();
  if (!last) return;
  for (int idx = threadIdx.x; idx < kVals * 32; idx += kThreads) {
    float v = __ldcg(tile_partials + idx);
    for (int s = 1; s < p.splits; ++s) v += __ldcg(tile_partials + s * (kVals * 32) + idx);
    StoreOut<kNt>(p, row0, idx / 32, idx % 32, v);
  }
}

template <Code kCode, int kNt>
absl::Status LaunchNt(const Params& p, bool pdl, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>((p.n + kBlockRows - 1) / kBlockRows),
                  static_cast<unsigned>(p.splits));
  if (!pdl) {
    QuantGemmTcKernel<kCode, kNt, false><<<grid, kThreads, 0, stream>>>(p);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(LaunchMaybePdl(QuantGemmTcKernel<kCode, kNt, true>, grid, dim3(kThreads), 0,
                                      stream, /*pdl=*/true, p));
  return absl::OkStatus();
}

// Token tiles of 8: m <= 8, 16, 32, 64 (a step of 33 tokens runs the 64-token tile).
int TokenTiles(int64_t m) { return m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8; }

template <Code kCode>
absl::Status LaunchM(const Params& p, bool pdl, cudaStream_t stream) {
  switch (TokenTiles(p.m)) {
    case 1:
      return LaunchNt<kCode, 1>(p, pdl, stream);
    case 2:
      return LaunchNt<kCode, 2>(p, pdl, stream);
    case 4:
      return LaunchNt<kCode, 4>(p, pdl, stream);
    default:
      return LaunchNt<kCode, 8>(p, pdl, stream);
  }
}

// Blocks of one instantiation resident per SM (its registers and shared memory), asked once per
// process; 1 if the runtime cannot say.
template <Code kCode, int kNt, bool kPdl>
int BlocksPerSmOf() {
  static const int blocks = [] {
    return quant_tc::QueryBlocksPerSm(QuantGemmTcKernel<kCode, kNt, kPdl>, kThreads);
  }();
  return blocks;
}

template <Code kCode, bool kPdl>
int BlocksPerSm(int nt) {
  switch (nt) {
    case 1:
      return BlocksPerSmOf<kCode, 1, kPdl>();
    case 2:
      return BlocksPerSmOf<kCode, 2, kPdl>();
    case 4:
      return BlocksPerSmOf<kCode, 4, kPdl>();
    default:
      return BlocksPerSmOf<kCode, 8, kPdl>();
  }
}

int BlocksPerSm(QuantCode code, int nt, bool pdl) {
  if (code == QuantCode::kUint4) {
    return pdl ? BlocksPerSm<Code::kUint4, true>(nt) : BlocksPerSm<Code::kUint4, false>(nt);
  }
  return pdl ? BlocksPerSm<Code::kInt8, true>(nt) : BlocksPerSm<Code::kInt8, false>(nt);
}

// The weight's side of QuantGemmTcCovers: codes, k and group_size.
bool WeightCovered(const QuantGemmArgs& w) {
  if (w.code != QuantCode::kInt8 && w.code != QuantCode::kUint4) return false;
  const int64_t chunk = QuantGemmTcChunkK(w.code);
  return w.n > 0 && w.k > 0 && w.k % chunk == 0 &&
         (w.group_size == w.k || (w.group_size > 0 && w.group_size % chunk == 0));
}

QuantTcSplitShape SplitShape(const QuantGemmArgs& w, int nt, bool pdl) {
  const int64_t chunk = QuantGemmTcChunkK(w.code);
  return {.n = w.n,
          .m_tile = 8 * nt,
          .num_chunks = w.k / chunk,
          .unit_chunks = w.group_size == w.k ? 1 : w.group_size / chunk,
          .row_bytes = QuantRowBytes(w.code, w.k),
          .sms = DeviceSms(),
          .blocks_per_sm = BlocksPerSm(w.code, nt, pdl)};
}

bool WorkspaceHolds(const QuantGemmArgs& args, const QuantTcSplitShape& shape,
                    const QuantTcSplitPlan& plan) {
  const QuantTcWorkspace& ws = args.tc_workspace;
  return ws.partials != nullptr && ws.counters != nullptr &&
         QuantTcPartialFloats(shape, plan) <= ws.partial_floats &&
         QuantTcRowTiles(args.n) <= ws.num_counters;
}

}  // namespace

int64_t QuantGemmTcChunkK(QuantCode code) {
  return code == QuantCode::kUint4 ? ChunkK<Code::kUint4>() : ChunkK<Code::kInt8>();
}

absl::Status QuantGemmTcCovers(const QuantGemmArgs& args) {
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("QuantGemmTc: ", why));
  };
  if (args.code != QuantCode::kInt8 && args.code != QuantCode::kUint4) {
    return bad("only int8 and uint4 codes");
  }
  if (args.act_quant != ActQuant::kNone) return bad("weight-only (act_quant kNone)");
  if (args.layout != QuantLayout::kRowMajor) return bad("row-major codes only");
  if (args.code != QuantCode::kUint4 && args.zeros != nullptr) {
    return bad("only uint4 has zero points");
  }
  if (args.m < 1 || args.m > kQuantTcMaxM) {
    return bad(absl::StrCat("m = ", args.m, " (1 to ", kQuantTcMaxM, ")"));
  }
  if (args.a_dtype != DType::kBF16 || args.c_dtype != DType::kBF16) {
    return bad("a and c must be kBF16");
  }
  const int64_t chunk = QuantGemmTcChunkK(args.code);
  if (args.k <= 0 || args.k % chunk != 0) {
    return bad(absl::StrCat("k = ", args.k, " is not a multiple of ", chunk));
  }
  if (args.group_size != args.k && (args.group_size <= 0 || args.group_size % chunk != 0)) {
    return bad(
        absl::StrCat("group_size ", args.group_size, " is neither k nor a multiple of ", chunk));
  }
  if (!Aligned16(args.w)) return bad("w is not 16-byte aligned");
  if (!Aligned16(args.a)) return bad("a is not 16-byte aligned");
  if (args.n < 0 || args.n > (int64_t{1} << 30) || args.k > (int64_t{1} << 30)) {
    return bad("n or k out of range");
  }
  return absl::OkStatus();
}

QuantTcSplitPlan QuantGemmTcPlan(const QuantGemmArgs& args) {
  const QuantTcSplitPlan unsplit{1, std::max<int64_t>(args.k / QuantGemmTcChunkK(args.code), 1)};
  const bool has_workspace =
      args.tc_workspace.partials != nullptr && args.tc_workspace.counters != nullptr;
  if (!QuantGemmTcCovers(args).ok() || args.n == 0 || args.tc_splits == 1 ||
      (args.tc_splits == 0 && !has_workspace)) {
    return unsplit;
  }
  const QuantTcSplitShape shape = SplitShape(args, TokenTiles(args.m), args.overlap_launch);
  const QuantTcSplitPlan plan = PlanQuantTcSplit(shape, std::max(args.tc_splits, 0));
  if (plan.splits == 1 || args.tc_splits > 1) return plan;  // forced: QuantGemmTc checks the room
  return WorkspaceHolds(args, shape, plan) ? plan : unsplit;
}

int64_t QuantGemmTcWorkspaceFloats(const QuantGemmArgs& w, int64_t max_m) {
  if (!WeightCovered(w)) return 0;
  int64_t floats = 0;
  for (int nt : {1, 2, 4, 8}) {
    if (8 * nt - 7 > std::min(max_m, kQuantTcMaxM)) break;
    for (bool pdl : {false, true}) {
      const QuantTcSplitShape shape = SplitShape(w, nt, pdl);
      floats = std::max(floats, QuantTcPartialFloats(shape, PlanQuantTcSplit(shape, 0)));
    }
  }
  return floats;
}

absl::Status QuantGemmTc(const QuantGemmArgs& args, cudaStream_t stream) {
  RETURN_IF_ERROR(QuantGemmTcCovers(args));
  if (args.n == 0) return absl::OkStatus();
  const QuantTcSplitPlan plan = QuantGemmTcPlan(args);
  if (plan.splits > 1 &&
      !WorkspaceHolds(args, SplitShape(args, TokenTiles(args.m), args.overlap_launch), plan)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantGemmTc: ", plan.splits, " splits of n = ", args.n, ", m = ", args.m,
        " need a workspace of ", QuantTcRowTiles(args.n), " counters and ",
        QuantTcPartialFloats(SplitShape(args, TokenTiles(args.m), args.overlap_launch), plan),
        " partial floats"));
  }
  const Params p{static_cast<const __nv_bfloat16*>(args.a),
                 static_cast<const __nv_bfloat16*>(args.bias),
                 static_cast<__nv_bfloat16*>(args.c),
                 args.w,
                 args.scales,
                 args.zeros,
                 args.tc_workspace.partials,
                 args.tc_workspace.counters,
                 static_cast<int>(args.m),
                 static_cast<int>(args.n),
                 static_cast<int>(args.k),
                 static_cast<int>(args.group_size),
                 static_cast<int>(QuantNumGroups(args.k, args.group_size)),
                 static_cast<int>(QuantRowBytes(args.code, args.k)),
                 static_cast<int>(args.k / QuantGemmTcChunkK(args.code)),
                 plan.splits,
                 static_cast<int>(plan.chunks_per_split),
                 args.accumulate};
  if (args.code == QuantCode::kUint4) return LaunchM<Code::kUint4>(p, args.overlap_launch, stream);
  return LaunchM<Code::kInt8>(p, args.overlap_launch, stream);
}

}  // namespace tandem
