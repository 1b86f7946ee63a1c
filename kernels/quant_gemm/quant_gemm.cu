// Skinny (decode, m <= kQuantSkinnyMaxM) weight-only quantized GEMM: c[m, n] = a[m, k] ·
// dequant(w)[n, k]ᵀ with the dequantization fused into the weight stream (quant_gemm.h for the
// layout). INT8, UINT4 and FP8 e4m3 codes.
//
// Design (WORKLOG.md step 3): the bf16 skinny kernel's structure (kernels/gemm/gemm.cu), which
// streams weights at the read ceiling. A block of kThreads threads owns kRows consecutive rows
// per thread group (one group, or two of kThreads / 2 threads for short rows: step 9) and each
// group splits its rows' 16-byte code vectors across its threads (vector v of every row goes to
// thread v % group threads), so a warp load is 512 contiguous bytes and every thread keeps
// kRows x kUnroll 16-byte loads in flight (L1-bypassing). Each vector (16 int8 / FP8 codes or 32
// uint4 codes) lies inside one scale group (group_size % 32 == 0). Codes become fp32 without
// the slow integer-to-float unit:
//   int8:  byte ^ 0x80 placed in the mantissa of 2^23 (one byte permute), minus 2^23 + 128;
//   uint4: nibble placed in the mantissa of 2^23, minus 2^23 + zero point (both exact);
//   FP8:   the hardware e4m3x2 -> half2 conversion, then half -> fp32 (exact).
// A vector's dot products with the rows of a (read through L1, fp32) are scaled by its group's
// scale once; fp32 accumulators acc[kRows][kM], reduced by warp shuffles and then across warps
// in shared memory in a fixed order. With QuantGemmArgs::overlap_launch the kernel is launched
// with programmatic dependent launch: the first batch of code loads is issued before
// griddepcontrol.wait (kernels/common/pdl.cuh), a / bias / c are touched only after it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/common/pdl.cuh"
#include "kernels/common/vec_util.cuh"
#include "kernels/quant_gemm/quant_gemm.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSymmetricZero = 8;
constexpr float kTwo23 = 8388608.0f;  // 2^23: an integer u < 2^23 in its mantissa is 2^23 + u

enum class Code { kInt8, kUint4, kFp8 };

struct Params {
  const void* a;
  const void* bias;
  void* c;
  const uint8_t* w;
  const float* scales;
  const uint8_t* zeros;
  int m, n, k, group_size, num_groups, vecs;  // vecs: 16-byte code vectors per row
  bool accumulate;
};

template <Code kCode>
constexpr int WeightsPerVector() {
  return kCode == Code::kUint4 ? 32 : 16;
}

// The 8 codes of chunk c (0-based, 8 weights each) of one 16-byte vector as exact fp32 values
// code - zero (zero_bias = 2^23 + zero for uint4; int8 and FP8 have no zero point).
template <Code kCode>
__device__ __forceinline__ void DecodeChunk(const uint4& v, int c, float zero_bias, float (&q)[8]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  if constexpr (kCode == Code::kUint4) {
    const uint32_t word = words[c];  // 8 nibbles, weight 2i in the low nibble of byte i
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      q[i] = __uint_as_float(((word >> (4 * i)) & 0xfu) | 0x4b000000u) - zero_bias;
    }
  } else if constexpr (kCode == Code::kInt8) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t word = words[2 * c + h] ^ 0x80808080u;  // two's complement -> excess-128
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        q[4 * h + b] =
            __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7540 + b)) - (kTwo23 + 128.0f);
      }
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t word = words[2 * c + h];
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>(word >> (16 * p)), __NV_E4M3);
        const float2 f = __half22float2(__half2(raw));
        q[4 * h + 2 * p] = f.x;
        q[4 * h + 2 * p + 1] = f.y;
      }
    }
  }
}

