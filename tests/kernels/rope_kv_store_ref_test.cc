// RopeKvStoreRef against a naive double-precision QK-norm + rotate-half rotary and an explicit
// cache-slot computation through KvLayout: Q/K rotated in place, V untouched, K/V stored in the
// right slot, slot < 0 leaves the cache alone, arbitrary (chunked / decode) positions.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/kv_layout.h"
#include "kernels/rope_kv_store/rope_kv_store.h"

namespace tandem {
namespace {

constexpr float kPoison = -776.0f;  // exactly representable in bf16

struct Case {
  int num_tokens, num_q_heads, num_kv_heads, head_dim, page_size, num_pages;
  bool qk_norm;
  DType dtype, kv_dtype;
};

std::vector<uint8_t> Fill(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * DTypeSize(t));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kF32) {
      reinterpret_cast<float*>(b.data())[i] = v[i];
    } else {
      reinterpret_cast<uint16_t*>(b.data())[i] = F32ToBf16(v[i]);
    }
  }
  return b;
}

float Get(DType t, const std::vector<uint8_t>& b, int64_t i) {
  if (t == DType::kF32) return reinterpret_cast<const float*>(b.data())[i];
  return Bf16ToF32(reinterpret_cast<const uint16_t*>(b.data())[i]);
}

// Expected rotated (and normalised) row in double, from the row as stored in `dtype`.
std::vector<double> Expected(const std::vector<double>& x, const std::vector<double>* w, int pos,
                             const std::vector<float>& inv_freq, double eps) {
  const int n = static_cast<int>(x.size());
  std::vector<double> y = x;
  if (w != nullptr) {
    double ss = 0.0;
    for (double e : x) ss += e * e;
    const double r = 1.0 / std::sqrt(ss / n + eps);
    for (int d = 0; d < n; ++d) y[d] = x[d] * r * (*w)[d];
  }
  std::vector<double> out(n);
  for (int i = 0; i < n / 2; ++i) {
    const double a = static_cast<double>(static_cast<float>(pos) * inv_freq[i]);
    out[i] = y[i] * std::cos(a) - y[i + n / 2] * std::sin(a);
    out[i + n / 2] = y[i + n / 2] * std::cos(a) + y[i] * std::sin(a);
  }
  return out;
}

