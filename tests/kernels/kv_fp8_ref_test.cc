// FP8 KV cache (kernels/common/kv_layout.h), CPU side: the page byte accounting, RopeKvStoreRef's
// fp8 store against an independent quantization of the bf16 store's rows, and PagedAttentionRef
// over fp8 pages against the same attention over an fp32 cache holding the dequantized values.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/kv_layout.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "kernels/rope_kv_store/rope_kv_store.h"

namespace tandem {
namespace {

constexpr uint8_t kPoisonByte = 0xa5;

TEST(KvLayoutFp8, PageBytesHoldCodesScalesAndPadding) {
  struct Shape {
    int page_size, heads, dim;
  };
  for (const Shape s : {Shape{16, 8, 128}, Shape{1, 1, 64}, Shape{7, 3, 64}, Shape{5, 1, 2},
                        Shape{32, 2, 256}, Shape{3, 1, 1}}) {
    KvLayout l{.num_layers = 3,
               .num_pages = 5,
               .page_size = s.page_size,
               .num_kv_heads = s.heads,
               .head_dim = s.dim,
               .dtype = DType::kF8E4M3};
    const int64_t codes = int64_t{2} * s.heads * s.page_size * s.dim;
    const int64_t scales = int64_t{2} * s.heads * s.page_size * 4;
    SCOPED_TRACE(testing::Message() << s.page_size << " " << s.heads << " " << s.dim);
    EXPECT_EQ(l.PageCodeElems(), codes);
    EXPECT_EQ(l.PageBytes() % KvLayout::kFp8PageAlign, 0);
    EXPECT_GE(l.PageBytes(), codes + scales);
    EXPECT_LT(l.PageBytes(), (codes + 3) / 4 * 4 + scales + KvLayout::kFp8PageAlign);
    EXPECT_EQ(l.PageBytes(), l.PageElems());  // one byte per unit
    EXPECT_EQ(l.LayerBytes(), l.PageBytes() * 5);
    EXPECT_EQ(l.PoolBytes(), l.LayerBytes() * 3);
    EXPECT_EQ(l.PageOffset(2, 3), 2 * l.LayerBytes() + 3 * l.PageBytes());
    // Every code byte and every scale of a page is addressed once, inside the page.
    std::vector<int> hits(static_cast<size_t>(l.PageBytes() * 2), 0);
    for (int64_t slot = 0; slot < 2 * s.page_size; ++slot) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < s.heads; ++h) {
          const int64_t c = l.SlotOffset(slot, kv, h);
          const int64_t sc = l.ScaleOffset(slot, kv, h);
          ASSERT_EQ(sc % 4, 0);
          ASSERT_EQ(c / l.PageBytes(), slot / s.page_size);
          ASSERT_EQ((sc + 3) / l.PageBytes(), slot / s.page_size);
          for (int d = 0; d < s.dim; ++d) ++hits[c + d];
          for (int b = 0; b < 4; ++b) ++hits[sc + b];
        }
      }
    }
    int64_t used = 0;
    for (int h : hits) {
      ASSERT_LE(h, 1);
      used += h;
    }
    EXPECT_EQ(used, 2 * (codes + scales));
  }
  // bf16 / fp32 accounting is unchanged: elements only.
  KvLayout b{.num_layers = 2, .num_pages = 3, .page_size = 7, .num_kv_heads = 3, .head_dim = 64};
  EXPECT_EQ(b.PageElems(), 2 * 3 * 7 * 64);
  EXPECT_EQ(b.PageBytes(), 2 * 2 * 3 * 7 * 64);
  b.dtype = DType::kF32;
  EXPECT_EQ(b.PageBytes(), 4 * 2 * 3 * 7 * 64);
  // fp8 pages of a typical shape take (D + 4) / (2 D) of bf16's bytes: ~1.94x the pages.
  KvLayout f{.num_layers = 1,
             .num_pages = 1,
             .page_size = 16,
             .num_kv_heads = 8,
             .head_dim = 128,
             .dtype = DType::kF8E4M3};
  KvLayout g = f;
  g.dtype = DType::kBF16;
  EXPECT_EQ(f.PageBytes(), 16 * 8 * 2 * 132);
  EXPECT_NEAR(static_cast<double>(g.PageBytes()) / f.PageBytes(), 1.94, 0.01);
}

float Bits(const std::vector<uint8_t>& b, int64_t off) {
  float f;
  std::memcpy(&f, b.data() + off, 4);
  return f;
}

struct StoreCase {
  int num_tokens, num_q_heads, num_kv_heads, head_dim, page_size, num_pages;
  bool qk_norm;
  DType dtype;
};