// 8 elements of a (row pointer + element offset k0, 16-byte aligned) as fp32. After a PDL wait
// a is read with a plain load (its producer may have run concurrently with our prologue).
template <typename TA, bool kPdl>
__device__ __forceinline__ void LoadA8(const TA* row, int64_t k0, float (&f)[8]) {
  const uint4* p = reinterpret_cast<const uint4*>(row + k0);
  if constexpr (sizeof(TA) == 2) {
    UnpackBf16x8(kPdl ? LoadAfterWait16(p) : __ldg(p), f);
  } else {
    const uint4 lo = kPdl ? LoadAfterWait16(p) : __ldg(p);
    const uint4 hi = kPdl ? LoadAfterWait16(p + 1) : __ldg(p + 1);
    f[0] = __uint_as_float(lo.x), f[1] = __uint_as_float(lo.y);
    f[2] = __uint_as_float(lo.z), f[3] = __uint_as_float(lo.w);
    f[4] = __uint_as_float(hi.x), f[5] = __uint_as_float(hi.y);
    f[6] = __uint_as_float(hi.z), f[7] = __uint_as_float(hi.w);
  }
}

__device__ __forceinline__ float ToF32(float v) { return v; }
__device__ __forceinline__ float ToF32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void StoreF32(float* p, float v) { *p = v; }
__device__ __forceinline__ void StoreF32(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// One code vector v of rows n0 .. n0 + kRows - 1 against every row of a.
template <Code kCode, int kM, int kRows, typename TA, bool kPdl>
__device__ __forceinline__ void AccumulateVector(const Params& p, const uint4 (&wv)[kRows],
                                                 int64_t n0, int v, float (&acc)[kRows][kM]) {
  constexpr int kW = WeightsPerVector<kCode>();
  const int k0 = v * kW;
  const int g = k0 / p.group_size;
  float scale[kRows], zero_bias[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t j = min(n0 + r, static_cast<int64_t>(p.n) - 1);  // rows past n: not stored
    scale[r] = __ldg(p.scales + j * p.num_groups + g);
    zero_bias[r] = 0.0f;
    if constexpr (kCode == Code::kUint4) {
      zero_bias[r] =
          kTwo23 + (p.zeros != nullptr ? static_cast<float>(__ldg(p.zeros + j * p.num_groups + g))
                                       : static_cast<float>(kSymmetricZero));
    }
  }
  const TA* a = static_cast<const TA*>(p.a);
  float dot[kRows][kM] = {};
#pragma unroll
  for (int c = 0; c < kW / 8; ++c) {
    float af[kM][8];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      if (m < p.m) LoadA8<TA, kPdl>(a + static_cast<int64_t>(m) * p.k, k0 + 8 * c, af[m]);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float q[8];
      DecodeChunk<kCode>(wv[r], c, zero_bias[r], q);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (m < p.m) {
#pragma unroll
          for (int e = 0; e < 8; ++e) dot[r][m] = fmaf(af[m][e], q[e], dot[r][m]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int m = 0; m < kM; ++m) acc[r][m] = fmaf(dot[r][m], scale[r], acc[r][m]);
  }
}

// kGroups thread groups per block (kThreads / kGroups threads each) own kRows rows each, so a
// block owns kGroups * kRows rows: with rows of at most kThreads / 2 vectors (uint4 k <= 4096)
// two groups keep every thread loading instead of half of them idling.
template <Code kCode, int kM, int kRows, int kUnroll, int kGroups, typename TA, typename TC,
          bool kPdl>
__global__ void __launch_bounds__(kThreads)
    QuantGemmSkinnyKernel(const __grid_constant__ Params p) {
  constexpr int kGroupThreads = kThreads / kGroups;
  static_assert(kGroupThreads % 32 == 0);
  const int group = threadIdx.x / kGroupThreads, gt = threadIdx.x % kGroupThreads;
  const int64_t n0 = (static_cast<int64_t>(blockIdx.x) * kGroups + group) * kRows;
  const int row_vecs = p.vecs;
  const uint4* w = reinterpret_cast<const uint4*>(p.w);
  float acc[kRows][kM] = {};
  for (int v0 = gt; v0 < row_vecs; v0 += kGroupThreads * kUnroll) {
    uint4 wv[kUnroll][kRows];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * kGroupThreads;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        wv[u][r] = (v < row_vecs && n0 + r < p.n) ? LoadStreaming16(w + (n0 + r) * row_vecs + v)
                                                  : make_uint4(0, 0, 0, 0);
      }
    }
    if constexpr (kPdl) {
      if (v0 == gt) PdlWaitThenRelease();
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * kGroupThreads;
      if (v < row_vecs) AccumulateVector<kCode, kM, kRows, TA, kPdl>(p, wv[u], n0, v, acc);
    }
  }
  if constexpr (kPdl) {
    if (gt >= row_vecs) PdlWaitThenRelease();
  }
  __shared__ float partial[kWarps][kRows * kM];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      float x = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
      if (lane == 0) partial[warp][r * kM + m] = x;
    }
  }
  __syncthreads();
  // Thread t sums output (group t / (kRows kM), row r, token m) over its group's warps.
  constexpr int kGroupWarps = kWarps / kGroups;
  const int t = threadIdx.x;
  if (t >= kGroups * kRows * kM) return;
  const int og = t / (kRows * kM), idx = t % (kRows * kM);
  const int r = idx / kM, m = idx % kM;
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * kGroups + og) * kRows + r;
  if (m >= p.m || j >= p.n) return;
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kGroupWarps; ++i) sum += partial[og * kGroupWarps + i][idx];
  TC* c = static_cast<TC*>(p.c) + static_cast<int64_t>(m) * p.n + j;
  if (p.bias != nullptr) sum += ToF32(static_cast<const TC*>(p.bias)[j]);
  if (p.accumulate) sum += ToF32(*c);
  StoreF32(c, sum);
}

