// CUDA RopeKvStore against RopeKvStoreRef: Llama (no norm) and Qwen3 (QK-norm) shapes, head_dim
// 64 and 128, positions up to 32k, shuffled slots with some tokens not stored (slot -1). Q/K
// must match the reference within one bf16 rounding, V bit-exactly, and the cache must hold
// exactly the rotated K and the V of each stored token and nothing anywhere else.
#include "kernels/rope_kv_store/rope_kv_store.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/common/kv_layout.h"
#include "tests/kernels/cuda_test_util.h"

namespace tandem {
namespace {

using testing::DeviceVector;

constexpr uint16_t kPoison = 0xc444;  // -784 in bf16

void Check(int num_tokens, int nq, int nkv, int d, int page_size, bool qk_norm, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  const int heads = nq + 2 * nkv;
  std::vector<uint16_t> qkv(int64_t{num_tokens} * heads * d);
  for (auto& x : qkv) x = F32ToBf16(uni(rng));
  std::vector<uint16_t> wq(d), wk(d);
  for (int i = 0; i < d; ++i) wq[i] = F32ToBf16(1.0f + 0.5f * uni(rng));
  for (int i = 0; i < d; ++i) wk[i] = F32ToBf16(0.5f + 0.25f * uni(rng));
  std::vector<float> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(1e6f, -2.0f * i / d);
  const int num_pages = (num_tokens + page_size - 1) / page_size + 2;
  std::vector<int32_t> slots(int64_t{num_pages} * page_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(num_tokens);
  std::vector<int32_t> positions(num_tokens);
  for (int t = 0; t < num_tokens; ++t) {
    positions[t] = static_cast<int32_t>(rng() % 32768);
    if (t % 7 == 2) slots[t] = -1;
  }
  KvLayout layout{1, num_pages, page_size, nkv, d, DType::kBF16};
  std::vector<uint16_t> cache(layout.LayerElems(), kPoison);

  RopeKvStoreArgs a;
  a.inv_freq = inv_freq.data();
  a.norm_eps = 1e-6f;
  a.num_tokens = num_tokens;
  a.num_q_heads = nq;
  a.num_kv_heads = nkv;
  a.head_dim = d;
  a.page_size = page_size;
  a.num_pages = num_pages;
  // Reference on host copies.
  std::vector<uint16_t> want_qkv = qkv, want_cache = cache;
  RopeKvStoreArgs r = a;
  r.qkv = want_qkv.data();
  r.positions = positions.data();
  r.slot_mapping = slots.data();
  r.kv_layer = want_cache.data();
  r.q_norm_weight = qk_norm ? wq.data() : nullptr;
  r.k_norm_weight = qk_norm ? wk.data() : nullptr;
  RopeKvStoreRef(r);

  DeviceVector<uint16_t> d_qkv(qkv), d_cache(cache), d_wq(wq), d_wk(wk);
  DeviceVector<int32_t> d_pos(positions), d_slots(slots);
  DeviceVector<float> d_freq(inv_freq);
  a.qkv = d_qkv.get();
  a.positions = d_pos.get();
  a.slot_mapping = d_slots.get();
  a.kv_layer = d_cache.get();
  a.inv_freq = d_freq.get();
  a.q_norm_weight = qk_norm ? d_wq.get() : nullptr;
  a.k_norm_weight = qk_norm ? d_wk.get() : nullptr;
  ASSERT_TRUE(RopeKvStore(a, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got_qkv = d_qkv.Download(), got_cache = d_cache.Download();

  int off_by_one_ulp = 0;
  for (size_t i = 0; i < got_qkv.size(); ++i) {
    const float g = Bf16ToF32(got_qkv[i]), w = Bf16ToF32(want_qkv[i]);
    ASSERT_FALSE(std::isnan(g));
    const bool is_v = static_cast<int>((i / d) % heads) >= nq + nkv;
    if (is_v || got_qkv[i] == want_qkv[i]) continue;
    // fp32 evaluation order differs (warp-tree sums, sincosf): at most one bf16 rounding step.
    ASSERT_LE(std::fabs(g - w), std::ldexp(std::fabs(w), -7) + 1e-6f) << "element " << i;
    ++off_by_one_ulp;
  }
  EXPECT_LT(off_by_one_ulp, static_cast<int>(got_qkv.size() / 20));
  for (size_t i = 0; i < got_qkv.size(); ++i) {
    const bool is_v = static_cast<int>((i / d) % heads) >= nq + nkv;
    if (is_v) {
      ASSERT_EQ(got_qkv[i], want_qkv[i]) << "V changed at " << i;
    }
  }
  // Cache: poison where the reference left poison; elsewhere exactly the GPU's own K/V rows.
  for (int t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0) continue;
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < nkv; ++h) {
        const int64_t src = (int64_t{t} * heads + nq + kv * nkv + h) * d;
        const int64_t dst = layout.SlotOffset(slots[t], kv, h);
        for (int i = 0; i < d; ++i) ASSERT_EQ(got_cache[dst + i], got_qkv[src + i]);
      }
    }
  }
  for (size_t i = 0; i < got_cache.size(); ++i) {
    ASSERT_EQ(got_cache[i] == kPoison, want_cache[i] == kPoison) << "cache element " << i;
  }
}

TEST(RopeKvStoreGpuTest, LlamaShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  Check(1, 32, 8, 128, 16, false, 1);
  Check(1000, 32, 8, 128, 16, false, 2);
  Check(77, 8, 8, 64, 64, false, 3);
}

TEST(RopeKvStoreGpuTest, Qwen3QkNorm) {
  TANDEM_SKIP_WITHOUT_GPU();
  Check(255, 32, 8, 128, 128, true, 4);
  Check(17, 16, 2, 64, 32, true, 5);
  // head_dim 256 (16 lanes per head) and a head count whose pairs do not fill the CTA.
  Check(33, 7, 1, 256, 16, true, 6);
}

// FP8 cache: the GPU's codes and scales equal the host codec applied to the GPU's own rotated
// K and V rows (RopeKvStoreRef's quantization: scale = amax / 448, e4m3 RNE satfinite), bit for
// bit; every other byte of the pool (unstored slots, padding) keeps its poison.
void CheckFp8(int num_tokens, int nq, int nkv, int d, int page_size, bool qk_norm, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
  const int heads = nq + 2 * nkv;
  std::vector<uint16_t> qkv(int64_t{num_tokens} * heads * d);
  for (size_t i = 0; i < qkv.size(); ++i) {
    const int64_t t = static_cast<int64_t>(i) / (int64_t{heads} * d);
    const int h = static_cast<int>(i / d % heads);
    float v = uni(rng);
    if (t % 9 == 4 && h >= nq + nkv) v = 0.0f;  // all-zero V rows: scale 0
    if (t % 9 == 5 && i % d == 3) v = 300.0f;   // outliers: subnormal codes elsewhere
    qkv[i] = F32ToBf16(v);
  }
  std::vector<uint16_t> wq(d), wk(d);
  for (int i = 0; i < d; ++i) wq[i] = F32ToBf16(1.0f + 0.5f * uni(rng));
  for (int i = 0; i < d; ++i) wk[i] = F32ToBf16(0.5f + 0.25f * uni(rng));
  std::vector<float> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(1e6f, -2.0f * i / d);
  const int num_pages = (num_tokens + page_size - 1) / page_size + 2;
  std::vector<int32_t> slots(int64_t{num_pages} * page_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(num_tokens);
  std::vector<int32_t> positions(num_tokens);
  for (int t = 0; t < num_tokens; ++t) {
    positions[t] = static_cast<int32_t>(rng() % 32768);
    if (t % 7 == 2) slots[t] = -1;
  }
  const KvLayout layout{1, num_pages, page_size, nkv, d, DType::kF8E4M3};
  constexpr uint8_t kPoisonByte = 0xa5;
  std::vector<uint8_t> cache(layout.LayerBytes(), kPoisonByte);
  DeviceVector<uint16_t> d_qkv(qkv), d_wq(wq), d_wk(wk);
  DeviceVector<uint8_t> d_cache(cache);
  DeviceVector<int32_t> d_pos(positions), d_slots(slots);
  DeviceVector<float> d_freq(inv_freq);
  RopeKvStoreArgs a;
  a.qkv = d_qkv.get();
  a.positions = d_pos.get();
  a.slot_mapping = d_slots.get();
  a.kv_layer = d_cache.get();
  a.inv_freq = d_freq.get();
  a.q_norm_weight = qk_norm ? d_wq.get() : nullptr;
  a.k_norm_weight = qk_norm ? d_wk.get() : nullptr;
  a.norm_eps = 1e-6f;
  a.num_tokens = num_tokens;
  a.num_q_heads = nq;
  a.num_kv_heads = nkv;
  a.head_dim = d;
  a.page_size = page_size;
  a.num_pages = num_pages;
  a.kv_dtype = DType::kF8E4M3;
  ASSERT_TRUE(RopeKvStore(a, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got_qkv = d_qkv.Download();
  const std::vector<uint8_t> got = d_cache.Download();
  // The bf16 rows the GPU wrote back are exactly what it quantized: the host reference store of
  // those rows (RoPE off: position 0 with inv_freq 0 rotates by nothing; no QK-norm) gives the
  // expected pages.
  std::vector<uint8_t> want(layout.LayerBytes(), kPoisonByte);
  std::vector<uint16_t> rows = got_qkv;
  std::vector<int32_t> zero_pos(num_tokens, 0);
  std::vector<float> no_freq(d / 2, 0.0f);
  RopeKvStoreArgs r = a;
  r.qkv = rows.data();
  r.positions = zero_pos.data();
  r.slot_mapping = slots.data();
  r.kv_layer = want.data();
  r.inv_freq = no_freq.data();
  r.q_norm_weight = r.k_norm_weight = nullptr;
  RopeKvStoreRef(r);
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && mismatches++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(mismatches, 0) << "first differing byte " << first << " of " << got.size();
}

TEST(RopeKvStoreGpuTest, Fp8CacheBitExact) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckFp8(1, 32, 8, 128, 16, false, 11);
  CheckFp8(500, 32, 8, 128, 16, false, 12);
  CheckFp8(77, 8, 8, 64, 7, true, 13);    // page 7: pages padded to 16 bytes
  CheckFp8(40, 16, 1, 256, 1, true, 14);  // page 1, head_dim 256 (16 lanes per head)
  CheckFp8(130, 28, 4, 128, 64, true, 15);
}

TEST(RopeKvStoreGpuTest, EmptyAndRejected) {
  TANDEM_SKIP_WITHOUT_GPU();
  RopeKvStoreArgs a;
  EXPECT_TRUE(RopeKvStore(a, nullptr).ok());
  a.num_tokens = 1;
  a.head_dim = 128;
  a.dtype = DType::kF32;
  EXPECT_EQ(RopeKvStore(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
