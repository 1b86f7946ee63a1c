// The prefill paths (the Hopper wgmma/TMA kernel, the default for bf16 head_dim 128 with a
// power-of-two page size, and the mma.sync kernel forced by TANDEM_PREFILL_KERNEL=fa2) against
// PagedAttentionRef on the edges of the Hopper kernel's tiling: 64-row warpgroups and 128-row
// items cut mid-token, key ranges that end inside a 128-key tile and inside a page, page sizes
// 8..256 (one TMA box per page, or several boxes per page above 128), GQA groups 1..16,
// chunked-prefill positions, several sequences. Cache rows past each sequence's end hold NaN:
// an unwritten cache slot must not leak into the output through 0 * NaN. The output is
// poisoned with NaN first, so an unwritten element fails.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/paged_attention/paged_attention.h"
#include "tests/kernels/attention_gpu_util.h"

namespace tandem {
namespace {

using testing::DeviceBuffer;

constexpr uint16_t kNanBf16 = 0x7fc0;

struct Batch {
  std::vector<int32_t> seq_lens, query_start, tables;
  std::vector<uint16_t> q, kv;  // bf16 bits
  int nq, nkv, d, page_size, max_pages;
};

// Random q and cache; the cache rows of each sequence's last page past its length are NaN.
Batch MakeBatch(const std::vector<int>& lens, const std::vector<int>& q_lens, int nq, int nkv,
                int d, int page_size, std::mt19937& rng) {
  Batch b{{}, {0}, {}, {}, {}, nq, nkv, d, page_size, 1};
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
  b.q.resize(int64_t{b.query_start.back()} * nq * d);
  for (auto& x : b.q) x = F32ToBf16(2.0f * uni(rng));
  return b;
}

PagedAttentionArgs ArgsFor(const Batch& b) {
  PagedAttentionArgs a;
  a.num_seqs = static_cast<int>(b.seq_lens.size());
  a.num_tokens = b.query_start.back();
  a.num_q_heads = b.nq;
  a.num_kv_heads = b.nkv;
  a.head_dim = b.d;
  a.page_size = b.page_size;
  a.max_pages_per_seq = b.max_pages;
  a.scale = 1.0f / std::sqrt(static_cast<float>(b.d));
  return a;
}

std::vector<float> Reference(const Batch& b) {
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
  PagedAttentionRef(a);
  return out;
}

std::vector<uint16_t> RunPrefill(const Batch& b) {
  DeviceBuffer<uint16_t> q(b.q), kv(b.kv), out(std::vector<uint16_t>(b.q.size(), kNanBf16));
  DeviceBuffer<int32_t> tables(b.tables), lens(b.seq_lens), starts(b.query_start);
  PagedAttentionArgs a = ArgsFor(b);
  a.q = q.get();
  a.out = out.get();
  a.kv_layer = kv.get();
  a.block_tables = tables.get();
  a.seq_lens = lens.get();
  a.query_start = starts.get();
  auto plan = AttentionPlan::Create({});
  EXPECT_TRUE(plan.ok()) << plan.status();
  const AttentionBatchShape shape{b.seq_lens.data(), b.query_start.data(), a.num_seqs, b.nq, b.nkv};
  EXPECT_TRUE((*plan)->BuildPrefill(shape, nullptr).ok());
  const absl::Status st = PagedAttentionPrefill(a, **plan, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return out.Download();
}

void ExpectClose(const std::vector<uint16_t>& got, const std::vector<float>& want) {
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

// Both prefill kernels on one batch.
void Check(const std::vector<int>& lens, const std::vector<int>& q_lens, int nq, int nkv,
           int page_size, uint32_t seed, int d = 128) {
  std::mt19937 rng(seed);
  const Batch b = MakeBatch(lens, q_lens, nq, nkv, d, page_size, rng);
  const std::vector<float> want = Reference(b);
  for (const char* kernel : {"sm90", "fa2"}) {
    SCOPED_TRACE(kernel);
    setenv("TANDEM_PREFILL_KERNEL", kernel, 1);
    ExpectClose(RunPrefill(b), want);
  }
  unsetenv("TANDEM_PREFILL_KERNEL");
}

// Small shapes for compute-sanitizer (memcheck, racecheck): a tail tile, two sequences, a
// chunk over cached pages, page 16 and 128.
TEST(PrefillGpuTest, SmallForSanitizer) {
  SKIP_WITHOUT_GPU();
  Check({300, 45}, {300, 20}, 8, 2, 16, 1);
  Check({200}, {70}, 4, 1, 128, 2);
}

TEST(PrefillGpuTest, RowsAndKeysOffTheTiles) {
  SKIP_WITHOUT_GPU();
  for (int len : {1, 15, 17, 63, 65, 127, 129, 1000}) {
    SCOPED_TRACE(len);
    Check({len}, {len}, 32, 8, 64, 100 + len);
  }
}

TEST(PrefillGpuTest, PageSizes) {
  SKIP_WITHOUT_GPU();
  for (int page : {8, 16, 32, 64, 128, 256}) {
    SCOPED_TRACE(page);
    Check({777, 130}, {777, 130}, 32, 8, page, 200 + page);
  }
}

TEST(PrefillGpuTest, GqaGroupsAndChunks) {
  SKIP_WITHOUT_GPU();
  Check({1500, 900, 33}, {500, 900, 1}, 32, 8, 16, 301);  // group 4, chunked
  Check({1100, 260}, {300, 77}, 64, 8, 128, 302);         // group 8
  Check({515, 100}, {515, 99}, 8, 8, 32, 303);            // group 1
  Check({700}, {650}, 28, 4, 64, 304);                    // group 7: tokens cut by the rows
  Check({400, 2}, {123, 2}, 16, 1, 16, 305);              // group 16
}

TEST(PrefillGpuTest, SeveralSequencesAndLongPrompt) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  std::vector<int> lens(17), q_lens(17);
  for (int s = 0; s < 17; ++s) {
    lens[s] = 1 + static_cast<int>(rng() % 2000);
    q_lens[s] = 1 + static_cast<int>(rng() % lens[s]);
  }
  Check(lens, q_lens, 32, 8, 16, 401);
  Check({4096}, {4096}, 8, 2, 64, 402);
}

TEST(PrefillGpuTest, HeadDim64UsesTheFallback) {
  SKIP_WITHOUT_GPU();
  Check({333, 64}, {200, 64}, 16, 2, 64, 501, 64);
}

}  // namespace
}  // namespace tandem
