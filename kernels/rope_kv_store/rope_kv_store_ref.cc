// CPU reference of the fused attention prologue: QK-norm, rotary embedding, KV-cache store.
//
// Numerics (the CUDA kernel matches them): each head row is loaded to fp32; QK-norm computes
// x * rsqrt(mean(x^2) + eps) * weight in fp32; the rotary angle is float(position) * inv_freq[i]
// rounded to fp32 (as Hugging Face computes it), its cos/sin are evaluated accurately; the result
// is rounded once to `dtype` when written back to qkv. The cache receives exactly the value qkv
// holds afterwards (converted to kv_dtype), so a bf16 cache equals the bf16 K row bit for bit.
// An fp8 cache (kF8E4M3) stores per (token, K|V, kv head) scale = amax / 448 (fp32 division;
// 0 for an all-zero row) and codes e4m3(x / scale) (fp32 division, round to nearest even,
// saturating to 448): the CUDA kernel's __fdiv_rn and __nv_cvt_float_to_fp8(satfinite) give the
// same bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/thread_pool.h"
#include "kernels/common/host_elem.h"
#include "kernels/common/kv_layout.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "kernels/rope_kv_store/rope_kv_store.h"

namespace tandem {
namespace {

float RoundTo(float v, DType t) { return t == DType::kF32 ? v : RoundToBf16(v); }

KvLayout LayerLayout(const RopeKvStoreArgs& a) {
  return KvLayout{.num_layers = 1,
                  .num_pages = a.num_pages,
                  .page_size = a.page_size,
                  .num_kv_heads = a.num_kv_heads,
                  .head_dim = a.head_dim,
                  .dtype = a.kv_dtype};
}

// One fp8 row: codes at kv_layer + code_off, its scale at kv_layer + scale_off (bytes).
void StoreFp8Row(const float* x, int n, void* kv_layer, int64_t code_off, int64_t scale_off) {
  float amax = 0.0f;
  for (int d = 0; d < n; ++d) amax = std::max(amax, std::fabs(x[d]));
  uint8_t* codes = static_cast<uint8_t*>(kv_layer) + code_off;
  const float scale = amax / kFp8E4M3Max;
  for (int d = 0; d < n; ++d) codes[d] = amax == 0.0f ? 0 : F32ToFp8E4M3(x[d] / scale);
  std::memcpy(static_cast<uint8_t*>(kv_layer) + scale_off, &scale, sizeof(scale));
}

// In place on x[head_dim] (fp32): optional RMSNorm with `weight`, then rotary with cos/sin.
void NormAndRotate(const RopeKvStoreArgs& a, const void* weight, const float* cos_v,
                   const float* sin_v, float* x) {
  const int half = a.head_dim / 2;
  if (weight != nullptr) {
    float sum_sq = 0.0f;
    for (int d = 0; d < a.head_dim; ++d) sum_sq += x[d] * x[d];
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(a.head_dim) + a.norm_eps);
    for (int d = 0; d < a.head_dim; ++d) x[d] = x[d] * inv_rms * LoadElem(weight, a.dtype, d);
  }
  for (int i = 0; i < half; ++i) {
    const float lo = x[i];
    const float hi = x[i + half];
    x[i] = lo * cos_v[i] - hi * sin_v[i];
    x[i + half] = hi * cos_v[i] + lo * sin_v[i];
  }
}

void RunToken(const RopeKvStoreArgs& a, int64_t t, float* x, float* cos_v, float* sin_v) {
  const int half = a.head_dim / 2;
  const float pos = static_cast<float>(a.positions[t]);
  for (int i = 0; i < half; ++i) {
    const float angle = pos * a.inv_freq[i];
    cos_v[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    sin_v[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
  const int num_heads = a.num_q_heads + 2 * a.num_kv_heads;
  const int64_t row = t * num_heads * int64_t{a.head_dim};
  const int32_t slot = a.slot_mapping[t];
  CHECK_LT(int64_t{slot}, int64_t{a.num_pages} * a.page_size) << "token " << t;
  const KvLayout layout = LayerLayout(a);
  for (int h = 0; h < num_heads; ++h) {
    const bool is_q = h < a.num_q_heads;
    const bool is_v = h >= a.num_q_heads + a.num_kv_heads;
    const int64_t off = row + int64_t{h} * a.head_dim;
    for (int d = 0; d < a.head_dim; ++d) x[d] = LoadElem(a.qkv, a.dtype, off + d);
    if (!is_v) {
      NormAndRotate(a, is_q ? a.q_norm_weight : a.k_norm_weight, cos_v, sin_v, x);
      for (int d = 0; d < a.head_dim; ++d) {
        x[d] = RoundTo(x[d], a.dtype);
        StoreElem(a.qkv, a.dtype, off + d, x[d]);
      }
    }
    if (is_q || slot < 0) continue;
    const int kv = is_v ? 1 : 0;
    const int kv_head = h - a.num_q_heads - kv * a.num_kv_heads;
    const int64_t dst = layout.SlotOffset(slot, kv, kv_head);
    if (layout.fp8()) {
      StoreFp8Row(x, a.head_dim, a.kv_layer, dst, layout.ScaleOffset(slot, kv, kv_head));
      continue;
    }
    for (int d = 0; d < a.head_dim; ++d) StoreElem(a.kv_layer, a.kv_dtype, dst + d, x[d]);
  }
}

}  // namespace

void RopeKvStoreRef(const RopeKvStoreArgs& args) {
  if (args.num_tokens == 0) return;
  CHECK(args.dtype == DType::kF32 || args.dtype == DType::kBF16) << DTypeName(args.dtype);
  CHECK(args.kv_dtype == DType::kF32 || args.kv_dtype == DType::kBF16 ||
        args.kv_dtype == DType::kF8E4M3)
      << DTypeName(args.kv_dtype);
  CHECK(args.head_dim > 0 && args.head_dim % 2 == 0) << args.head_dim;
  CHECK_GT(args.page_size, 0);
  CHECK((args.q_norm_weight == nullptr) == (args.k_norm_weight == nullptr));
  CHECK(args.qkv != nullptr && args.positions != nullptr && args.slot_mapping != nullptr);
  CHECK(args.kv_layer != nullptr && args.inv_freq != nullptr);
  ParallelFor(args.num_tokens, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> x(args.head_dim), cos_v(args.head_dim / 2), sin_v(args.head_dim / 2);
    for (int64_t t = begin; t < end; ++t) RunToken(args, t, x.data(), cos_v.data(), sin_v.data());
  });
}

}  // namespace tandem
