// The KV pool's size from gpu_memory_utilization (vLLM's meaning: this process's share of the
// GPU, whatever other processes hold) and from the memory actually free; the CPU default and an
// explicit kv_memory_bytes; and the errors. Also the CUDA graph sizes an engine captures.
#include "engine/kv_budget.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

EngineOptions Cuda(double utilization) {
  EngineOptions o;
  o.backend = Backend::kCuda;
  o.gpu_memory_utilization = utilization;
  return o;
}

TEST(KvBudgetTest, UtilizationIsThisProcessesShareOfTheGpu) {
  // Alone on a 140 GiB GPU, 17 GiB of weights and buffers: 0.9 * 140 - 17 - graphs.
  absl::StatusOr<int64_t> alone = KvPoolBytes(
      Cuda(0.9), {.free_bytes = 123 * kGiB, .total_bytes = 140 * kGiB, .own_bytes = 17 * kGiB});
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(*alone, static_cast<int64_t>(0.9 * 140 * kGiB) - 17 * kGiB - kGraphReserveBytes);
  // A second engine on the same GPU (another process holds 62 GiB): its own 0.45 share, not
  // what the device as a whole has in use (the bug this guards against: 79 GiB in use > 63).
  absl::StatusOr<int64_t> shared = KvPoolBytes(
      Cuda(0.45), {.free_bytes = 61 * kGiB, .total_bytes = 140 * kGiB, .own_bytes = 17 * kGiB});
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(*shared, static_cast<int64_t>(0.45 * 140 * kGiB) - 17 * kGiB - kGraphReserveBytes);
}

TEST(KvBudgetTest, NeverMoreThanIsFree) {
  absl::StatusOr<int64_t> kv = KvPoolBytes(
      Cuda(0.9), {.free_bytes = 20 * kGiB, .total_bytes = 140 * kGiB, .own_bytes = 17 * kGiB});
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(*kv, 20 * kGiB - kFreeMarginBytes);
}

TEST(KvBudgetTest, NoRoomIsResourceExhaustedWithTheNumbers) {
  absl::StatusOr<int64_t> kv = KvPoolBytes(
      Cuda(0.1), {.free_bytes = 100 * kGiB, .total_bytes = 140 * kGiB, .own_bytes = 17 * kGiB});
  ASSERT_EQ(kv.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(kv.status().message().find("17408 MiB"), std::string::npos) << kv.status();
  EXPECT_EQ(KvPoolBytes(Cuda(0.9), {.free_bytes = 0, .total_bytes = 140 * kGiB}).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(KvBudgetTest, ExplicitBytesCpuDefaultAndBadUtilization) {
  EngineOptions o = Cuda(0.9);
  o.kv_memory_bytes = 12345;
  EXPECT_EQ(*KvPoolBytes(o, {}), 12345);
  EngineOptions cpu;
  EXPECT_EQ(*KvPoolBytes(cpu, {}), kDefaultCpuKvBytes);
  for (double bad : {0.0, -0.5, 1.5}) {
    EXPECT_EQ(KvPoolBytes(Cuda(bad), {.free_bytes = 1, .total_bytes = 1}).status().code(),
              absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(CudaGraphSizesTest, DefaultListIsOneTwoFourThenStepsOfEight) {
  EngineOptions o = Cuda(0.9);
  o.max_num_seqs = 20;
  EXPECT_EQ(*CudaGraphSizes(o), (std::vector<int>{1, 2, 4, 8, 16, 20}));
  o.max_num_seqs = 3;
  EXPECT_EQ(*CudaGraphSizes(o), (std::vector<int>{1, 2, 3}));
  o.enforce_eager = true;
  EXPECT_TRUE(CudaGraphSizes(o)->empty());
  EXPECT_TRUE(CudaGraphSizes(EngineOptions{})->empty());  // the CPU backend captures nothing
}

TEST(CudaGraphSizesTest, ExplicitSizesAreSortedAndOutOfRangeOnesRejected) {
  EngineOptions o = Cuda(0.9);
  o.max_num_seqs = 64;
  o.cuda_graph_sizes = {16, 1, 16, 64};
  EXPECT_EQ(*CudaGraphSizes(o), (std::vector<int>{1, 16, 64}));
  for (int bad : {0, -1, 65}) {
    o.cuda_graph_sizes = {1, bad};
    const auto sizes = CudaGraphSizes(o);
    ASSERT_EQ(sizes.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(sizes.status().message().find("max_num_seqs = 64"), std::string::npos)
        << sizes.status();
  }
}

}  // namespace
}  // namespace tandem
