// CPU reference of the linear layer, and the CPU backend's hot path.
//
// Blocking: the output columns are split into blocks of kNBlock weight rows, one ParallelFor task
// each. Per block, the k dimension is walked in chunks of kKBlock; each chunk of the weight block
// is converted once to an fp32 tile stored transposed, tile[kk][j] = w[n0 + j, k0 + kk], so the
// inner loop (acc[j] += a[m, k] * tile[kk][j], over j) is contiguous, free of reductions, and
// vectorised by the compiler at any -march. Each weight element is converted once whatever m is.
// Accumulation is fp32 in k order; bias (and, with accumulate, the old c) is added in fp32
// before the one rounding to c_dtype. With a_norm_weight, a is normalised row by row in fp32
// first (the RMSNorm the skinny CUDA kernel fuses).
#include <algorithm>
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/common/host_elem.h"
#include "kernels/gemm/gemm.h"

namespace tandem {
namespace {

constexpr int64_t kNBlock = 32;   // 32 fp32 accumulators: 8 SSE registers
constexpr int64_t kKBlock = 256;  // tile of 256 x 32 fp32 = 32 KiB, stays in L1/L2

// Converts w[n0 : n0 + nb, k0 : k0 + kb] into tile[kk * kNBlock + j] (fp32, transposed).
void LoadWeightTile(const GemmArgs& args, int64_t n0, int64_t nb, int64_t k0, int64_t kb,
                    float* tile) {
  for (int64_t j = 0; j < nb; ++j) {
    const int64_t row = (n0 + j) * args.k + k0;
    if (args.w_dtype == DType::kBF16) {
      const uint16_t* w = static_cast<const uint16_t*>(args.w) + row;
      for (int64_t kk = 0; kk < kb; ++kk) tile[kk * kNBlock + j] = Bf16ToF32(w[kk]);
    } else {
      const float* w = static_cast<const float*>(args.w) + row;
      for (int64_t kk = 0; kk < kb; ++kk) tile[kk * kNBlock + j] = w[kk];
    }
  }
  for (int64_t j = nb; j < kNBlock; ++j) {
    for (int64_t kk = 0; kk < kb; ++kk) tile[kk * kNBlock + j] = 0.0f;
  }
}

// acc[0 : kNBlock] += a_row[0 : kb] . tile  (the hot loop).
inline void AccumulateRow(const float* a_row, int64_t kb, const float* tile, float* acc) {
  float local[kNBlock];
  for (int64_t j = 0; j < kNBlock; ++j) local[j] = acc[j];
  for (int64_t kk = 0; kk < kb; ++kk) {
    const float av = a_row[kk];
    const float* t = tile + kk * kNBlock;
    for (int64_t j = 0; j < kNBlock; ++j) local[j] += av * t[j];
  }
  for (int64_t j = 0; j < kNBlock; ++j) acc[j] = local[j];
}

// One block of kNBlock output columns for all m rows; a32 is a as fp32 [m, k].
void GemmColumnBlock(const GemmArgs& args, const float* a32, int64_t n0) {
  const int64_t nb = std::min(kNBlock, args.n - n0);
  std::vector<float> tile(kKBlock * kNBlock);
  std::vector<float> acc(args.m * kNBlock, 0.0f);
  for (int64_t k0 = 0; k0 < args.k; k0 += kKBlock) {
    const int64_t kb = std::min(kKBlock, args.k - k0);
    LoadWeightTile(args, n0, nb, k0, kb, tile.data());
    for (int64_t i = 0; i < args.m; ++i) {
      AccumulateRow(a32 + i * args.k + k0, kb, tile.data(), acc.data() + i * kNBlock);
    }
  }
  for (int64_t i = 0; i < args.m; ++i) {
    for (int64_t j = 0; j < nb; ++j) {
      float v = acc[i * kNBlock + j];
      if (args.bias != nullptr) v += LoadElem(args.bias, args.c_dtype, n0 + j);
      if (args.accumulate) v += LoadElem(args.c, args.c_dtype, i * args.n + n0 + j);
      StoreElem(args.c, args.c_dtype, i * args.n + n0 + j, v);
    }
  }
}

}  // namespace

void GemmRef(const GemmArgs& args) {
  CHECK(IsF32OrBf16(args.a_dtype) && IsF32OrBf16(args.w_dtype) && IsF32OrBf16(args.c_dtype))
      << "GemmRef supports kF32/kBF16 only";
  if (args.m <= 0 || args.n <= 0) return;
  // a as fp32, converted once (m * k is small next to the weights).
  std::vector<float> a_copy;
  const float* a32 = static_cast<const float*>(args.a);
  if (args.a_dtype == DType::kBF16 || args.a_norm_weight != nullptr) {
    a_copy.resize(args.m * args.k);
    ParallelFor(args.m * args.k, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) a_copy[i] = LoadElem(args.a, args.a_dtype, i);
    });
    a32 = a_copy.data();
  }
  if (args.a_norm_weight != nullptr) {
    for (int64_t i = 0; i < args.m; ++i) {
      float* row = a_copy.data() + i * args.k;
      float ss = 0.0f;
      for (int64_t kk = 0; kk < args.k; ++kk) ss += row[kk] * row[kk];
      const float inv_rms = 1.0f / std::sqrt(ss / static_cast<float>(args.k) + args.a_norm_eps);
      for (int64_t kk = 0; kk < args.k; ++kk) {
        row[kk] *= inv_rms * LoadElem(args.a_norm_weight, args.a_dtype, kk);
      }
    }
  }
  const int64_t num_blocks = (args.n + kNBlock - 1) / kNBlock;
  ParallelFor(num_blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) GemmColumnBlock(args, a32, blk * kNBlock);
  });
}

}  // namespace tandem
