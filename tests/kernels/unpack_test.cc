// CUDA Unpack against UnpackRef: the same packed buffer, uploaded once, lands the same bytes in
// device memory as the reference does in host memory (sizes off the 16-byte grain, empty rows,
// a large copy that spans many blocks).
#include "kernels/unpack/unpack.h"

#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda_test_util.h"

namespace tandem {
namespace {

using testing::DeviceBuffer;

TEST(UnpackCudaTest, MatchesTheReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const std::vector<int> sizes = {1, 5, 16, 33, 4099, 1 << 20};
  std::vector<std::vector<int32_t>> srcs;
  std::vector<std::unique_ptr<DeviceBuffer>> dsts;
  UnpackBuilder b;
  for (int n : sizes) {
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = static_cast<int32_t>(rng());
    srcs.push_back(v);
    dsts.push_back(std::make_unique<DeviceBuffer>(n * 4 + 16));
    dsts.back()->Poison();
    ASSERT_TRUE(b.AddCopy(dsts.back()->as<int32_t>(), v).ok());
  }
  // Rows: 300 rows of widths 0..9 into a stride of 12.
  std::vector<int32_t> values, starts = {0};
  for (int r = 0; r < 300; ++r) {
    for (int i = 0; i < r % 10; ++i) values.push_back(r * 100 + i);
    starts.push_back(static_cast<int32_t>(values.size()));
  }
  DeviceBuffer table(300 * 12 * 4);
  table.Poison();
  ASSERT_TRUE(b.AddRows(table.as<int32_t>(), 12, values, starts).ok());
  DeviceBuffer packed(b.size());
  packed.Upload(b.data());
  ASSERT_TRUE(Unpack(packed.get(), b.header(), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int32_t> got(sizes[i] + 4);
    dsts[i]->Download(got.data());
    got.resize(sizes[i]);
    EXPECT_EQ(got, srcs[i]) << "copy " << i;
  }
  std::vector<int32_t> got(300 * 12);
  table.Download(got.data());
  for (int r = 0; r < 300; ++r) {
    for (int i = 0; i < 12; ++i) {
      const int32_t want = i < r % 10 ? r * 100 + i : -1;  // -1: the poison, untouched
      ASSERT_EQ(got[r * 12 + i], want) << "row " << r << " entry " << i;
    }
  }
}

}  // namespace
}  // namespace tandem
