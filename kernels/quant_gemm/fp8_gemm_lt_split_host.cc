// The split-k switch and the parts of k (fp8_gemm_lt_split.h); host only.
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kernels/quant_gemm/fp8_gemm_lt_split.h"

namespace tandem {
namespace {

std::atomic<int> g_override{-1};  // -1: TANDEM_FP8_SPLITK decides

int FromEnv() {
  static const int splits = [] {
    const char* v = std::getenv("TANDEM_FP8_SPLITK");
    const int s = v == nullptr ? 0 : std::atoi(v);
    return s >= 2 && s <= kFp8LtMaxSplit ? s : 0;
  }();
  return splits;
}

}  // namespace

int Fp8LtSplitK() {
  const int o = g_override.load();
  return o < 0 ? FromEnv() : o;
}

void SetFp8LtSplitK(int splits) {
  g_override.store(splits >= 2 && splits <= kFp8LtMaxSplit ? splits : 0);
}

std::vector<Fp8LtSplitPart> Fp8LtSplitParts(int64_t m, int64_t n, int64_t k, bool per_channel,
                                            int splits) {
  if (splits < 2 || splits > kFp8LtMaxSplit || !per_channel || m < kFp8LtSplitMinRows ||
      m > kFp8LtSplitMaxRows || m % 4 != 0 || n <= 0 || n > kFp8LtSplitMaxN ||
      k / splits < kFp8LtSplitMinK) {
    return {};
  }
  const int64_t blocks = k / kFp8LtSplitAlign;  // whole 128-column blocks; the rest goes last
  std::vector<Fp8LtSplitPart> parts(splits);
  int64_t k0 = 0;
  for (int s = 0; s < splits; ++s) {
    const int64_t b = blocks / splits + (s < blocks % splits ? 1 : 0);
    parts[s].k0 = k0;
    parts[s].k = b * kFp8LtSplitAlign;
    k0 += parts[s].k;
  }
  parts.back().k += k - k0;
  return parts;
}

}  // namespace tandem
