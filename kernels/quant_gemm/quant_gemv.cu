// QuantGemv: the mixed-input tensor-core GEMV for decode steps of 1..kQuantGemvMaxM tokens
// (quant_gemm.h for the contract; WORKLOG.md step 10 for why). QuantGemmTc's arithmetic
// (quant_tc_fragments.cuh: the weight as mma.sync's A operand, codes dequantized in registers at
// ~4 instructions a code byte where the CUDA-core skinny kernel takes ~16) with a structure for
// one 8-token n-tile:
//
// - A block of kWarps warps works on one 16-row tile at a time; chunk c of the tile goes to warp
//   c % kWarps. Blocks are persistent: a block owns tiles blockIdx.x, + gridDim.x, ..., and the
//   grid is at most the blocks that fit the device at once, so no block waits for a second wave
//   and its start-up (the first loads' latency) is paid once, not once per tile.
// - Each warp streams its (tile, chunk) items through a ring of kDepth register slots: the
//   lane's two 16-byte code vectors (rows g and g + 8) and their rows' scales and zero points of
//   the chunk's group. Item i is computed while items i + 1 .. i + kDepth - 1 are in flight, and
//   its slot is refilled with item i + kDepth before anything else: the loads cross tile
//   boundaries, so the next tile's codes arrive during this tile's reduction.
// - a (m x k bf16, small) is read through L1 when an item is computed, by the lanes whose token
//   g < m only.
// - Per item the fp32 mma sum of the chunk is scaled by its group's scale and added to the
//   lane's running fp32 sums (a chunk never straddles a group). At a tile's end the warps' sums
//   go through shared memory (double-buffered by tile parity: one barrier a tile) and are added in
//   warp order (deterministic), bias / the old c added, rounded to bf16 once.
// - PDL: the first kDepth items' code loads are issued before griddepcontrol.wait; a, bias and c
//   are touched only after it.
//
// Status: correct (quant_gemm_tc_test's Gemv* tests) but slower than the skinny kernel at m = 1
// and QuantGemmTc at m >= 2 on an H100: its time follows resident warps, which the ring's
// registers cost, not bytes in flight (WORKLOG.md step 10, with ncu and what to try next).
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

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = 16;
constexpr int kTileValues = kTileRows * 8;  // one 16 x 8 mma accumulator tile
constexpr int kDefaultDepth = 8;

struct Params {
  const __nv_bfloat16* a;     // [m, k]
  const __nv_bfloat16* bias;  // [n] or null
  __nv_bfloat16* c;           // [m, n]
  const uint8_t* w;           // [n, row_bytes]
  const float* scales;        // [n, num_groups]
  const uint8_t* zeros;       // [n, num_groups] or null (uint4 only)
  int m, n, k, group_size, num_groups, row_bytes, num_chunks;
  int num_tiles;        // ceil(n / 16)
  int chunks_per_warp;  // items of a warp per tile: ceil(num_chunks / kWarps)
  bool accumulate;
};

// One ring slot: the lane's code vectors of rows g and g + 8 (zero past n or past the last item),
// and those rows' scales and raw zero points of the chunk's group.
struct Slot {
  uint4 w[2];
  float scale[2];
  uint32_t zero[2];
};

// An item's place: the block's tile (0, 1, ...: tile blockIdx.x + gridDim.x * local) and the
// warp's chunk index j (chunk j * kWarps + warp).
struct Pos {
  int local = 0, j = 0;
  __device__ __forceinline__ void Advance(int chunks_per_warp) {
    if (++j == chunks_per_warp) j = 0, ++local;
  }
};

