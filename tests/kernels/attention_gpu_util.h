// Shared by the GPU tests of paged attention (decode and prefill paths): random paged batches,
// their launch arguments, the fp32 reference and the error check.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/paged_attention/paged_attention.h"
#include "tests/kernels/cuda_test_util.h"

namespace tandem::testing {

constexpr uint16_t kNanBf16 = 0x7fc0;

// A paged batch in bf16 bits: sequence s has seq_lens[s] keys in the cache and query tokens
// [query_start[s], query_start[s + 1]) (the last positions of the sequence).
struct AttentionBatch {
  std::vector<int32_t> seq_lens, query_start, tables;
  std::vector<uint16_t> q, kv;
  int num_q_heads, num_kv_heads, head_dim, page_size, max_pages;
  int64_t num_tokens() const { return query_start.back(); }
};

// Random queries and cache on shuffled pages (a few spare pages nobody references). The cache
// rows of each sequence's last page past its length hold NaN: an unwritten cache slot must not
// leak into the output (e.g. through 0 * NaN).
inline AttentionBatch MakeBatch(const std::vector<int>& lens, const std::vector<int>& q_lens,
                                int nq, int nkv, int d, int page_size, std::mt19937& rng) {
  AttentionBatch b{{}, {0}, {}, {}, {}, nq, nkv, d, page_size, 1};
  int total_pages = 0;
  for (int len : lens) {
    b.max_pages = std::max(b.max_pages, (len + page_size - 1) / page_size);
    total_pages += (len + page_size - 1) / page_size;
  }
  const int num_pages = total_pages + 3;
  std::vector<int32_t> ids(num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  b.kv.resize(int64_t{num_pages} * 2 * nkv * page_size * d);
  for (auto& x : b.kv) x = F32ToBf16(uni(rng));
  b.tables.assign(lens.size() * b.max_pages, 0);
  int next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    b.seq_lens.push_back(lens[s]);
    b.query_start.push_back(b.query_start.back() + q_lens[s]);
    for (int p = 0; p * page_size < lens[s]; ++p) b.tables[s * b.max_pages + p] = ids[next++];
    const int64_t last = b.tables[s * b.max_pages + (lens[s] - 1) / page_size];
    for (int slot = lens[s] % page_size; slot != 0 && slot < page_size; ++slot) {
      for (int kv_head = 0; kv_head < 2 * nkv; ++kv_head) {  // K and V of every head
        auto* row = &b.kv[((last * 2 * nkv + kv_head) * page_size + slot) * d];
        std::fill(row, row + d, kNanBf16);
      }
    }
  }
  b.q.resize(b.num_tokens() * nq * d);
  for (auto& x : b.q) x = F32ToBf16(2.0f * uni(rng));
  return b;
}

// The shape fields of the batch's PagedAttentionArgs (the pointers are the caller's).
inline PagedAttentionArgs ArgsFor(const AttentionBatch& b) {
  PagedAttentionArgs a;
  a.num_seqs = static_cast<int>(b.seq_lens.size());
  a.num_tokens = b.num_tokens();
  a.num_q_heads = b.num_q_heads;
  a.num_kv_heads = b.num_kv_heads;
  a.head_dim = b.head_dim;
  a.page_size = b.page_size;
  a.max_pages_per_seq = b.max_pages;
  a.scale = 1.0f / std::sqrt(static_cast<float>(b.head_dim));
  return a;
}

// The batch on the device (output poisoned with NaN) and its launch arguments pointing there.
struct DeviceAttentionBatch {
  explicit DeviceAttentionBatch(const AttentionBatch& b)
      : q(b.q),
        kv(b.kv),
        out(std::vector<uint16_t>(b.q.size(), kNanBf16)),
        tables(b.tables),
        lens(b.seq_lens),
        starts(b.query_start),
        args(ArgsFor(b)),
        shape{b.seq_lens.data(), b.query_start.data(), static_cast<int>(b.seq_lens.size()),
              b.num_q_heads, b.num_kv_heads} {
    args.q = q.get();
    args.out = out.get();
    args.kv_layer = kv.get();
    args.block_tables = tables.get();
    args.seq_lens = lens.get();
    args.query_start = starts.get();
  }
  DeviceVector<uint16_t> q, kv, out;
  DeviceVector<int32_t> tables, lens, starts;
  PagedAttentionArgs args;
  AttentionBatchShape shape;  // the plan's host view of the batch (points into the AttentionBatch)
};

enum class AttentionPath { kDecode, kPrefill };

// Plans and runs one path on the batch; the bf16 output.
// One launch of `path` (decode: the stream kernel's stages filled by `copies`); bf16 output.
inline std::vector<uint16_t> RunGpu(const AttentionBatch& b, AttentionPath path,
                                    DecodeCopies copies = DecodeCopies::kDefault) {
  DeviceAttentionBatch d(b);
  d.args.decode_copies = copies;
  auto plan = AttentionPlan::Create({});
  EXPECT_TRUE(plan.ok()) << plan.status();
  absl::Status st;
  if (path == AttentionPath::kDecode) {
    EXPECT_TRUE((*plan)->BuildDecode(d.shape, nullptr).ok());
    st = PagedAttentionDecode(d.args, **plan, nullptr);
  } else {
    EXPECT_TRUE((*plan)->BuildPrefill(d.shape, nullptr).ok());
    st = PagedAttentionPrefill(d.args, **plan, nullptr);
  }
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return d.out.Download();
}

// fp32 oracle: PagedAttentionRef on the same bf16 inputs, fp32 output.
inline std::vector<float> Reference(const AttentionBatch& b) {
  std::vector<float> q(b.q.size()), out(b.q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = Bf16ToF32(b.q[i]);
  PagedAttentionArgs a = ArgsFor(b);
  a.q = q.data();
  a.out = out.data();
  a.kv_layer = b.kv.data();
  a.block_tables = b.tables.data();
  a.seq_lens = b.seq_lens.data();
  a.query_start = b.query_start.data();
  a.dtype = DType::kF32;
  a.kv_dtype = DType::kBF16;
  PagedAttentionRef(a);
  return out;
}

// bf16 output against the fp32 oracle: relative RMS error < 8e-3 and max error < 2e-2 (bf16
// P and output rounding); a NaN (unwritten or leaked) fails.
inline void ExpectClose(const std::vector<uint16_t>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  double err2 = 0.0, ref2 = 0.0, max_err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = Bf16ToF32(got[i]);
    ASSERT_FALSE(std::isnan(g)) << "element " << i << " unwritten or NaN";
    const double e = std::fabs(g - want[i]);
    err2 += e * e;
    ref2 += double{want[i]} * want[i];
    max_err = std::max(max_err, e);
  }
  EXPECT_LT(std::sqrt(err2 / std::max(ref2, 1e-30)), 8e-3);
  EXPECT_LT(max_err, 2e-2);
}

// n sequence lengths uniform in [1, max_len].
inline std::vector<int> RandomLens(int n, int max_len, std::mt19937& rng) {
  std::vector<int> v(n);
  for (int& x : v) x = 1 + static_cast<int>(rng() % max_len);
  return v;
}

// n sequences: the first `long_len` keys long, the others `short_len` (a decode plan balances
// them: the strided layout leaves the long one's CTAs with most of the work).
inline std::vector<int> LongAndShort(int n, int long_len, int short_len) {
  std::vector<int> v(n, short_len);
  v[0] = long_len;
  return v;
}

// What a decode plan must be (AttentionPlan::split_kv, attention_plan.h): split to fill the GPU;
// unsplit (whole key ranges, or balanced); balanced (unsplit, with merges at the cuts).
enum class WantPlan { kSplit, kUnsplit, kBalanced };

inline void ExpectPlan(const AttentionPlan& plan, WantPlan want) {
  EXPECT_EQ(plan.split_kv(), want == WantPlan::kSplit) << plan.num_merges() << " merges";
  if (want == WantPlan::kBalanced) {
    EXPECT_GT(plan.num_merges(), 0) << "a balanced plan cuts units between CTAs";
  }
}

}  // namespace tandem::testing
