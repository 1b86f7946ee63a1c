// Skinny GEMM kernels that keep the weight stream in flight continuously (gemm_stream.h):
// c[m, n] = a[m, k] . w[n, k]^T, m <= 4, bf16 a and w, fp32 accumulation. A 256-thread block
// owns consecutive rows of w and splits k across its threads; the fp32 partial sums are
// reduced by warp shuffles and then across warps in a fixed order (deterministic), as in the
// register-batch kernel of gemm.cu. What differs is how w arrives:
//   - SkinnyPipelinedKernel (4 rows per block): each thread issues the 4 loads of its next
//     k-step before it uses the current 4, so its loads never drain to zero between steps;
//   - SkinnyBulkKernel: one thread refills a kBulkStages-deep shared-memory ring with bulk
//     copies (8 rows x kBulkCols bf16 per stage, one cp.async.bulk per row, completion counted
//     in bytes on the stage's mbarrier); the bytes in flight per block do not depend on
//     registers (48 KB per block, 4 blocks per SM).
#include <cuda_bf16.h>

#include <atomic>

#include "base/cuda_check.h"
#include "kernels/common/launch_config.cuh"
#include "kernels/common/vec_util.cuh"
#include "kernels/gemm/gemm_stream.h"

namespace tandem::gemm_internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 8;                   // rows of w per block of the bulk kernel
constexpr int kBulkCols = 1024;            // bf16 per row per stage (2 KB)
constexpr int kBulkStages = 3;             // 3 x 16 KB = 48 KB per block
constexpr int kVecPerRow = kBulkCols / 8;  // 16-byte vectors per row per stage
constexpr int kStageBytes = kRows * kBulkCols * 2;

// Adds a[m, 8v .. 8v + 8) . wv[r] to acc[r][m] for the first `m_count` rows of a.
template <int kM, int kR>
__device__ __forceinline__ void Fma(const uint4* a, int64_t v, int64_t kvec, int64_t m_count,
                                    const uint4 (&wv)[kR], float (&acc)[kR][kM]) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    if (m < m_count) {
      float af[8];
      UnpackBf16x8(__ldg(a + m * kvec + v), af);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        float wf[8];
        UnpackBf16x8(wv[r], wf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][m] = fmaf(af[e], wf[e], acc[r][m]);
      }
    }
  }
}

// Sums acc over the block and stores c[m, n0 + row]. The block's warps form groups of
// `warps_per_group` consecutive warps; group g's threads hold rows g * kR .. + kR in acc.
// Fixed summation order: deterministic.
template <int kM, int kR, typename OutT>
__device__ __forceinline__ void ReduceStore(const GemmArgs& args, int64_t n0, int warps_per_group,
                                            const float (&acc)[kR][kM]) {
  __shared__ float partial[kWarps][kR * kM];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int i = 0; i < kR * kM; ++i) {
    float x = acc[i / kM][i % kM];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
    if (lane == 0) partial[warp][i] = x;
  }
  __syncthreads();
  const int t = threadIdx.x;
  if (t >= kR * (kWarps / warps_per_group) * kM) return;
  const int row = t / kM, m = t % kM;
  const int64_t n = n0 + row;
  if (m >= args.m || n >= args.n) return;
  const int group = row / kR, i = (row % kR) * kM + m;
  float sum = 0.0f;
  for (int w = group * warps_per_group; w < (group + 1) * warps_per_group; ++w) {
    sum += partial[w][i];
  }
  if (args.bias != nullptr) sum += static_cast<float>(static_cast<const OutT*>(args.bias)[n]);
  static_cast<OutT*>(args.c)[m * args.n + n] = static_cast<OutT>(sum);
}

constexpr int kPipeRows = 4;  // rows per block of the pipelined kernel (2 x 4 loads in registers)

// Vector v of rows n0 .. n0 + kPipeRows of w (zeros past k or n).
__device__ __forceinline__ void LoadRows(const uint4* w, int64_t n0, int64_t n, int64_t kvec,
                                         int64_t v, uint4 (&out)[kPipeRows]) {
#pragma unroll
  for (int r = 0; r < kPipeRows; ++r) {
    out[r] = (v < kvec && n0 + r < n) ? LoadStreaming16(w + (n0 + r) * kvec + v)
                                      : make_uint4(0, 0, 0, 0);
  }
}

// At most 64 registers (4 blocks of 256 threads per SM).
template <int kM, typename OutT>
__global__ void __launch_bounds__(kThreads, 4)
    SkinnyPipelinedKernel(const __grid_constant__ GemmArgs args) {
  const int64_t kvec = args.k / 8;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kPipeRows;
  const auto* w = static_cast<const uint4*>(args.w);
  const auto* a = static_cast<const uint4*>(args.a);
  float acc[kPipeRows][kM] = {};
  uint4 cur[kPipeRows];
  LoadRows(w, n0, args.n, kvec, threadIdx.x, cur);
  for (int64_t v = threadIdx.x; v < kvec; v += kThreads) {
    uint4 next[kPipeRows];
    LoadRows(w, n0, args.n, kvec, v + kThreads, next);
    Fma<kM, kPipeRows>(a, v, kvec, args.m, cur, acc);
#pragma unroll
    for (int r = 0; r < kPipeRows; ++r) cur[r] = next[r];
  }
  ReduceStore<kM, kPipeRows, OutT>(args, n0, kWarps, acc);
}