// The fp8 store of a token's row equals quantizing the row the bf16 (or fp32) store writes,
// scale amax / 448, codes e4m3(x / scale); unmapped slots keep their bytes.
void RunStore(const StoreCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-3.0f, 3.0f);
  const int heads = c.num_q_heads + 2 * c.num_kv_heads;
  const int64_t row = int64_t{heads} * c.head_dim;
  const int64_t n = c.num_tokens * row;
  const int64_t esz = DTypeSize(c.dtype);
  std::vector<uint8_t> qkv(n * esz);
  for (int64_t i = 0; i < n; ++i) {
    // Some V rows all zero (scale 0), some rows with an outlier (their small values get
    // subnormal codes).
    const int64_t h = i / c.head_dim % heads;
    const int64_t t = i / row;
    float v = uni(rng);
    if (t % 7 == 2 && h >= c.num_q_heads + c.num_kv_heads) v = 0.0f;
    if (t % 7 == 4 && i % c.head_dim == 0) v = 1000.0f;
    if (c.dtype == DType::kF32) {
      std::memcpy(qkv.data() + i * 4, &v, 4);
    } else {
      const uint16_t b = F32ToBf16(v);
      std::memcpy(qkv.data() + i * 2, &b, 2);
    }
  }
  std::vector<uint8_t> qkv_ref = qkv;
  std::vector<float> inv_freq(c.head_dim / 2);
  for (int i = 0; i < c.head_dim / 2; ++i) inv_freq[i] = std::pow(1e4f, -2.0f * i / c.head_dim);
  std::vector<uint8_t> norm(c.head_dim * esz);
  for (int d = 0; d < c.head_dim; ++d) {
    const float w = 0.5f + 0.01f * d;
    if (c.dtype == DType::kF32) {
      std::memcpy(norm.data() + d * 4, &w, 4);
    } else {
      const uint16_t b = F32ToBf16(w);
      std::memcpy(norm.data() + d * 2, &b, 2);
    }
  }
  std::vector<int32_t> positions(c.num_tokens), slots(c.num_tokens);
  const int64_t num_slots = int64_t{c.num_pages} * c.page_size;
  std::vector<int64_t> perm(num_slots);
  for (int64_t i = 0; i < num_slots; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int t = 0; t < c.num_tokens; ++t) {
    positions[t] = static_cast<int32_t>(rng() % 5000);
    slots[t] = (t % 5 == 3) ? -1 : static_cast<int32_t>(perm[t]);
  }
  // Reference store: an fp32 cache (exactly the rows qkv holds after RoPE).
  KvLayout f32{1, c.num_pages, c.page_size, c.num_kv_heads, c.head_dim, DType::kF32};
  KvLayout f8 = f32;
  f8.dtype = DType::kF8E4M3;
  std::vector<uint8_t> cache32(f32.LayerBytes(), 0), cache8(f8.LayerBytes(), kPoisonByte);
  RopeKvStoreArgs a;
  a.positions = positions.data();
  a.slot_mapping = slots.data();
  a.inv_freq = inv_freq.data();
  a.q_norm_weight = c.qk_norm ? norm.data() : nullptr;
  a.k_norm_weight = c.qk_norm ? norm.data() : nullptr;
  a.num_tokens = c.num_tokens;
  a.num_q_heads = c.num_q_heads;
  a.num_kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.page_size = c.page_size;
  a.num_pages = c.num_pages;
  a.dtype = c.dtype;
  a.qkv = qkv_ref.data();
  a.kv_layer = cache32.data();
  a.kv_dtype = DType::kF32;
  RopeKvStoreRef(a);
  a.qkv = qkv.data();
  a.kv_layer = cache8.data();
  a.kv_dtype = DType::kF8E4M3;
  RopeKvStoreRef(a);
  ASSERT_EQ(qkv, qkv_ref) << "qkv (rotated Q/K) must not depend on the cache dtype";

  std::vector<bool> written(num_slots, false);
  int zero_rows = 0, subnormal_codes = 0;
  for (int t = 0; t < c.num_tokens; ++t) {
    if (slots[t] < 0) continue;
    written[slots[t]] = true;
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const int64_t src = f32.SlotOffset(slots[t], kv, h) * 4;
        float amax = 0.0f;
        std::vector<float> x(c.head_dim);
        for (int d = 0; d < c.head_dim; ++d) {
          x[d] = Bits(cache32, src + 4 * d);
          amax = std::max(amax, std::fabs(x[d]));
        }
        const float scale = amax / 448.0f;
        ASSERT_EQ(Bits(cache8, f8.ScaleOffset(slots[t], kv, h)), scale) << t << " " << kv;
        zero_rows += amax == 0.0f;
        const uint8_t* codes = cache8.data() + f8.SlotOffset(slots[t], kv, h);
        for (int d = 0; d < c.head_dim; ++d) {
          const uint8_t want = amax == 0.0f ? 0 : F32ToFp8E4M3(x[d] / scale);
          ASSERT_EQ(codes[d], want) << t << " " << kv << " " << h << " " << d;
          subnormal_codes += (codes[d] & 0x78) == 0 && (codes[d] & 7) != 0;
          // Dequantized error: half an e4m3 step (relative 2^-4, absolute 2^-10 * scale).
          const float back = Fp8E4M3ToF32(codes[d]) * scale;
          ASSERT_LE(std::fabs(back - x[d]),
                    std::max(std::fabs(x[d]) / 16.0f, scale / 1024.0f) * 1.0001f);
        }
      }
    }
  }
  EXPECT_GT(zero_rows, 0) << "the case should cover all-zero rows";
  EXPECT_GT(subnormal_codes, 0) << "the case should cover subnormal codes";
  for (int64_t s = 0; s < num_slots; ++s) {
    if (written[s]) continue;
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < c.num_kv_heads; ++h) {
        const uint8_t* codes = cache8.data() + f8.SlotOffset(s, kv, h);
        for (int d = 0; d < c.head_dim; ++d) ASSERT_EQ(codes[d], kPoisonByte);
        for (int b = 0; b < 4; ++b) ASSERT_EQ(cache8[f8.ScaleOffset(s, kv, h) + b], kPoisonByte);
      }
    }
  }
}

