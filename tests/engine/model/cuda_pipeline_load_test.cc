// LoadModel on the CUDA backend with pipeline stages (LoadCudaPipelineModel,
// engine/model/cuda_rank_groups.h). Its layout checks run before any GPU is touched, so they are
// tested here on the CPU (and hold on a GPU machine): stages beyond the layers, TP not dividing
// the heads, negative micro_batches, a head_dim the CUDA kernels lack — each refused with a
// message naming it. A valid layout, a quantized checkpoint's too, is not Unimplemented: without
// a GPU it is refused for want of one (FailedPrecondition), with fewer GPUs than ranks and no
// allow_device_sharing for want of GPUs (InvalidArgument naming the option). The GPU runs are
// tests/engine/engine_cuda_pp_test.cc (and engine_cuda_quant_tp_test.cc with quantized weights).
#include <string>

#include "base/check.h"
#include "engine/cuda/cuda_group.h"
#include "engine/model/make_model.h"
#include "engine/model/model.h"
#include "engine/model/parallel_model.h"
#include "gtest/gtest.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem {
namespace {

using testing_util::NewTempDir;

std::string Make(const std::string& preset, const std::string& quantization = "") {
  const std::string dir = NewTempDir("cuda_pp_" + preset);
  CHECK_OK(MakeModel({.preset = preset, .out_dir = dir, .seed = 3, .quantization = quantization})
               .status());
  return dir;
}

void ExpectRefused(const ParallelConfig& parallel, const std::string& dir, absl::StatusCode code,
                   const std::string& needle) {
  const absl::Status s = LoadModel(dir, Backend::kCuda, parallel).status();
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(s.message().find(needle), std::string::npos) << s;
  // The loader the engine's tests call directly says the same.
  EXPECT_EQ(LoadCudaParallelModel(dir, parallel).status().code(), code);
}

TEST(CudaPipelineLoadTest, LayoutsAreCheckedBeforeAnyGpuIsTouched) {
  const std::string dir = Make("small-llama3");  // 4 layers, 8 query heads, 2 KV heads
  ExpectRefused({.pipeline_parallel = 5, .allow_device_sharing = true}, dir,
                absl::StatusCode::kInvalidArgument, "pipeline_parallel 5");
  ExpectRefused({.tensor_parallel = 3, .pipeline_parallel = 2, .allow_device_sharing = true}, dir,
                absl::StatusCode::kInvalidArgument, "tensor_parallel 3");
  ExpectRefused({.pipeline_parallel = 2, .micro_batches = -1, .allow_device_sharing = true}, dir,
                absl::StatusCode::kInvalidArgument, "micro_batches -1");
  // tiny-llama3: head_dim 16, which the CUDA attention kernels do not cover.
  ExpectRefused({.pipeline_parallel = 2, .allow_device_sharing = true}, Make("tiny-llama3"),
                absl::StatusCode::kUnimplemented, "head_dim");
}

TEST(CudaPipelineLoadTest, AValidLayoutNeedsGpusForItsRanks) {
  const std::string dir = Make("small-llama3");
  const int visible = CudaDeviceCount();
  const ParallelConfig pp4{.pipeline_parallel = 4};  // 4 ranks, no sharing
  if (visible == 0) {
    ExpectRefused(pp4, dir, absl::StatusCode::kFailedPrecondition, "none is visible");
    ExpectRefused({.pipeline_parallel = 2, .allow_device_sharing = true},
                  Make("small-llama3", "fp8-block"), absl::StatusCode::kFailedPrecondition,
                  "none is visible");
    ExpectRefused({.tensor_parallel = 2, .pipeline_parallel = 2, .allow_device_sharing = true}, dir,
                  absl::StatusCode::kFailedPrecondition, "none is visible");
  } else if (visible < 4) {
    ExpectRefused(pp4, dir, absl::StatusCode::kInvalidArgument, "allow_device_sharing");
    ExpectRefused({.pipeline_parallel = 2, .devices = {0, 0}}, dir,
                  absl::StatusCode::kInvalidArgument, "allow it explicitly");
  } else {
    GTEST_SKIP() << visible << " GPUs: a PP 4 layout fits without sharing";
  }
}

}  // namespace
}  // namespace tandem
