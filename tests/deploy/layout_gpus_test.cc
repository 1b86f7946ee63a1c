// Layout gpus for tensor-parallel workers (deploy/launcher/layout.h): one GPU per worker or one
// per rank, each worker's CUDA_VISIBLE_DEVICES, and ranks sharing a GPU only when the group says
// allow_device_sharing (which then reaches the workers as --allow-device-sharing).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "deploy/launcher/cluster.h"
#include "deploy/launcher/layout.h"
#include "gtest/gtest.h"

namespace tandem::launcher {
namespace {

TEST(Layout, TensorParallelOnCudaGetsOneGpuPerRankOrSharesExplicitly) {
  // One GPU per rank: worker w's ranks at [w · TP, (w + 1) · TP).
  absl::StatusOr<Layout> l = ParseLayout(R"(
backend: cuda
groups:
  - {role: prefill, count: 2, tensor_parallel: 2, gpus: [0, 1, 2, 3]}
  - {role: decode, tensor_parallel: 2, gpus: [4, 5]}
)");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(WorkerGpus(l->groups[0], 0), "0,1");
  EXPECT_EQ(WorkerGpus(l->groups[0], 1), "2,3");
  EXPECT_EQ(WorkerGpus(l->groups[1], 0), "4,5");
  EXPECT_FALSE(l->groups[0].allow_device_sharing);
  std::vector<std::string> flags = WorkerLayoutFlags(*l, l->groups[0]);
  EXPECT_EQ(std::count(flags.begin(), flags.end(), "--allow-device-sharing"), 0);
  // One GPU per worker stays one GPU per worker (TP 1 layouts unchanged).
  absl::StatusOr<Layout> one = ParseLayout(
      "backend: cuda\ngroups: [{role: prefill, count: 2, gpus: [3, 5]}, {role: decode, gpus: "
      "[1]}]");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(WorkerGpus(one->groups[0], 1), "5");
  EXPECT_EQ(WorkerGpus(one->groups[1], 0), "1");
  // A TP 2 worker on one GPU, or on a GPU listed twice, only when sharing is allowed.
  for (const char* gpus : {"[0]", "[1, 1]"}) {
    const std::string yaml = absl::StrCat(
        "backend: cuda\ngroups: [{role: mixed, tensor_parallel: 2, gpus: ", gpus, "}]");
    absl::StatusOr<Layout> shared = ParseLayout(yaml);
    ASSERT_FALSE(shared.ok()) << yaml;
    EXPECT_NE(shared.status().message().find("allow_device_sharing"), std::string::npos)
        << shared.status();
    absl::StatusOr<Layout> allowed = ParseLayout(absl::StrCat(
        "backend: cuda\ngroups: [{role: mixed, tensor_parallel: 2, allow_device_sharing: true, "
        "gpus: ",
        gpus, "}]"));
    ASSERT_TRUE(allowed.ok()) << allowed.status();
    flags = WorkerLayoutFlags(*allowed, allowed->groups[0]);
    EXPECT_EQ(std::count(flags.begin(), flags.end(), "--allow-device-sharing"), 1);
  }
  // Neither one per worker nor one per rank; a negative GPU.
  for (const char* bad : {"[0, 1, 2]", "[-1, 0]"}) {
    const std::string yaml =
        absl::StrCat("backend: cuda\ngroups: [{role: mixed, tensor_parallel: 2, gpus: ", bad, "}]");
    EXPECT_FALSE(ParseLayout(yaml).ok()) << yaml;
  }
}

}  // namespace
}  // namespace tandem::launcher
