// The prefill paths (the Hopper wgmma/TMA kernel, the default for bf16 head_dim 128 with a
// power-of-two page size, and the mma.sync kernel forced by TANDEM_PREFILL_KERNEL=fa2) against
// PagedAttentionRef on the edges of the Hopper kernel's tiling: 64-row warpgroups and 128-row
// items cut mid-token, key ranges that end inside a 128-key tile and inside a page, page sizes
// 8..256 (one TMA box per page, or several boxes per page above 128), GQA groups 1..16,
// chunked-prefill positions, several sequences. Cache rows past each sequence's end hold NaN:
// an unwritten cache slot must not leak into the output through 0 * NaN. The output is
// poisoned with NaN first, so an unwritten element fails.
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/paged_attention/paged_attention.h"
#include "tests/kernels/attention_gpu_util.h"

namespace tandem {
namespace {

using testing::AttentionBatch;
using testing::ExpectClose;
using testing::MakeBatch;
using testing::Reference;
using testing::RunGpu;

// Both prefill kernels on one batch.
void Check(const std::vector<int>& lens, const std::vector<int>& q_lens, int nq, int nkv,
           int page_size, uint32_t seed, int d = 128) {
  std::mt19937 rng(seed);
  const AttentionBatch b = MakeBatch(lens, q_lens, nq, nkv, d, page_size, rng);
  const std::vector<float> want = Reference(b);
  for (const char* kernel : {"sm90", "fa2"}) {
    SCOPED_TRACE(kernel);
    setenv("TANDEM_PREFILL_KERNEL", kernel, 1);
    ExpectClose(RunGpu(b, testing::AttentionPath::kPrefill), want);
  }
  unsetenv("TANDEM_PREFILL_KERNEL");
}

// Small shapes for compute-sanitizer (memcheck, racecheck): a tail tile, two sequences, a
// chunk over cached pages, page 16 and 128.
TEST(PrefillGpuTest, SmallForSanitizer) {
  TANDEM_SKIP_WITHOUT_GPU();
  Check({300, 45}, {300, 20}, 8, 2, 16, 1);
  Check({200}, {70}, 4, 1, 128, 2);
}

TEST(PrefillGpuTest, RowsAndKeysOffTheTiles) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int len : {1, 15, 17, 63, 65, 127, 129, 1000}) {
    SCOPED_TRACE(len);
    Check({len}, {len}, 32, 8, 64, 100 + len);
  }
}

TEST(PrefillGpuTest, PageSizes) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int page : {8, 16, 32, 64, 128, 256}) {
    SCOPED_TRACE(page);
    Check({777, 130}, {777, 130}, 32, 8, page, 200 + page);
  }
}

TEST(PrefillGpuTest, GqaGroupsAndChunks) {
  TANDEM_SKIP_WITHOUT_GPU();
  Check({1500, 900, 33}, {500, 900, 1}, 32, 8, 16, 301);  // group 4, chunked
  Check({1100, 260}, {300, 77}, 64, 8, 128, 302);         // group 8
  Check({515, 100}, {515, 99}, 8, 8, 32, 303);            // group 1
  Check({700}, {650}, 28, 4, 64, 304);                    // group 7: tokens cut by the rows
  Check({400, 2}, {123, 2}, 16, 1, 16, 305);              // group 16
}

TEST(PrefillGpuTest, SeveralSequencesAndLongPrompt) {
  TANDEM_SKIP_WITHOUT_GPU();
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
  TANDEM_SKIP_WITHOUT_GPU();
  Check({333, 64}, {200, 64}, 16, 2, 64, 501, 64);
}

}  // namespace
}  // namespace tandem
