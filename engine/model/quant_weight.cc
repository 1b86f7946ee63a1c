#include "engine/model/quant_weight.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/thread_pool.h"
#include "kernels/quant_gemm/fp8_e4m3.h"

namespace tandem {
namespace {

constexpr float kInt8Max = 127.0f;
constexpr float kUint4Max = 15.0f;

// One output channel (or group) of the 8-bit formats; `given_amax` (if not null): the max |w| of
// the whole row this is a part of.
void QuantizeSymmetric(const float* w, int64_t len, QuantCode code, const float* given_amax,
                       uint8_t* out, float* scale) {
  float amax = 0.0f;
  for (int64_t i = 0; i < len; ++i) amax = std::max(amax, std::fabs(w[i]));
  if (given_amax != nullptr) amax = *given_amax;
  const float qmax = code == QuantCode::kFp8E4M3 ? kFp8E4M3Max : kInt8Max;
  const float s = amax > 0.0f ? amax / qmax : 1.0f;
  *scale = s;
  for (int64_t i = 0; i < len; ++i) {
    if (code == QuantCode::kFp8E4M3) {
      out[i] = F32ToFp8E4M3(w[i] / s);
    } else {
      const float q = std::clamp(std::nearbyint(w[i] / s), -kInt8Max, kInt8Max);
      out[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
    }
  }
}

// One group of the uint4 format: codes into the row's packed bytes at element offset k0.
void QuantizeUint4Group(const float* w, int64_t k0, int64_t len, uint8_t* row, float* scale,
                        uint8_t* zero) {
  float lo = 0.0f, hi = 0.0f;  // the range always holds 0, so 0 is exact
  for (int64_t i = 0; i < len; ++i) {
    lo = std::min(lo, w[k0 + i]);
    hi = std::max(hi, w[k0 + i]);
  }
  const float s = hi > lo ? (hi - lo) / kUint4Max : 1.0f;
  const float z = std::clamp(std::nearbyint(-lo / s), 0.0f, kUint4Max);
  *scale = s;
  *zero = static_cast<uint8_t>(z);
  for (int64_t i = 0; i < len; ++i) {
    const int64_t kk = k0 + i;
    const auto q = static_cast<uint8_t>(std::clamp(std::nearbyint(w[kk] / s) + z, 0.0f, kUint4Max));
    row[kk / 2] |= kk % 2 == 0 ? q : static_cast<uint8_t>(q << 4);
  }
}

}  // namespace

QuantGemmArgs QuantizedWeight::Args() const {
  QuantGemmArgs a;
  a.n = n;
  a.k = k;
  a.code = code;
  a.w = codes.data();
  a.scales = scales.data();
  a.zeros = zeros.empty() ? nullptr : zeros.data();
  a.group_size = group_size;
  a.act_quant = act_quant;
  a.act_group_size = act_group_size;
  return a;
}

std::vector<float> QuantizedWeight::Dequantize() const {
  std::vector<float> out(n * k);
  const QuantGemmArgs a = Args();
  ParallelFor(n, 16, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) QuantDequantizeRow(a, j, out.data() + j * k);
  });
  return out;
}

QuantizedWeight QuantizeWeight(const float* w, int64_t n, int64_t k, QuantCode code,
                               int64_t group_size, const float* row_amax) {
  QuantizedWeight q;
  q.code = code;
  q.n = n;
  q.k = k;
  q.group_size = code == QuantCode::kUint4 ? group_size : k;
  const int64_t groups = q.num_groups();
  const int64_t row_bytes = QuantRowBytes(code, k);
  q.codes.assign(n * row_bytes, 0);
  q.scales.resize(n * groups);
  if (code == QuantCode::kUint4) q.zeros.resize(n * groups);
  if (code == QuantCode::kFp8E4M3) q.act_quant = ActQuant::kFp8PerToken;
  ParallelFor(n, 16, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      const float* row = w + j * k;
      if (code != QuantCode::kUint4) {
        QuantizeSymmetric(row, k, code, row_amax == nullptr ? nullptr : row_amax + j,
                          q.codes.data() + j * row_bytes, &q.scales[j]);
        continue;
      }
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t k0 = g * q.group_size;
        QuantizeUint4Group(row, k0, std::min(q.group_size, k - k0), q.codes.data() + j * row_bytes,
                           &q.scales[j * groups + g], &q.zeros[j * groups + g]);
      }
    }
  });
  return q;
}

absl::StatusOr<QuantizedWeight> ConcatRows(std::vector<QuantizedWeight> parts,
                                           const std::string& what) {
  QuantizedWeight out = std::move(parts.at(0));
  for (size_t i = 1; i < parts.size(); ++i) {
    QuantizedWeight& p = parts[i];
    if (p.code != out.code || p.k != out.k || p.group_size != out.group_size ||
        p.act_quant != out.act_quant || p.act_group_size != out.act_group_size ||
        p.zeros.empty() != out.zeros.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": the fused projections are quantized differently (part ", i, ")"));
    }
    out.n += p.n;
    out.codes.insert(out.codes.end(), p.codes.begin(), p.codes.end());
    out.scales.insert(out.scales.end(), p.scales.begin(), p.scales.end());
    out.zeros.insert(out.zeros.end(), p.zeros.begin(), p.zeros.end());
  }
  return out;
}

}  // namespace tandem
