// CPU reference of RMSNorm with the optional fused residual add.
//
// Numerics follow Hugging Face LlamaRMSNorm / Qwen3RMSNorm for a bf16 model:
//   residual = bf16(residual + input)                  (the add is a bf16 tensor op)
//   normed   = bf16(x * rsqrt(mean_fp32(x^2) + eps))    (`hidden.to(input_dtype)`)
//   out      = bf16(weight * normed)                    (bf16 multiply)
// For kF32 every rounding is the identity.
#include <cmath>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/common/host_elem.h"
#include "kernels/rmsnorm/rmsnorm.h"

namespace tandem {

void RmsNormRef(const RmsNormArgs& args) {
  CHECK(IsF32OrBf16(args.dtype)) << DTypeName(args.dtype);
  const int64_t h = args.hidden;
  const int64_t in_stride = args.input_stride > 0 ? args.input_stride : h;
  const int64_t out_stride = args.out_stride > 0 ? args.out_stride : h;
  const DType t = args.dtype;
  ParallelFor(args.num_rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> x(h);
    for (int64_t r = begin; r < end; ++r) {
      double sum_sq = 0.0;
      for (int64_t i = 0; i < h; ++i) {
        float v = LoadElem(args.input, t, r * in_stride + i);
        if (args.residual != nullptr) {
          v = RoundTo(t, LoadElem(args.residual, t, r * h + i) + v);
          StoreElem(args.residual, t, r * h + i, v);
        }
        x[i] = v;
        sum_sq += static_cast<double>(v) * v;
      }
      const float inv_rms =
          1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(h)) + args.eps);
      for (int64_t i = 0; i < h; ++i) {
        const float normed = RoundTo(t, x[i] * inv_rms);
        StoreElem(args.out, t, r * out_stride + i, LoadElem(args.weight, t, i) * normed);
      }
    }
  });
}

}  // namespace tandem