template <Code kCode, bool kTc16>
__device__ __forceinline__ void LoadSlot(const Params& p, Pos pos, int tiles_here, Slot& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int chunk = pos.j * kWarps + warp;
  const bool valid = pos.local < tiles_here && chunk < p.num_chunks;
  const int tile = blockIdx.x + gridDim.x * pos.local;
  const int group = chunk * ChunkK<kCode>() / p.group_size;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t row = static_cast<int64_t>(tile) * kTileRows + g + 8 * h;
    const int64_t clamped = min(row, static_cast<int64_t>(p.n) - 1);  // rows past n: not stored
    if constexpr (kTc16) {  // 512 contiguous bytes a warp load; rows past n are zeros there
      s.w[h] = valid
                   ? LoadStreaming16(
                         p.w + ((static_cast<int64_t>(tile) * p.num_chunks + chunk) * 2 + h) * 512 +
                         16 * lane)
                   : make_uint4(0, 0, 0, 0);
    } else {
      s.w[h] = valid && row < p.n
                   ? LoadStreaming16(p.w + row * p.row_bytes +
                                     static_cast<int64_t>(chunk) * kChunkBytes + 16 * t)
                   : make_uint4(0, 0, 0, 0);
    }
    s.scale[h] = valid ? __ldg(p.scales + clamped * p.num_groups + group) : 0.0f;
    s.zero[h] = kSymmetricZero;
    if constexpr (kCode == Code::kUint4) {
      if (valid && p.zeros != nullptr) s.zero[h] = __ldg(p.zeros + clamped * p.num_groups + group);
    }
  }
}

// The item's chunk against a's rows, scaled by its group's scales into sum (the lane's 16 x 8
// accumulator fragment: rows g, g + 8 x tokens 2t, 2t + 1).
template <Code kCode, bool kPdl>
__device__ __forceinline__ void ComputeSlot(const Params& p, Pos pos, const Slot& s,
                                            float (&sum)[4]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
  const int chunk = pos.j * kWarps + warp;
  if (chunk >= p.num_chunks) return;
  const int64_t k0 = static_cast<int64_t>(chunk) * ChunkK<kCode>() + LaneK<kCode>() * t;
  uint4 av[LaneAVectors<kCode>()];
#pragma unroll
  for (int v = 0; v < LaneAVectors<kCode>(); ++v) {
    av[v] = g < p.m ? LoadA16<kPdl>(p.a + static_cast<int64_t>(g) * p.k + k0 + 8 * v)
                    : make_uint4(0, 0, 0, 0);
  }
  uint32_t zero2[2] = {};
  if constexpr (kCode == Code::kUint4)
    zero2[0] = Uint4Zero2(s.zero[0]), zero2[1] = Uint4Zero2(s.zero[1]);
  float acc[4] = {};
#pragma unroll
  for (int v = 0; v < LaneAVectors<kCode>(); ++v) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      uint32_t b0, b1, frag[4];
      BFragment<kCode>(av[v], q, b0, b1);
      AFragment<kCode>(s.w, 2 * v + q, zero2, frag);
      Mma(acc, frag, b0, b1);
    }
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) sum[e] = fmaf(acc[e], s.scale[e / 2], sum[e]);
}

// The end of a tile: the warps' sums added in warp order, bias / the old c, one bf16 rounding.
__device__ __forceinline__ void FinishTile(const Params& p, int tile, float (&sum)[4],
                                           float (&red)[kWarps][4][32]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int e = 0; e < 4; ++e) red[warp][e][lane] = sum[e], sum[e] = 0.0f;
  __syncthreads();
  for (int idx = threadIdx.x; idx < kTileValues; idx += kThreads) {
    const int e = idx / 32, ln = idx % 32;
    const int64_t row = static_cast<int64_t>(tile) * kTileRows + ln / 4 + 8 * (e / 2);
    const int tok = 2 * (ln % 4) + e % 2;
    if (row >= p.n || tok >= p.m) continue;
    float v = red[0][e][ln];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v += red[w][e][ln];
    __nv_bfloat16* c = p.c + static_cast<int64_t>(tok) * p.n + row;
    if (p.bias != nullptr) v += __bfloat162float(p.bias[row]);
    if (p.accumulate) v += __bfloat162float(*c);
    *c = __float2bfloat16_rn(v);
  }
}

