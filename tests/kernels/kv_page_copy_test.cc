// KvPageCopy against KvPageCopyRef: scattered, repeated-source and contiguous page lists, a page
// size that is not a power of two, more pages than one launch carries through the chunking of
// the caller (here: two launches), and the argument checks. Skips without a GPU.
#include "kernels/kv_page_copy/kv_page_copy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda_test_util.h"

namespace tandem {
namespace {

TEST(KvPageCopyTest, MatchesTheReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  for (int64_t page_bytes : {int64_t{16}, int64_t{48} * 16, int64_t{64} << 10}) {
    for (int n : {1, 7, 1024}) {
      SCOPED_TRACE(::testing::Message() << page_bytes << " bytes x " << n << " pages");
      const int pool_pages = 2 * n + 3;
      const int64_t bytes = pool_pages * page_bytes;
      std::vector<uint8_t> src(bytes), dst(bytes, 0xAB);
      for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
      std::vector<int32_t> ids(pool_pages);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.end(), rng);
      KvPageCopyArgs a;
      a.page_bytes = page_bytes;
      a.num_pages = n;
      for (int i = 0; i < n; ++i) {
        a.dst_pages[i] = ids[i];
        a.src_pages[i] = ids[(i * 5 + 1) % pool_pages];  // sources may repeat
      }
      void *d_src, *d_dst;
      ASSERT_EQ(cudaMalloc(&d_src, bytes), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&d_dst, bytes), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_src, src.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d_dst, dst.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      KvPageCopyArgs d = a;
      d.src_layer = d_src;
      d.dst_layer = d_dst;
      ASSERT_TRUE(KvPageCopy(d, nullptr).ok());
      std::vector<uint8_t> got(bytes);
      ASSERT_EQ(cudaMemcpy(got.data(), d_dst, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      a.src_layer = src.data();
      a.dst_layer = dst.data();
      ASSERT_TRUE(KvPageCopyRef(a).ok());
      EXPECT_EQ(got, dst);  // untouched pages keep 0xAB on both sides
      cudaFree(d_src);
      cudaFree(d_dst);
    }
  }
}

TEST(KvPageCopyTest, RefusesArgumentsOutsideTheContract) {
  TANDEM_SKIP_WITHOUT_GPU();
  KvPageCopyArgs a;
  a.num_pages = kKvPageCopyMaxPages + 1;
  a.page_bytes = 16;
  EXPECT_EQ(KvPageCopy(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.num_pages = 1;
  a.page_bytes = 24;  // not a multiple of 16
  EXPECT_EQ(KvPageCopy(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
