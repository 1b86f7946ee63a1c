// CPU half of rmsnorm_quant.h: the coverage check and the reference (RmsNormRef, then the FP8
// path's quantizer arithmetic into its scratch layout).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "kernels/common/host_elem.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "kernels/quant_gemm/fp8_gemm_lt.h"
#include "kernels/quant_gemm/fp8_gemm_lt_layout.h"
#include "kernels/rmsnorm/rmsnorm_quant.h"

namespace tandem {
namespace {

bool Aligned(const void* p, uintptr_t to) { return (reinterpret_cast<uintptr_t>(p) % to) == 0; }

// The largest row the fused kernel holds in registers (rmsnorm.cu's fast kernel: 256 threads x
// 4 vectors of 8).
constexpr int64_t kMaxHidden = 8192;

}  // namespace

int64_t RmsNormQuantScratchBytes(ActQuant act_quant, int64_t rows, int64_t hidden) {
  return Fp8LtLayout(act_quant == ActQuant::kFp8PerTokenGroup, rows, hidden, 0).bytes;
}

absl::Status RmsNormQuantCovers(const RmsNormQuantArgs& a) {
  const RmsNormArgs& n = a.norm;
  if (a.act_quant != ActQuant::kFp8PerToken && a.act_quant != ActQuant::kFp8PerTokenGroup) {
    return absl::InvalidArgumentError("RmsNormQuant: act_quant must be an FP8 dynamic mode");
  }
  if (a.act_quant == ActQuant::kFp8PerTokenGroup && a.act_group_size != kFp8LtBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNormQuant: act_group_size ", a.act_group_size, " (only 128)"));
  }
  const int64_t in_stride = n.input_stride > 0 ? n.input_stride : n.hidden;
  const int64_t out_stride = n.out_stride > 0 ? n.out_stride : n.hidden;
  if (n.dtype != DType::kBF16 || n.hidden <= 0 || n.hidden % 8 != 0 || n.hidden > kMaxHidden ||
      n.num_rows < 0 || in_stride != n.hidden || out_stride != n.hidden) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RmsNormQuant: needs contiguous bf16 rows of hidden % 8 == 0 and <= ", kMaxHidden,
        " (got hidden ", n.hidden, ", ", std::string(DTypeName(n.dtype)), ")"));
  }
  if (n.num_rows > (int64_t{1} << 31) - 8) {
    return absl::InvalidArgumentError(absl::StrCat("RmsNormQuant: ", n.num_rows, " rows"));
  }
  if (n.input == nullptr || n.weight == nullptr || !Aligned(n.input, 16) ||
      !Aligned(n.weight, 16) || !Aligned(n.out, 16) || !Aligned(n.residual, 16)) {
    return absl::InvalidArgumentError(
        "RmsNormQuant: input, weight (and out, residual when set) must be 16-byte aligned");
  }
  const int64_t need = RmsNormQuantScratchBytes(a.act_quant, n.num_rows, n.hidden);
  if (a.scratch == nullptr || !Aligned(a.scratch, 256) || a.scratch_bytes < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("RmsNormQuant: needs a 256-byte aligned scratch of ", need, " bytes, got ",
                     a.scratch_bytes));
  }
  return absl::OkStatus();
}

void Fp8LtQuantizeRef(ActQuant act_quant, const uint16_t* bf16, int64_t m, int64_t k,
                      void* scratch) {
  const bool block = act_quant == ActQuant::kFp8PerTokenGroup;
  const Fp8LtScratchLayout l = Fp8LtLayout(block, m, k, 0);
  uint8_t* base = static_cast<uint8_t*>(scratch);
  uint8_t* codes = base + l.codes;
  float* scales = reinterpret_cast<float*>(base + l.scales);
  float* tail_scales = reinterpret_cast<float*>(base + l.tail_scales);
  const int64_t group = block ? kFp8LtBlock : k;
  for (int64_t i = 0; i < l.rows; ++i) {
    for (int64_t g = 0; g * group < k; ++g) {
      const int64_t k0 = g * group, k1 = std::min(k, k0 + group);
      auto value = [&](int64_t kk) { return i < m ? Bf16ToF32(bf16[i * k + kk]) : 0.0f; };
      float amax = 0.0f;
      for (int64_t kk = k0; kk < k1; ++kk) amax = std::max(amax, std::fabs(value(kk)));
      const float scale = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
      for (int64_t kk = k0; kk < k1; ++kk) {
        codes[i * k + kk] = amax > 0.0f ? F32ToFp8E4M3(value(kk) / scale) : 0;
      }
      if (!block) {
        scales[i] = scale;
        if (i >= l.tail_start) tail_scales[i - l.tail_start] = scale;
      } else if (i < l.main_rows) {
        scales[g * l.main_rows + i] = scale;
      } else {
        tail_scales[g * kFp8LtTailRows + (i - l.tail_start)] = scale;
      }
    }
  }
}

void RmsNormQuantRef(const RmsNormQuantArgs& a) {
  const absl::Status covered = RmsNormQuantCovers(a);
  CHECK(covered.ok()) << covered;
  const RmsNormArgs& n = a.norm;
  const int64_t h = n.hidden;
  std::vector<uint16_t> y(std::max<int64_t>(n.num_rows * h, 1));
  RmsNormArgs dense = n;
  dense.out = y.data();
  dense.out_stride = h;
  RmsNormRef(dense);
  if (n.out != nullptr) {
    const int64_t out_stride = n.out_stride > 0 ? n.out_stride : h;
    for (int64_t r = 0; r < n.num_rows; ++r) {
      std::memcpy(static_cast<uint16_t*>(n.out) + r * out_stride, y.data() + r * h, h * 2);
    }
  }
  Fp8LtQuantizeRef(a.act_quant, y.data(), n.num_rows, h, a.scratch);
}

}  // namespace tandem