template <Code kCode, int kM, int kRows, int kUnroll, int kGroups, typename TA, typename TC>
absl::Status LaunchTile(const Params& p, bool pdl, cudaStream_t stream) {
  constexpr int kBlockRows = kRows * kGroups;
  const dim3 grid(static_cast<unsigned>((p.n + kBlockRows - 1) / kBlockRows));
  if (!pdl) {
    QuantGemmSkinnyKernel<kCode, kM, kRows, kUnroll, kGroups, TA, TC, false>
        <<<grid, kThreads, 0, stream>>>(p);
    CUDA_RETURN_IF_LAUNCH_ERROR();
    return absl::OkStatus();
  }
  CUDA_RETURN_IF_ERROR(
      LaunchMaybePdl(QuantGemmSkinnyKernel<kCode, kM, kRows, kUnroll, kGroups, TA, TC, true>, grid,
                     dim3(kThreads), 0, stream, /*pdl=*/true, p));
  return absl::OkStatus();
}

// Row tiles (WORKLOG.md step 9): a block owns rows whose vectors keep every thread loading
// 4-8 vectors at once:
// - rows of at most kThreads / 2 vectors (uint4 k <= 4096, int8 / FP8 k <= 2048): two groups of
//   four rows (8 rows a block), one vector of each row a thread;
// - at most kThreads vectors (int8 / FP8 k <= 4096, uint4 k <= 8192): four rows, one vector each;
// - at most 2 kThreads (uint4 k <= 16384: down_proj's 14336): four rows of two vectors each;
// - longer rows: two rows of up to four vectors;
// - one row of four when n is too small to fill the GPU with blocks of several rows.
// m <= 4 throughout: acc[kRows][kM] and a's rows stay in registers.
constexpr int64_t kNumSms = 132;

template <Code kCode, int kM, typename TA, typename TC>
absl::Status LaunchRows(const Params& p, bool pdl, cudaStream_t stream) {
  const bool four_rows = p.n / 4 >= 2 * kNumSms;
  if (p.vecs <= kThreads / 2 && p.n / 8 >= 2 * kNumSms) {
    return LaunchTile<kCode, kM, 4, 1, 2, TA, TC>(p, pdl, stream);
  }
  if (p.vecs <= kThreads && four_rows)
    return LaunchTile<kCode, kM, 4, 1, 1, TA, TC>(p, pdl, stream);
  if (p.vecs <= 2 * kThreads && four_rows) {
    return LaunchTile<kCode, kM, 4, 2, 1, TA, TC>(p, pdl, stream);
  }
  if (p.n / 2 >= 2 * kNumSms) return LaunchTile<kCode, kM, 2, 4, 1, TA, TC>(p, pdl, stream);
  return LaunchTile<kCode, kM, 1, 4, 1, TA, TC>(p, pdl, stream);
}

