// UnpackBuilder + UnpackRef: a packed buffer lands every copy and every row where it says, pads
// nothing into neighbours, and refuses bad input.
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/unpack/unpack.h"

namespace tandem {
namespace {

// 16-byte aligned host arrays with a sentinel tail.
template <typename T>
struct Aligned {
  explicit Aligned(size_t n) : storage(n + 64 / sizeof(T) + 16, T{}) {
    const auto addr = reinterpret_cast<uintptr_t>(storage.data());
    offset = ((16 - addr % 16) % 16) / sizeof(T);
    data = storage.data() + offset;
  }
  std::vector<T> storage;
  size_t offset = 0;
  T* data = nullptr;
};

TEST(UnpackRefTest, CopiesLandAtTheirDestinations) {
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> srcs;
  std::vector<Aligned<int32_t>> dsts;
  UnpackBuilder b;
  for (int n : {1, 3, 4, 7, 17, 1000}) {
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = static_cast<int32_t>(rng());
    srcs.push_back(v);
    dsts.emplace_back(n);
  }
  for (size_t i = 0; i < srcs.size(); ++i) ASSERT_TRUE(b.AddCopy(dsts[i].data, srcs[i]).ok());
  EXPECT_EQ(b.header().num_copies, srcs.size());
  EXPECT_EQ(b.size() % 16, 0);
  UnpackRef(b.data());
  for (size_t i = 0; i < srcs.size(); ++i) {
    EXPECT_EQ(std::memcmp(dsts[i].data, srcs[i].data(), srcs[i].size() * 4), 0) << i;
  }
}

TEST(UnpackRefTest, RowsExpandIntoAFixedStride) {
  const int stride = 5;
  const std::vector<int32_t> values = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> starts = {0, 3, 3, 8};  // widths 3, 0, 5
  Aligned<int32_t> table(3 * stride);
  std::fill(table.data, table.data + 3 * stride, -7);
  UnpackBuilder b;
  ASSERT_TRUE(b.AddRows(table.data, stride, values, starts).ok());
  UnpackRef(b.data());
  const std::vector<int32_t> want = {1, 2, 3, -7, -7, -7, -7, -7, -7, -7, 4, 5, 6, 7, 8};
  EXPECT_EQ(std::vector<int32_t>(table.data, table.data + 15), want);
}

TEST(UnpackRefTest, RejectsBadInput) {
  UnpackBuilder b;
  Aligned<int32_t> dst(8);
  const std::vector<int32_t> v = {1, 2};
  EXPECT_EQ(b.AddCopy(reinterpret_cast<char*>(dst.data) + 4, v.data(), 8).code(),
            absl::StatusCode::kInvalidArgument);  // unaligned destination
  EXPECT_EQ(b.AddCopy(dst.data, v.data(), -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.AddRows(dst.data, 1, v, {0, 2}).code(),
            absl::StatusCode::kInvalidArgument);  // row wider than the stride
  EXPECT_EQ(b.AddRows(dst.data, 4, v, {0, 1}).code(),
            absl::StatusCode::kInvalidArgument);  // starts do not cover the values
  for (int i = 0; i < kUnpackMaxCopies; ++i) ASSERT_TRUE(b.AddCopy(dst.data, v).ok());
  EXPECT_EQ(b.AddCopy(dst.data, v).code(), absl::StatusCode::kResourceExhausted);
  // Zero bytes queue nothing (and do not count against the limit).
  EXPECT_TRUE(b.AddCopy(dst.data, v.data(), 0).ok());
}

TEST(UnpackRefTest, ResetKeepsNothing) {
  UnpackBuilder b;
  Aligned<int32_t> dst(4);
  ASSERT_TRUE(b.AddCopy(dst.data, std::vector<int32_t>{1, 2, 3}).ok());
  b.Reset();
  EXPECT_EQ(b.header().num_copies, 0u);
  EXPECT_EQ(b.size(), static_cast<int64_t>(sizeof(UnpackHeader)));
}

}  // namespace
}  // namespace tandem