void RunCase(const Case& c, uint32_t seed, double tol) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  const int heads = c.num_q_heads + 2 * c.num_kv_heads;
  const int64_t row = int64_t{heads} * c.head_dim;
  std::vector<float> qkv_f(c.num_tokens * row);
  for (float& x : qkv_f) x = uni(rng);
  std::vector<uint8_t> qkv = Fill(c.dtype, qkv_f);
  const std::vector<uint8_t> qkv_in = qkv;
  std::vector<float> wq(c.head_dim), wk(c.head_dim);
  for (int d = 0; d < c.head_dim; ++d) wq[d] = 0.5f + 0.5f * uni(rng), wk[d] = 1.0f + uni(rng);
  const std::vector<uint8_t> wq_b = Fill(c.dtype, wq), wk_b = Fill(c.dtype, wk);
  std::vector<float> inv_freq(c.head_dim / 2);
  for (int i = 0; i < c.head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / c.head_dim));
  }
  // Chunked-prefill / decode positions: arbitrary, up to 32k; some tokens not stored.
  std::vector<int32_t> positions(c.num_tokens), slots(c.num_tokens);
  const int64_t num_slots = int64_t{c.num_pages} * c.page_size;
  std::vector<int64_t> perm(num_slots);
  for (int64_t i = 0; i < num_slots; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int t = 0; t < c.num_tokens; ++t) {
    positions[t] = static_cast<int32_t>(rng() % 32768);
    slots[t] = (t % 5 == 3) ? -1 : static_cast<int32_t>(perm[t]);
  }
  KvLayout layout{1, c.num_pages, c.page_size, c.num_kv_heads, c.head_dim, c.kv_dtype};
  std::vector<uint8_t> cache = Fill(c.kv_dtype, std::vector<float>(layout.LayerElems(), kPoison));

  RopeKvStoreArgs a;
  a.qkv = qkv.data();
  a.positions = positions.data();
  a.slot_mapping = slots.data();
  a.kv_layer = cache.data();
  a.inv_freq = inv_freq.data();
  a.q_norm_weight = c.qk_norm ? wq_b.data() : nullptr;
  a.k_norm_weight = c.qk_norm ? wk_b.data() : nullptr;
  a.norm_eps = 1e-6f;
  a.num_tokens = c.num_tokens;
  a.num_q_heads = c.num_q_heads;
  a.num_kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.page_size = c.page_size;
  a.num_pages = c.num_pages;
  a.dtype = c.dtype;
  a.kv_dtype = c.kv_dtype;
  RopeKvStoreRef(a);

  std::vector<double> wqd(c.head_dim), wkd(c.head_dim);
  for (int d = 0; d < c.head_dim; ++d)
    wqd[d] = Get(c.dtype, wq_b, d), wkd[d] = Get(c.dtype, wk_b, d);
  std::vector<bool> slot_written(num_slots, false);
  for (int t = 0; t < c.num_tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const bool is_q = h < c.num_q_heads, is_v = h >= c.num_q_heads + c.num_kv_heads;
      const int64_t off = t * row + int64_t{h} * c.head_dim;
      std::vector<double> x(c.head_dim);
      for (int d = 0; d < c.head_dim; ++d) x[d] = Get(c.dtype, qkv_in, off + d);
      const std::vector<double>* w = !c.qk_norm ? nullptr : (is_q ? &wqd : &wkd);
      const std::vector<double> want = is_v ? x : Expected(x, w, positions[t], inv_freq, 1e-6);
      for (int d = 0; d < c.head_dim; ++d) {
        const float got = Get(c.dtype, qkv, off + d);
        ASSERT_FALSE(std::isnan(got));
        if (is_v) {
          ASSERT_EQ(got, static_cast<float>(want[d])) << "V must be untouched";
        } else {
          ASSERT_NEAR(got, want[d], tol * (1.0 + std::fabs(want[d]))) << t << " " << h << " " << d;
        }
      }
      if (is_q || slots[t] < 0) continue;
      const int kv = is_v ? 1 : 0;
      const int64_t dst = layout.SlotOffset(slots[t], kv, h - c.num_q_heads - kv * c.num_kv_heads);
      for (int d = 0; d < c.head_dim; ++d) {
        // The cache holds exactly what qkv holds (converted to kv_dtype).
        const float in_qkv = Get(c.dtype, qkv, off + d);
        const float want_cache = c.kv_dtype == DType::kF32 ? in_qkv : RoundToBf16(in_qkv);
        ASSERT_EQ(Get(c.kv_dtype, cache, dst + d), want_cache);
      }
      slot_written[slots[t]] = true;
    }
  }
  // Unmapped slots (and tokens with slot < 0) leave the cache untouched.
  for (int64_t s = 0; s < num_slots; ++s) {
    if (slot_written[s]) continue;
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        ASSERT_EQ(Get(c.kv_dtype, cache, layout.SlotOffset(s, kv, h)), kPoison);
      }
    }
  }
}

TEST(RopeKvStoreRefTest, LlamaF32) {
  RunCase({37, 8, 2, 64, 16, 4, false, DType::kF32, DType::kF32}, 1, 1e-5);
}

TEST(RopeKvStoreRefTest, Qwen3QkNormBf16) {
  // bf16 qkv: one rounding of the fp32 result, relative 2^-8.
  RunCase({50, 4, 2, 128, 7, 9, true, DType::kBF16, DType::kBF16}, 2, 8e-3);
}

TEST(RopeKvStoreRefTest, MixedDtypes) {
  RunCase({19, 2, 1, 32, 32, 1, true, DType::kF32, DType::kBF16}, 3, 1e-5);
  RunCase({19, 6, 3, 64, 5, 4, false, DType::kBF16, DType::kF32}, 4, 8e-3);
}

TEST(RopeKvStoreRefTest, PositionZeroIsIdentityWithoutNorm) {
  std::vector<float> qkv{1.5f, -2.0f, 3.0f, 0.25f, 7.0f, 8.0f, 9.0f, 10.0f, 4.0f, 3.0f, 2.0f, 1.0f};
  const std::vector<float> before = qkv;
  std::vector<int32_t> pos{0}, slot{-1};
  std::vector<float> inv_freq{1.0f, 0.01f};
  std::vector<float> cache(2 * 4, kPoison);
  RopeKvStoreArgs a;
  a.qkv = qkv.data();
  a.positions = pos.data();
  a.slot_mapping = slot.data();
  a.kv_layer = cache.data();
  a.inv_freq = inv_freq.data();
  a.num_tokens = 1;
  a.num_q_heads = 1;
  a.num_kv_heads = 1;
  a.head_dim = 4;
  a.page_size = 1;
  a.num_pages = 1;
  a.dtype = DType::kF32;
  a.kv_dtype = DType::kF32;
  RopeKvStoreRef(a);
  EXPECT_EQ(qkv, before);
  for (float x : cache) EXPECT_EQ(x, kPoison);
}

}  // namespace
}  // namespace tandem
