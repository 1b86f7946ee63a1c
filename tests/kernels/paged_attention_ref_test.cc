// PagedAttentionRef against a dense softmax(q k^T * scale) v computed in double on a contiguous
// copy of each sequence's K/V (read back through KvLayout::SlotOffset, an independent indexing
// path): decode and chunked-prefill batches, GQA, ragged lengths, page sizes that do not divide
// the lengths, strided q, f32 and bf16.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/kv_layout.h"
#include "kernels/paged_attention/paged_attention.h"

namespace tandem {
namespace {

struct Case {
  std::vector<int> seq_lens;
  std::vector<int> q_lens;
  int num_q_heads;
  int num_kv_heads;
  int head_dim;
  int page_size;
  DType dtype;
  DType kv_dtype;
  int q_pad = 0;  // extra elements per q row (q_stride > num_q_heads * head_dim)
};

// Holds values as float, and as the bytes of `t`.
struct Buffer {
  DType t;
  std::vector<uint8_t> bytes;
  Buffer(DType type, int64_t n) : t(type), bytes(n * DTypeSize(type)) {}
  void Set(int64_t i, float v) {
    if (t == DType::kF32) {
      reinterpret_cast<float*>(bytes.data())[i] = v;
    } else {
      reinterpret_cast<uint16_t*>(bytes.data())[i] = F32ToBf16(v);
    }
  }
  float Get(int64_t i) const {
    if (t == DType::kF32) return reinterpret_cast<const float*>(bytes.data())[i];
    return Bf16ToF32(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
  }
  int64_t size() const { return static_cast<int64_t>(bytes.size()) / DTypeSize(t); }
};

// Runs the reference on a random paged cache and returns the max abs error against the dense
// double-precision computation.
double MaxError(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int num_seqs = static_cast<int>(c.seq_lens.size());
  int max_pages = 1;
  int total_pages = 0;
  for (int len : c.seq_lens) {
    const int pages = (len + c.page_size - 1) / c.page_size;
    max_pages = std::max(max_pages, pages);
    total_pages += pages;
  }
  KvLayout layout{1, total_pages + 3, c.page_size, c.num_kv_heads, c.head_dim, c.kv_dtype};
  Buffer kv(c.kv_dtype, layout.LayerElems());
  for (int64_t i = 0; i < kv.size(); ++i) kv.Set(i, uni(rng));
  // Pages handed out in shuffled order, so the block tables are not the identity.
  std::vector<int32_t> free_pages(layout.num_pages);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  std::vector<int32_t> tables(int64_t{num_seqs} * max_pages, -1);
  int next = 0;
  std::vector<int32_t> query_start(num_seqs + 1, 0);
  for (int s = 0; s < num_seqs; ++s) {
    for (int p = 0; p * c.page_size < c.seq_lens[s]; ++p) {
      tables[s * max_pages + p] = free_pages[next++];
    }
    query_start[s + 1] = query_start[s] + c.q_lens[s];
  }
  const int64_t num_tokens = query_start[num_seqs];
  const int64_t q_stride = int64_t{c.num_q_heads} * c.head_dim + c.q_pad;
  Buffer q(c.dtype, num_tokens * q_stride);
  for (int64_t i = 0; i < q.size(); ++i) q.Set(i, 2.0f * uni(rng));
  Buffer out(c.dtype, num_tokens * c.num_q_heads * c.head_dim);

  PagedAttentionArgs args;
  args.q = q.bytes.data();
  args.out = out.bytes.data();
  args.kv_layer = kv.bytes.data();
  args.block_tables = tables.data();
  args.seq_lens = c.seq_lens.data();
  args.query_start = query_start.data();
  args.num_seqs = num_seqs;
  args.num_tokens = num_tokens;
  args.num_q_heads = c.num_q_heads;
  args.num_kv_heads = c.num_kv_heads;
  args.head_dim = c.head_dim;
  args.page_size = c.page_size;
  args.max_pages_per_seq = max_pages;
  args.q_stride = c.q_pad == 0 ? 0 : q_stride;
  args.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  args.dtype = c.dtype;
  args.kv_dtype = c.kv_dtype;
  PagedAttentionRef(args);

  double max_err = 0.0;
  const int group = c.num_q_heads / c.num_kv_heads;
  for (int s = 0; s < num_seqs; ++s) {
    const int len = c.seq_lens[s];
    for (int h = 0; h < c.num_q_heads; ++h) {
      const int kvh = h / group;
      std::vector<double> k(int64_t{len} * c.head_dim), v(int64_t{len} * c.head_dim);
      for (int pos = 0; pos < len; ++pos) {
        const int64_t slot =
            int64_t{tables[s * max_pages + pos / c.page_size]} * c.page_size + pos % c.page_size;
        for (int d = 0; d < c.head_dim; ++d) {
          k[int64_t{pos} * c.head_dim + d] = kv.Get(layout.SlotOffset(slot, 0, kvh) + d);
          v[int64_t{pos} * c.head_dim + d] = kv.Get(layout.SlotOffset(slot, 1, kvh) + d);
        }
      }
      for (int i = 0; i < c.q_lens[s]; ++i) {
        const int64_t t = query_start[s] + i;
        const int visible = len - c.q_lens[s] + i + 1;
        std::vector<double> p(visible);
        double mx = -1e300;
        for (int j = 0; j < visible; ++j) {
          double dot = 0.0;
          for (int d = 0; d < c.head_dim; ++d) {
            dot += q.Get(t * q_stride + int64_t{h} * c.head_dim + d) * k[j * c.head_dim + d];
          }
          p[j] = dot / std::sqrt(static_cast<double>(c.head_dim));
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (double& x : p) sum += (x = std::exp(x - mx));
        for (int d = 0; d < c.head_dim; ++d) {
          double o = 0.0;
          for (int j = 0; j < visible; ++j) o += p[j] * v[j * c.head_dim + d];
          const float got = out.Get((t * c.num_q_heads + h) * c.head_dim + d);
          EXPECT_FALSE(std::isnan(got));
          max_err = std::max(max_err, std::fabs(got - o / sum));
        }
      }
    }
  }
  return max_err;
}

TEST(PagedAttentionRefTest, DecodeRaggedGqaF32) {
  Case c{{1, 15, 16, 17, 100, 1000}, {1, 1, 1, 1, 1, 1}, 8, 2, 64, 16, DType::kF32, DType::kF32};
  EXPECT_LT(MaxError(c, 1), 2e-5);
}

TEST(PagedAttentionRefTest, ChunkedPrefillPageSizeNotDividing) {
  // q_len < seq_len: the chunk attends to cached pages and causally to itself.
  Case c{{37, 5, 64, 130}, {20, 5, 1, 33}, 4, 4, 32, 7, DType::kF32, DType::kF32};
  EXPECT_LT(MaxError(c, 2), 2e-5);
}

TEST(PagedAttentionRefTest, Bf16QueryOutputAndCacheStridedQ) {
  Case c{{300, 9, 48}, {300, 3, 17}, 6, 2, 128, 32, DType::kBF16, DType::kBF16, /*q_pad=*/256};
  // bf16 output: one rounding of values in [-1, 1] is at most 2^-9.
  EXPECT_LT(MaxError(c, 3), 4e-3);
}

TEST(PagedAttentionRefTest, MixedDtypes) {
  Case c{{50, 61}, {50, 1}, 4, 1, 64, 16, DType::kBF16, DType::kF32};
  EXPECT_LT(MaxError(c, 4), 4e-3);
  Case d{{50, 61}, {10, 2}, 4, 2, 64, 64, DType::kF32, DType::kBF16};
  EXPECT_LT(MaxError(d, 5), 2e-5);
}

TEST(PagedAttentionRefTest, EmptyBatchWritesNothing) {
  std::vector<float> out(8, 123.0f);
  std::vector<int32_t> query_start{0};
  PagedAttentionArgs args;
  args.out = out.data();
  args.query_start = query_start.data();
  args.num_seqs = 0;
  PagedAttentionRef(args);
  for (float x : out) EXPECT_EQ(x, 123.0f);
}

TEST(PagedAttentionRefTest, SingleKeyReturnsItsValue) {
  // With one visible key the softmax weight is 1, so the output is V exactly.
  Case c{{1}, {1}, 2, 1, 64, 16, DType::kF32, DType::kF32};
  EXPECT_LT(MaxError(c, 6), 1e-6);
}

// The host-side choice of the CUDA fp8 decode kernel (paged_attention.h): an explicit request
// wins over TANDEM_FP8_DECODE; kDefault takes the variable's value, the built-in choice when it
// is unset or empty, and an error naming the variable for anything else.
TEST(Fp8DecodeKernelTest, ResolvesRequestEnvironmentAndBuiltin) {
  using K = Fp8DecodeKernel;
  for (const char* env : {static_cast<const char*>(nullptr), "", "fused", "dequant", "bogus"}) {
    SCOPED_TRACE(env == nullptr ? "(unset)" : env);
    EXPECT_EQ(*ResolveFp8DecodeKernel(K::kDequant, env), K::kDequant);
    EXPECT_EQ(*ResolveFp8DecodeKernel(K::kFused, env), K::kFused);
  }
  EXPECT_EQ(*ResolveFp8DecodeKernel(K::kDefault, nullptr), kFp8DecodeBuiltin);
  EXPECT_EQ(*ResolveFp8DecodeKernel(K::kDefault, ""), kFp8DecodeBuiltin);
  EXPECT_EQ(*ResolveFp8DecodeKernel(K::kDefault, "fused"), K::kFused);
  EXPECT_EQ(*ResolveFp8DecodeKernel(K::kDefault, "dequant"), K::kDequant);
  // The built-in choice is the fused kernel (the faster one, WORKLOG.md step 14).
  EXPECT_EQ(kFp8DecodeBuiltin, K::kFused);
  for (const char* bad : {"bogus", "Fused", "fused ", "fused-experimental", "default", "bf16"}) {
    const absl::StatusOr<K> k = ResolveFp8DecodeKernel(K::kDefault, bad);
    ASSERT_FALSE(k.ok()) << bad;
    EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(k.status().message().find("TANDEM_FP8_DECODE"), std::string_view::npos);
    EXPECT_NE(k.status().message().find(bad), std::string_view::npos);
  }
  EXPECT_STREQ(Fp8DecodeKernelName(K::kDequant), "dequant");
  EXPECT_STREQ(Fp8DecodeKernelName(K::kFused), "fused");
  EXPECT_STREQ(Fp8DecodeKernelName(K::kDefault), "default");
  EXPECT_EQ(*ResolveFp8DecodeKernel(K::kDefault, Fp8DecodeKernelName(K::kDequant)), K::kDequant);
}

// The stream kernel's copies (paged_attention.h): an explicit request wins over
// TANDEM_DECODE_COPIES; kDefault takes the variable's value, else the cache's builtin filling (TMA
// for bf16, cp.async for fp8: WORKLOG.md step 21), and an error naming the variable for anything
// else.
TEST(DecodeCopiesTest, ResolvesRequestEnvironmentAndBuiltin) {
  using C = DecodeCopies;
  for (const DType kv : {DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(DTypeName(kv));
    for (const char* env : {static_cast<const char*>(nullptr), "", "tma", "cp.async", "bogus"}) {
      SCOPED_TRACE(env == nullptr ? "(unset)" : env);
      EXPECT_EQ(*ResolveDecodeCopies(C::kCpAsync, env, kv), C::kCpAsync);
      EXPECT_EQ(*ResolveDecodeCopies(C::kTma, env, kv), C::kTma);
    }
    EXPECT_EQ(*ResolveDecodeCopies(C::kDefault, nullptr, kv), BuiltinDecodeCopies(kv));
    EXPECT_EQ(*ResolveDecodeCopies(C::kDefault, "", kv), BuiltinDecodeCopies(kv));
    EXPECT_EQ(*ResolveDecodeCopies(C::kDefault, "tma", kv), C::kTma);
    EXPECT_EQ(*ResolveDecodeCopies(C::kDefault, "cp.async", kv), C::kCpAsync);
    for (const char* bad : {"TMA", "cpasync", "tma ", "default", "bulk"}) {
      const absl::StatusOr<C> c = ResolveDecodeCopies(C::kDefault, bad, kv);
      ASSERT_FALSE(c.ok()) << bad;
      EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(c.status().message().find("TANDEM_DECODE_COPIES"), std::string_view::npos);
      EXPECT_NE(c.status().message().find(bad), std::string_view::npos);
    }
    for (const C c : {C::kCpAsync, C::kTma}) {
      EXPECT_EQ(*ResolveDecodeCopies(C::kDefault, DecodeCopiesName(c), kv), c);
    }
  }
  // The measured choice (H100, session 29): TMA stages on bf16 caches, cp.async on fp8 ones.
  EXPECT_EQ(BuiltinDecodeCopies(DType::kBF16), C::kTma);
  EXPECT_EQ(BuiltinDecodeCopies(DType::kF8E4M3), C::kCpAsync);
  EXPECT_STREQ(DecodeCopiesName(C::kDefault), "default");
}

}  // namespace
}  // namespace tandem