TEST(RopeKvStoreRefFp8, MatchesQuantizedReferenceStore) {
  RunStore({37, 8, 2, 64, 16, 4, false, DType::kBF16}, 1);
  RunStore({50, 4, 2, 128, 7, 9, true, DType::kBF16}, 2);
  RunStore({23, 6, 6, 32, 5, 7, false, DType::kF32}, 3);
  RunStore({40, 8, 1, 256, 3, 20, true, DType::kBF16}, 4);
}

// Attention over fp8 pages equals attention over an fp32 cache of the dequantized values,
// bit for bit (the reference dequantizes on gather; the rest is the same code).
TEST(PagedAttentionRefFp8, EqualsAttentionOverDequantizedCache) {
  struct Case {
    int q_heads, kv_heads, head_dim, page_size;
  };
  for (const Case c : {Case{8, 2, 64, 16}, Case{4, 4, 128, 7}, Case{8, 1, 32, 5}}) {
    std::mt19937 rng(c.page_size);
    const std::vector<int> seq_lens{1, 40, 17, 64};
    const std::vector<int> q_lens{1, 40, 3, 1};
    int max_pages = 0, total_pages = 0;
    for (int l : seq_lens) {
      max_pages = std::max(max_pages, (l + c.page_size - 1) / c.page_size);
      total_pages += (l + c.page_size - 1) / c.page_size;
    }
    const int num_seqs = static_cast<int>(seq_lens.size());
    KvLayout f8{1, total_pages + 3, c.page_size, c.kv_heads, c.head_dim, DType::kF8E4M3};
    KvLayout f32 = f8;
    f32.dtype = DType::kF32;
    std::vector<uint8_t> cache8(f8.LayerBytes());
    std::vector<float> cache32(f32.LayerElems());
    for (int64_t slot = 0; slot < int64_t{f8.num_pages} * c.page_size; ++slot) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int h = 0; h < c.kv_heads; ++h) {
          const float scale = std::ldexp(1.0f + (rng() % 100) / 100.0f, -8 - int(rng() % 4));
          std::memcpy(cache8.data() + f8.ScaleOffset(slot, kv, h), &scale, 4);
          for (int d = 0; d < c.head_dim; ++d) {
            uint8_t code = static_cast<uint8_t>(rng());
            if ((code & 0x7f) == 0x7f) code = 0x7e;  // no NaN
            cache8[f8.SlotOffset(slot, kv, h) + d] = code;
            cache32[f32.SlotOffset(slot, kv, h) + d] = Fp8E4M3ToF32(code) * scale;
          }
        }
      }
    }
    std::vector<int32_t> pages(f8.num_pages);
    for (int i = 0; i < f8.num_pages; ++i) pages[i] = i;
    std::shuffle(pages.begin(), pages.end(), rng);
    std::vector<int32_t> tables(num_seqs * max_pages, 0), query_start{0};
    int next = 0;
    for (int s = 0; s < num_seqs; ++s) {
      for (int p = 0; p < (seq_lens[s] + c.page_size - 1) / c.page_size; ++p) {
        tables[s * max_pages + p] = pages[next++];
      }
      query_start.push_back(query_start.back() + q_lens[s]);
    }
    const int64_t tokens = query_start.back();
    std::vector<float> q(tokens * c.q_heads * c.head_dim);
    std::normal_distribution<float> normal;
    for (float& x : q) x = normal(rng);
    std::vector<float> out8(q.size()), out32(q.size());
    PagedAttentionArgs a;
    a.q = q.data();
    a.block_tables = tables.data();
    a.seq_lens = seq_lens.data();
    a.query_start = query_start.data();
    a.num_seqs = num_seqs;
    a.num_tokens = tokens;
    a.num_q_heads = c.q_heads;
    a.num_kv_heads = c.kv_heads;
    a.head_dim = c.head_dim;
    a.page_size = c.page_size;
    a.max_pages_per_seq = max_pages;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    a.dtype = DType::kF32;
    a.out = out32.data();
    a.kv_layer = cache32.data();
    a.kv_dtype = DType::kF32;
    PagedAttentionRef(a);
    a.out = out8.data();
    a.kv_layer = cache8.data();
    a.kv_dtype = DType::kF8E4M3;
    PagedAttentionRef(a);
    EXPECT_EQ(out8, out32);
    EXPECT_NE(std::count(out8.begin(), out8.end(), 0.0f), static_cast<long>(out8.size()));
  }
}

}  // namespace
}  // namespace tandem
