// CUDA Gemm (skinny, cuBLASLt and fallback paths) against GemmRef on awkward shapes.
#include "kernels/gemm/gemm.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/gemm/gemm_variants.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace tandem {
namespace {

using testing::Bf16Ulp;
using testing::DeviceBuffer;
using testing::HostTensor;
using testing::RandomTensor;

enum class Path { kDispatch, kSkinny, kCublasLt, kFallback, kVariant };

struct Case {
  int64_t m, n, k;
  DType a = DType::kBF16, w = DType::kBF16, c = DType::kBF16;
  bool bias = false;
  Path path = Path::kDispatch;
  int variant = 0;  // for Path::kVariant: GemmSkinnyVariant's variant
};

absl::Status Run(Path p, const GemmArgs& args, int variant) {
  switch (p) {
    case Path::kVariant:
      return GemmSkinnyVariant(args, variant, nullptr);
    case Path::kDispatch:
      return Gemm(args, nullptr);
    case Path::kSkinny:
      return GemmSkinny(args, nullptr);
    case Path::kCublasLt:
      return GemmCublasLt(args, nullptr);
    case Path::kFallback:
      return GemmFallback(args, nullptr);
  }
  return absl::InternalError("path");
}

void CheckCase(const Case& cs, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " path="
                                    << static_cast<int>(cs.path) << " bias=" << cs.bias);
  std::mt19937_64 rng(seed);
  HostTensor a = RandomTensor(cs.a, cs.m * cs.k, rng);
  HostTensor w = RandomTensor(cs.w, cs.n * cs.k, rng);
  HostTensor bias = RandomTensor(cs.c, cs.n, rng);
  HostTensor want(cs.c, cs.m * cs.n), got(cs.c, cs.m * cs.n);
  GemmArgs args{.a = a.data(),
                .w = w.data(),
                .bias = cs.bias ? bias.data() : nullptr,
                .c = want.data(),
                .m = cs.m,
                .n = cs.n,
                .k = cs.k,
                .a_dtype = cs.a,
                .w_dtype = cs.w,
                .c_dtype = cs.c};
  GemmRef(args);
  DeviceBuffer da(a.bytes), dw(w.bytes), dbias(bias.bytes), dc(got.bytes.size());
  da.Upload(a.data());
  dw.Upload(w.data());
  dbias.Upload(bias.data());
  dc.Poison();
  args.a = da.get(), args.w = dw.get(), args.c = dc.get();
  args.bias = cs.bias ? dbias.get() : nullptr;
  ASSERT_TRUE(Run(cs.path, args, cs.variant).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dc.Download(got.data());
  for (int64_t i = 0; i < cs.m * cs.n; ++i) {
    const double ref = want.at(i), x = got.at(i);
    const int64_t row = i / cs.n, col = i % cs.n;
    double mag = 0;  // sum |a| |w| bounds the summation-order difference
    for (int64_t kk = 0; kk < cs.k; ++kk) {
      mag += std::abs(a.at(row * cs.k + kk) * w.at(col * cs.k + kk));
    }
    const double tol = 1e-5 * mag + (cs.c == DType::kBF16 ? Bf16Ulp(ref) : 1e-6);
    ASSERT_FALSE(std::isnan(x)) << "at " << i;
    ASSERT_NEAR(x, ref, tol) << "at (" << row << "," << col << ")";
  }
}

TEST(GemmCudaTest, DispatchOnAwkwardShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (int64_t m : {1, 3, 17, 255}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{96, 256}, {1000, 4104}, {24, 8}}) {
      CheckCase({.m = m, .n = n, .k = k, .bias = (m % 2) == 1}, seed++);
      CheckCase({.m = m, .n = n, .k = k, .c = DType::kF32}, seed++);
    }
  }
}

TEST(GemmCudaTest, SkinnyEveryRowTileAndBothRowsPerBlock) {
  TANDEM_SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 16}) {
    // n = 2200 takes 2 rows per block (m <= 8), n = 40 one row per block.
    for (int64_t n : {2200, 40}) {
      CheckCase({.m = m, .n = n, .k = 1032, .bias = true, .path = Path::kSkinny}, seed++);
    }
  }
  // Long rows (k >= 8192) take 8 rows per block for m <= 2.
  for (int64_t m : {1, 2}) {
    CheckCase({.m = m, .n = 2200, .k = 8200, .path = Path::kSkinny}, seed++);
  }
}

// Every skinny variant (the continuous-stream kernels of gemm_stream.h too) on long and awkward
// rows: k not a multiple of the 1024-column stage or of 256 threads x 8, n not a multiple of
// the rows per block, k shorter than one stage, and the 12288 -> 4096 decode shape.
TEST(GemmCudaTest, SkinnyVariantsOnLongAndAwkwardRows) {
  TANDEM_SKIP_WITHOUT_GPU();
  uint64_t seed = 300;
  for (int v = 0; v < kNumSkinnyVariants; ++v) {
    for (int64_t m : {1, 2, 3, 4}) {
      for (auto [n, k] :
           {std::pair<int64_t, int64_t>{2203, 8200}, {37, 1032}, {9, 8}, {13, 3080}}) {
        CheckCase({.m = m, .n = n, .k = k, .bias = m == 3, .path = Path::kVariant, .variant = v},
                  seed++);
      }
    }
    CheckCase({.m = 1, .n = 4096, .k = 12288, .path = Path::kVariant, .variant = v}, seed++);
  }
}

TEST(GemmCudaTest, CublasLtAndFallbackPaths) {
  TANDEM_SKIP_WITHOUT_GPU();
  CheckCase({.m = 3, .n = 64, .k = 128, .bias = true, .path = Path::kCublasLt}, 7);
  CheckCase({.m = 300, .n = 136, .k = 520, .c = DType::kF32, .bias = true, .path = Path::kCublasLt},
            8);
  // K and N not multiples of 8, and f32 operands: the generic fallback, through Gemm().
  CheckCase({.m = 17, .n = 33, .k = 37, .bias = true}, 9);
  CheckCase({.m = 5, .n = 19, .k = 70, .a = DType::kF32, .w = DType::kF32, .c = DType::kF32}, 10);
  CheckCase({.m = 2, .n = 7, .k = 13, .a = DType::kF32, .path = Path::kFallback}, 11);
}

TEST(GemmCudaTest, AlignedPathsRejectMisalignedShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  GemmArgs args{.m = 1, .n = 16, .k = 12};
  DeviceBuffer a(64), w(1024), c(64);
  args.a = a.get(), args.w = w.get(), args.c = c.get();
  EXPECT_EQ(GemmSkinny(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.k = 16, args.n = 12;
  EXPECT_EQ(GemmCublasLt(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.m = 17;
  EXPECT_EQ(GemmSkinny(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