template <Code kCode, typename TA, typename TC>
absl::Status LaunchM(const Params& p, bool pdl, cudaStream_t stream) {
  if (p.m <= 1) return LaunchRows<kCode, 1, TA, TC>(p, pdl, stream);
  if (p.m <= 2) return LaunchRows<kCode, 2, TA, TC>(p, pdl, stream);
  return LaunchRows<kCode, 4, TA, TC>(p, pdl, stream);
}

template <Code kCode>
absl::Status LaunchDtypes(const QuantGemmArgs& args, const Params& p, cudaStream_t stream) {
  const bool pdl = args.overlap_launch;
  if (args.a_dtype == DType::kBF16)
    return LaunchM<kCode, __nv_bfloat16, __nv_bfloat16>(p, pdl, stream);
  return LaunchM<kCode, float, float>(p, pdl, stream);
}

}  // namespace

absl::Status QuantGemmSkinnyCovers(const QuantGemmArgs& args) {
  auto bad = [](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("QuantGemmSkinny: ", why));
  };
  if (args.act_quant != ActQuant::kNone) {
    return bad("activation quantization is not fused (QuantizeActivations first)");
  }
  if (args.code != QuantCode::kUint4 && args.zeros != nullptr) {
    return bad("only uint4 has zero points");
  }
  if (args.layout != QuantLayout::kRowMajor) return bad("row-major codes only");
  if (args.m < 0 || args.m > kQuantSkinnyMaxM) {
    return bad(absl::StrCat("m = ", args.m, " (at most ", kQuantSkinnyMaxM, ")"));
  }
  if (args.a_dtype != args.c_dtype ||
      (args.a_dtype != DType::kBF16 && args.a_dtype != DType::kF32)) {
    return bad("a and c must be both kBF16 or both kF32");
  }
  if (args.k <= 0 || args.k % 32 != 0) return bad(absl::StrCat("k = ", args.k, " % 32 != 0"));
  if (args.group_size != args.k && (args.group_size <= 0 || args.group_size % 32 != 0)) {
    return bad(absl::StrCat("group_size ", args.group_size, " is neither k nor a multiple of 32"));
  }
  if (!Aligned16(args.w)) return bad("w is not 16-byte aligned");
  if (!Aligned16(args.a)) return bad("a is not 16-byte aligned");
  if (args.n > (int64_t{1} << 30) || args.k > (int64_t{1} << 30) ||
      args.n * QuantRowBytes(args.code, args.k) / 16 > (int64_t{1} << 31) - 1) {
    return bad("n or k too large");
  }
  return absl::OkStatus();
}

absl::Status QuantGemmSkinny(const QuantGemmArgs& args, cudaStream_t stream) {
  RETURN_IF_ERROR(QuantGemmSkinnyCovers(args));
  if (args.m == 0 || args.n == 0) return absl::OkStatus();
  const Params p{args.a,
                 args.bias,
                 args.c,
                 args.w,
                 args.scales,
                 args.zeros,
                 static_cast<int>(args.m),
                 static_cast<int>(args.n),
                 static_cast<int>(args.k),
                 static_cast<int>(args.group_size),
                 static_cast<int>(QuantNumGroups(args.k, args.group_size)),
                 static_cast<int>(QuantRowBytes(args.code, args.k) / 16),
                 args.accumulate};
  switch (args.code) {
    case QuantCode::kUint4:
      return LaunchDtypes<Code::kUint4>(args, p, stream);
    case QuantCode::kFp8E4M3:
      return LaunchDtypes<Code::kFp8>(args, p, stream);
    case QuantCode::kInt8:
      break;
  }
  return LaunchDtypes<Code::kInt8>(args, p, stream);
}

}  // namespace tandem
