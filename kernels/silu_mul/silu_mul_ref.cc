// CPU reference of SiLU-and-mul. Numerics follow Hugging Face's `act_fn(gate) * up` on bf16
// tensors: silu is computed in fp32 and rounded to bf16, then the bf16 product is rounded again.
#include <cmath>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/common/host_elem.h"
#include "kernels/silu_mul/silu_mul.h"

namespace tandem {

void SiluMulRef(const SiluMulArgs& args) {
  CHECK(IsF32OrBf16(args.dtype)) << DTypeName(args.dtype);
  const int64_t inter = args.intermediate;
  const DType t = args.dtype;
  ParallelFor(args.num_tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t in_row = r * 2 * inter;
      for (int64_t i = 0; i < inter; ++i) {
        const float g = LoadElem(args.gate_up, t, in_row + i);
        const float u = LoadElem(args.gate_up, t, in_row + inter + i);
        const float silu = RoundTo(t, g / (1.0f + std::exp(-g)));
        StoreElem(args.out, t, r * inter + i, silu * u);
      }
    }
  });
}

}  // namespace tandem