template <Code kCode, int kDepth, bool kTc16, bool kPdl>
__global__ void __launch_bounds__(kThreads) QuantGemvKernel(const __grid_constant__ Params p) {
  __shared__ float red[2][kWarps][4][32];  // by tile parity: one barrier a tile
  const int tiles_here = (p.num_tiles - static_cast<int>(blockIdx.x) + gridDim.x - 1) / gridDim.x;
  const int total = tiles_here * p.chunks_per_warp;
  Slot ring[kDepth];
  Pos load;
#pragma unroll
  for (int s = 0; s < kDepth; ++s) {
    LoadSlot<kCode, kTc16>(p, load, tiles_here, ring[s]);
    load.Advance(p.chunks_per_warp);
  }
  if constexpr (kPdl) PdlWaitThenRelease();
  float sum[4] = {};
  Pos pos;
  for (int i0 = 0; i0 < total; i0 += kDepth) {
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      if (i0 + s >= total) break;  // uniform across the block
      ComputeSlot<kCode, kPdl>(p, pos, ring[s], sum);
      LoadSlot<kCode, kTc16>(p, load, tiles_here, ring[s]);
      load.Advance(p.chunks_per_warp);
      if (pos.j == p.chunks_per_warp - 1) {  // the tile's last item: uniform across the block
        FinishTile(p, blockIdx.x + gridDim.x * pos.local, sum, red[pos.local % 2]);
      }
      pos.Advance(p.chunks_per_warp);
    }
  }
}

// Blocks of one instantiation resident per SM, asked once per process; 1 if the runtime cannot
// say.
template <Code kCode, int kDepth, bool kTc16, bool kPdl>
int BlocksPerSm() {
  static const int blocks = [] {
    return quant_tc::QueryBlocksPerSm(QuantGemvKernel<kCode, kDepth, kTc16, kPdl>, kThreads);
  }();
  return blocks;
}

template <Code kCode, int kDepth, bool kTc16, bool kPdl>
absl::Status Launch(const Params& p, cudaStream_t stream) {
  // At most one wave of persistent blocks, then as few as give every block the same number of
  // tiles (to one): a block's time is its tiles, so more blocks than that only idle.
  const int resident = DeviceSms() * BlocksPerSm<kCode, kDepth, kTc16, kPdl>();
  const int per_block = (p.num_tiles + resident - 1) / resident;
  const dim3 grid(static_cast<unsigned>((p.num_tiles + per_block - 1) / per_block));
  CUDA_RETURN_IF_ERROR(LaunchMaybePdl(QuantGemvKernel<kCode, kDepth, kTc16, kPdl>, grid,
                                      dim3(kThreads), 0, stream, kPdl, p));
  return absl::OkStatus();
}

template <Code kCode, int kDepth, bool kTc16>
absl::Status LaunchPdl(const Params& p, bool pdl, cudaStream_t stream) {
  return pdl ? Launch<kCode, kDepth, kTc16, true>(p, stream)
             : Launch<kCode, kDepth, kTc16, false>(p, stream);
}

template <Code kCode, int kDepth>
absl::Status LaunchLayout(const Params& p, bool tc16, bool pdl, cudaStream_t stream) {
  return tc16 ? LaunchPdl<kCode, kDepth, true>(p, pdl, stream)
              : LaunchPdl<kCode, kDepth, false>(p, pdl, stream);
}

template <Code kCode>
absl::Status LaunchDepth(const Params& p, int depth, bool tc16, bool pdl, cudaStream_t stream) {
  switch (depth) {
    case 2:
      return LaunchLayout<kCode, 2>(p, tc16, pdl, stream);
    case 4:
      return LaunchLayout<kCode, 4>(p, tc16, pdl, stream);
    default:
      return LaunchLayout<kCode, kDefaultDepth>(p, tc16, pdl, stream);
  }
}

