// KvPageCopy against KvPageCopyRef: scattered, repeated-source and contiguous page lists, a page
// size that is not a power of two, more pages than one launch carries through the chunking of
// the caller (here: two launches), several layers of two pools in one launch, and the argument
// checks. Skips without a GPU.
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

// Several layers in one launch: pools of different page counts (so different layer strides),
// the same scattered pages in every layer, an odd layer count; every other byte untouched.
TEST(KvPageCopyTest, CopiesSeveralLayersInOneLaunch) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  constexpr int kLayers = 5, kSrcPages = 11, kDstPages = 17, kN = 7;
  const int64_t page_bytes = int64_t{48} * 16;
  const int64_t src_bytes = kLayers * kSrcPages * page_bytes;
  const int64_t dst_bytes = kLayers * kDstPages * page_bytes;
  std::vector<uint8_t> src(src_bytes), dst(dst_bytes, 0xAB);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  KvPageCopyArgs a;
  a.page_bytes = page_bytes;
  a.num_pages = kN;
  a.num_layers = kLayers - 1;  // layers 1 .. 4 (the bases point at layer 1)
  a.src_layer_bytes = kSrcPages * page_bytes;
  a.dst_layer_bytes = kDstPages * page_bytes;
  for (int i = 0; i < kN; ++i) {
    a.src_pages[i] = (i * 3 + 2) % kSrcPages;
    a.dst_pages[i] = (i * 5 + 1) % kDstPages;
  }
  void *d_src, *d_dst;
  ASSERT_EQ(cudaMalloc(&d_src, src_bytes), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_dst, dst_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_src, src.data(), src_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_dst, dst.data(), dst_bytes, cudaMemcpyHostToDevice), cudaSuccess);
  KvPageCopyArgs d = a;
  d.src_layer = static_cast<char*>(d_src) + a.src_layer_bytes;
  d.dst_layer = static_cast<char*>(d_dst) + a.dst_layer_bytes;
  ASSERT_TRUE(KvPageCopy(d, nullptr).ok());
  std::vector<uint8_t> got(dst_bytes);
  ASSERT_EQ(cudaMemcpy(got.data(), d_dst, dst_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  a.src_layer = src.data() + a.src_layer_bytes;
  a.dst_layer = dst.data() + a.dst_layer_bytes;
  ASSERT_TRUE(KvPageCopyRef(a).ok());
  EXPECT_EQ(got, dst);
  // Layer 0 of the destination stays untouched: the reference did not write it either.
  EXPECT_TRUE(std::all_of(dst.begin(), dst.begin() + a.dst_layer_bytes,
                          [](uint8_t b) { return b == 0xAB; }));
  cudaFree(d_src);
  cudaFree(d_dst);
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
  a.page_bytes = 16;
  a.num_layers = 2;
  a.src_layer_bytes = 40;  // a layer stride that is not a multiple of 16
  EXPECT_EQ(KvPageCopy(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.src_layer_bytes = 48;
  a.num_layers = kKvPageCopyMaxLayers + 1;
  EXPECT_EQ(KvPageCopy(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