__device__ __forceinline__ int64_t Min64(int64_t x, int64_t y) { return x < y ? x : y; }

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Thread 0: bulk-copies chunk c (columns [c * kBulkCols, + kBulkCols) of `rows` rows) into its
// stage and arms the stage's mbarrier with the byte count.
__device__ __forceinline__ void IssueChunk(const GemmArgs& args, int64_t n0, int rows, int64_t c,
                                           uint4* ring, uint64_t* full) {
  const int s = static_cast<int>(c % kBulkStages);
  const int64_t col0 = c * kBulkCols;
  const uint32_t bytes = static_cast<uint32_t>(Min64(kBulkCols, args.k - col0) * 2);
  const uint32_t bar = SmemAddr(full + s);
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar),
               "r"(bytes * rows)
               : "memory");
  const auto* w = static_cast<const __nv_bfloat16*>(args.w);
  for (int r = 0; r < rows; ++r) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];\n" ::"r"(SmemAddr(ring + (s * kRows + r) * kVecPerRow)),
        "l"(w + (n0 + r) * args.k + col0), "r"(bytes), "r"(bar)
        : "memory");
  }
}

__device__ __forceinline__ void WaitParity(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
  }
}

// Thread t reads vector t % kVecPerRow of rows 4 (t / kVecPerRow) .. + 4 of every stage.
template <int kM, typename OutT>
__global__ void __launch_bounds__(kThreads)
    SkinnyBulkKernel(const __grid_constant__ GemmArgs args) {
  constexpr int kR = kRows * kVecPerRow / kThreads;  // rows per thread: 4
  static_assert(kThreads % kVecPerRow == 0 && kR * kThreads == kRows * kVecPerRow);
  extern __shared__ uint4 ring[];  // [kBulkStages][kRows][kVecPerRow]
  __shared__ uint64_t full[kBulkStages];
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int rows = static_cast<int>(Min64(kRows, args.n - n0));
  const int64_t chunks = (args.k + kBulkCols - 1) / kBulkCols;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kBulkStages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(SmemAddr(full + s)));
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    for (int64_t c = 0; c < Min64(kBulkStages, chunks); ++c) {
      IssueChunk(args, n0, rows, c, ring, full);
    }
  }
  __syncthreads();
  const int j = threadIdx.x % kVecPerRow, row0 = (threadIdx.x / kVecPerRow) * kR;
  const int64_t kvec = args.k / 8;
  const auto* a = static_cast<const uint4*>(args.a);
  float acc[kR][kM] = {};
  for (int64_t c = 0; c < chunks; ++c) {
    const int s = static_cast<int>(c % kBulkStages);
    WaitParity(full + s, static_cast<uint32_t>((c / kBulkStages) & 1));
    const int64_t v = c * kVecPerRow + j;
    if (v < kvec) {
      uint4 wv[kR];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        wv[r] = row0 + r < rows ? ring[(s * kRows + row0 + r) * kVecPerRow + j]
                                : make_uint4(0, 0, 0, 0);
      }
      Fma<kM, kR>(a, v, kvec, args.m, wv, acc);
    }
    __syncthreads();  // stage s is consumed: refill it
    if (threadIdx.x == 0 && c + kBulkStages < chunks) {
      IssueChunk(args, n0, rows, c + kBulkStages, ring, full);
    }
  }
  ReduceStore<kM, kR, OutT>(args, n0, kVecPerRow / 32, acc);
}

template <int kM, typename OutT>
absl::Status Launch(const GemmArgs& args, SkinnyStream kind, cudaStream_t stream) {
  if (kind == SkinnyStream::kPipelined4) {
    const int64_t blocks = (args.n + kPipeRows - 1) / kPipeRows;
    SkinnyPipelinedKernel<kM, OutT><<<blocks, kThreads, 0, stream>>>(args);
  } else {
    const int64_t blocks = (args.n + kRows - 1) / kRows;
    constexpr int kSmem = kBulkStages * kStageBytes;
    // Above the 48 KB default once the static shared memory is added: opt in, once per device
    // (the attribute is per device: tensor-parallel ranks of one process run on several).
    static std::atomic<int> raised[kMaxDevices];
    const absl::StatusOr<int> set = CachedPerDevice(raised, []() -> absl::StatusOr<int> {
      CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          SkinnyBulkKernel<kM, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
      return 1;
    });
    if (!set.ok()) return set.status();
    SkinnyBulkKernel<kM, OutT><<<blocks, kThreads, kSmem, stream>>>(args);
  }
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

template <typename OutT>
absl::Status DispatchM(const GemmArgs& args, SkinnyStream kind, cudaStream_t stream) {
  if (args.m <= 1) return Launch<1, OutT>(args, kind, stream);
  if (args.m <= 2) return Launch<2, OutT>(args, kind, stream);
  return Launch<4, OutT>(args, kind, stream);
}

}  // namespace

absl::Status LaunchSkinnyStream(const GemmArgs& args, SkinnyStream kind, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return absl::OkStatus();
  if (args.c_dtype == DType::kBF16) return DispatchM<__nv_bfloat16>(args, kind, stream);
  return DispatchM<float>(args, kind, stream);
}

}  // namespace tandem::gemm_internal