// One thread per 16-byte piece of the kTc16 buffer: piece i of tile-chunk block b (i = 32 h +
// lane) is bytes [16 t, 16 t + 16) of chunk b % chunks of row 16 (b / chunks) + 8 h + g.
__global__ void RepackTc16Kernel(const uint8_t* __restrict__ w, uint8_t* __restrict__ out,
                                 int64_t n, int64_t row_bytes, int64_t pieces) {
  const int64_t chunks = row_bytes / kChunkBytes;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < pieces;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t block = i / 64, within = i % 64;
    const int h = static_cast<int>(within / 32), lane = static_cast<int>(within % 32);
    const int64_t row = block / chunks * kTileRows + 8 * h + lane / 4;
    const int64_t chunk = block % chunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < n) v = LoadStreaming16(w + row * row_bytes + chunk * kChunkBytes + 16 * (lane % 4));
    reinterpret_cast<uint4*>(out)[i] = v;
  }
}

}  // namespace

absl::Status QuantGemvCovers(const QuantGemmArgs& args) {
  if (args.m < 1 || args.m > kQuantGemvMaxM) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantGemv: m = ", args.m, " (1 to ", kQuantGemvMaxM, ")"));
  }
  if (args.gemv_depth != 0 && args.gemv_depth != 2 && args.gemv_depth != 4 &&
      args.gemv_depth != kDefaultDepth) {
    return absl::InvalidArgumentError(absl::StrCat("QuantGemv: gemv_depth ", args.gemv_depth,
                                                   " (0, 2, 4 or ", kDefaultDepth, ")"));
  }
  if (args.layout != QuantLayout::kRowMajor && args.layout != QuantLayout::kTc16) {
    return absl::InvalidArgumentError("QuantGemv: unknown layout");
  }
  QuantGemmArgs row_major = args;
  row_major.layout = QuantLayout::kRowMajor;
  if (absl::Status tc = QuantGemmTcCovers(row_major); !tc.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("QuantGemv (the QuantGemmTc contract): ", tc.message()));
  }
  return absl::OkStatus();
}

absl::Status QuantGemv(const QuantGemmArgs& args, cudaStream_t stream) {
  RETURN_IF_ERROR(QuantGemvCovers(args));
  if (args.n == 0) return absl::OkStatus();
  const int num_chunks = static_cast<int>(args.k / QuantGemmTcChunkK(args.code));
  const Params p{static_cast<const __nv_bfloat16*>(args.a),
                 static_cast<const __nv_bfloat16*>(args.bias),
                 static_cast<__nv_bfloat16*>(args.c),
                 args.w,
                 args.scales,
                 args.zeros,
                 static_cast<int>(args.m),
                 static_cast<int>(args.n),
                 static_cast<int>(args.k),
                 static_cast<int>(args.group_size),
                 static_cast<int>(QuantNumGroups(args.k, args.group_size)),
                 static_cast<int>(QuantRowBytes(args.code, args.k)),
                 num_chunks,
                 static_cast<int>((args.n + kTileRows - 1) / kTileRows),
                 (num_chunks + kWarps - 1) / kWarps,
                 args.accumulate};
  const bool tc16 = args.layout == QuantLayout::kTc16;
  if (args.code == QuantCode::kUint4) {
    return LaunchDepth<Code::kUint4>(p, args.gemv_depth, tc16, args.overlap_launch, stream);
  }
  return LaunchDepth<Code::kInt8>(p, args.gemv_depth, tc16, args.overlap_launch, stream);
}

absl::Status QuantRepackTc16(const QuantGemmArgs& w, uint8_t* out, cudaStream_t stream) {
  const int64_t chunk =
      (w.code == QuantCode::kInt8 || w.code == QuantCode::kUint4) ? QuantGemmTcChunkK(w.code) : 0;
  if (chunk == 0 || w.k <= 0 || w.k % chunk != 0 || w.n < 0 || w.layout != QuantLayout::kRowMajor ||
      !Aligned16(w.w) || !Aligned16(out)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QuantRepackTc16: needs row-major, 16-byte-aligned int8 / uint4 codes with k a "
        "multiple of the chunk; k = ",
        w.k));
  }
  const int64_t pieces = QuantTc16Bytes(w.code, w.n, w.k) / 16;
  if (pieces == 0) return absl::OkStatus();
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((pieces + threads - 1) / threads, 132 * 16);
  RepackTc16Kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      w.w, out, w.n, QuantRowBytes(w.code, w.k), pieces);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
