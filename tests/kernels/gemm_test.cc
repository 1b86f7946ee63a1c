// CUDA Gemm (skinny, cuBLASLt and fallback paths) against GemmRef on awkward shapes.
#include "kernels/gemm/gemm.h"

#include <cmath>
#include <iostream>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/cublaslt_autotune.h"
#include "kernels/gemm/gemm_variants.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace tandem {
namespace {

using testing::Bf16Ulp;
using testing::DeviceBuffer;
using testing::HostTensor;
using testing::RandomTensor;

// k*Pdl: the same entry point with GemmArgs::overlap_launch (programmatic dependent launch).
enum class Path { kDispatch, kSkinny, kCublasLt, kFallback, kVariant, kDispatchPdl, kSkinnyPdl };

struct Case {
  int64_t m, n, k;
  DType a = DType::kBF16, w = DType::kBF16, c = DType::kBF16;
  bool bias = false;
  Path path = Path::kDispatch;
  int variant = 0;          // for Path::kVariant: GemmSkinnyVariant's variant
  bool norm = false;        // GemmArgs::a_norm_weight (fused RMSNorm of a)
  bool accumulate = false;  // GemmArgs::accumulate (c += ...)
};

// Sets GemmArgs::overlap_launch explicitly on every path, whatever its default.
absl::Status Run(Path p, const GemmArgs& in, int variant) {
  GemmArgs args = in;
  args.overlap_launch = p == Path::kDispatchPdl || p == Path::kSkinnyPdl;
  switch (p) {
    case Path::kVariant:
      return GemmSkinnyVariant(args, variant, nullptr);
    case Path::kDispatch:
    case Path::kDispatchPdl:
      return Gemm(args, nullptr);
    case Path::kSkinny:
    case Path::kSkinnyPdl:
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
  // Norm weights around 1 with a spread, and a's rows at different scales, so that a missing or
  // misapplied 1 / rms or weight is O(1) off.
  HostTensor norm_w = RandomTensor(cs.a, cs.k, rng, 0.25f, 1.75f);
  for (int64_t i = 0; cs.norm && i < cs.m; ++i) {
    for (int64_t kk = 0; kk < cs.k; ++kk) a.set(i * cs.k + kk, a.at(i * cs.k + kk) * (1 + 3 * i));
  }
  HostTensor want(cs.c, cs.m * cs.n), got(cs.c, cs.m * cs.n);
  const HostTensor c_init = RandomTensor(cs.c, cs.m * cs.n, rng);  // what accumulate adds to
  if (cs.accumulate) want = c_init;
  GemmArgs args{.a = a.data(),
                .w = w.data(),
                .bias = cs.bias ? bias.data() : nullptr,
                .c = want.data(),
                .m = cs.m,
                .n = cs.n,
                .k = cs.k,
                .a_dtype = cs.a,
                .w_dtype = cs.w,
                .c_dtype = cs.c,
                .accumulate = cs.accumulate,
                .a_norm_weight = cs.norm ? norm_w.data() : nullptr,
                .a_norm_eps = 1e-5f};
  GemmRef(args);
  DeviceBuffer da(a.bytes), dw(w.bytes), dbias(bias.bytes), dc(got.bytes.size()),
      dnorm(norm_w.bytes);
  da.Upload(a.data());
  dw.Upload(w.data());
  dbias.Upload(bias.data());
  dnorm.Upload(norm_w.data());
  if (cs.accumulate) {
    dc.Upload(c_init.data());
  } else {
    dc.Poison();
  }
  args.a = da.get(), args.w = dw.get(), args.c = dc.get();
  args.bias = cs.bias ? dbias.get() : nullptr;
  args.a_norm_weight = cs.norm ? dnorm.get() : nullptr;
  ASSERT_TRUE(Run(cs.path, args, cs.variant).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  dc.Download(got.data());
  for (int64_t i = 0; i < cs.m * cs.n; ++i) {
    const double ref = want.at(i), x = got.at(i);
    const int64_t row = i / cs.n, col = i % cs.n;
    double scale = 1.0;  // the row's 1 / rms with the fused norm
    if (cs.norm) {
      double ss = 0;
      for (int64_t kk = 0; kk < cs.k; ++kk) ss += a.at(row * cs.k + kk) * a.at(row * cs.k + kk);
      scale = 1.0 / std::sqrt(ss / cs.k + 1e-5);
    }
    double mag = 0;  // sum |a| |w| bounds the summation-order difference
    for (int64_t kk = 0; kk < cs.k; ++kk) {
      const double ak = a.at(row * cs.k + kk) * (cs.norm ? scale * norm_w.at(kk) : 1.0);
      mag += std::abs(ak * w.at(col * cs.k + kk));
    }
    double tol = 1e-5 * mag + (cs.c == DType::kBF16 ? Bf16Ulp(ref) : 1e-6);
    // cuBLASLt's beta = 1 may round the product to bf16 before adding c (GemmArgs::accumulate):
    // half an ulp of the product more.
    const bool lt_may_run =
        cs.path == Path::kCublasLt ||
        ((cs.path == Path::kDispatch || cs.path == Path::kDispatchPdl) && cs.m > kSkinnyMaxM);
    if (cs.accumulate && lt_may_run && cs.c == DType::kBF16) {
      tol += 0.5 * Bf16Ulp(ref - c_init.at(i));
    }
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

// The PDL launch of the skinny kernel on the skinny tests' awkward shapes: every row tile (8 / 2
// / 1 rows per block) and m = 1..16, k not a multiple of 256 threads x 8 (8200, 1032, 3080), k = 8
// (one vector: all threads but one reach the dependency wait after the loop), odd n, bias, the
// 12288 -> 4096 decode shape; and through Gemm() (skinny at m = 1; cuBLASLt and the fallback
// ignore the flag).
TEST(GemmCudaTest, SkinnyPdlOnAwkwardShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  uint64_t seed = 500;
  for (int64_t m : {1, 2, 3, 4, 5, 8, 9, 16}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{2200, 1032}, {40, 1032}, {9, 8}, {13, 3080}}) {
      CheckCase({.m = m, .n = n, .k = k, .bias = m % 2 == 1, .path = Path::kSkinnyPdl}, seed++);
    }
  }
  for (int64_t m : {1, 2}) {
    CheckCase({.m = m, .n = 2203, .k = 8200, .bias = m == 1, .path = Path::kSkinnyPdl}, seed++);
  }
  CheckCase({.m = 1, .n = 4096, .k = 12288, .path = Path::kSkinnyPdl}, seed++);
  CheckCase({.m = 1, .n = 4096, .k = 12288, .c = DType::kF32, .path = Path::kSkinnyPdl}, seed++);
  for (int64_t m : {1, 3, 17}) {
    CheckCase({.m = m, .n = 1000, .k = 4104, .bias = true, .path = Path::kDispatchPdl}, seed++);
    CheckCase({.m = m, .n = 33, .k = 37, .path = Path::kDispatchPdl}, seed++);
  }
}

// The fused RMSNorm (a_norm_weight) and the in-place add (accumulate) on the skinny kernel, every
// row tile, PDL or not, against GemmRef doing the same; accumulate also through cuBLASLt and the
// fallback; a fused norm where the skinny kernel cannot serve it is refused, not ignored.
TEST(GemmCudaTest, FusedNormAndAccumulate) {
  TANDEM_SKIP_WITHOUT_GPU();
  uint64_t seed = 700;
  for (Path p : {Path::kSkinny, Path::kSkinnyPdl, Path::kDispatch, Path::kDispatchPdl}) {
    for (int64_t m : {1, 3}) {
      if (m > kSkinnyMaxM && (p == Path::kDispatch || p == Path::kDispatchPdl)) continue;
      // n = 2200 / 6144: 2 rows per block; n = 40: one; k = 8200: 8 rows per block.
      for (auto [n, k] :
           {std::pair<int64_t, int64_t>{2200, 1032}, {40, 264}, {2200, 8200}, {6144, 4096}}) {
        CheckCase({.m = m, .n = n, .k = k, .path = p, .accumulate = true}, seed++);
        if (m != 1) continue;  // the fused norm is for m = 1 (refused above it: below)
        CheckCase({.m = m, .n = n, .k = k, .bias = n == 40, .path = p, .norm = true}, seed++);
        CheckCase({.m = m, .n = n, .k = k, .path = p, .norm = true, .accumulate = true}, seed++);
      }
    }
  }
  for (Path p : {Path::kCublasLt, Path::kFallback, Path::kDispatch}) {
    CheckCase({.m = 64, .n = 1000, .k = 4104, .path = p, .accumulate = true}, seed++);
    // With a bias, cuBLASLt would round twice: Gemm() takes the fallback (cuBLASLt refuses, below).
    if (p != Path::kCublasLt) {
      CheckCase({.m = 5, .n = 96, .k = 256, .bias = true, .path = p, .accumulate = true}, seed++);
    }
  }
  CheckCase(
      {.m = 3, .n = 96, .k = 256, .c = DType::kF32, .path = Path::kFallback, .accumulate = true},
      seed++);
  // Refused: a fused norm through cuBLASLt, the fallback, the skinny kernel above m = 1, or
  // Gemm() above kSkinnyMaxM.
  DeviceBuffer a(64 * 256 * 2), w(96 * 256 * 2), c(64 * 96 * 2), g(256 * 2);
  GemmArgs args{.a = a.get(),
                .w = w.get(),
                .c = c.get(),
                .m = 64,
                .n = 96,
                .k = 256,
                .a_norm_weight = g.get()};
  EXPECT_EQ(Gemm(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemmCublasLt(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GemmFallback(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.m = 2;
  EXPECT_EQ(GemmSkinny(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  GemmArgs biased = args;
  biased.a_norm_weight = nullptr;
  biased.bias = g.get();
  biased.accumulate = true;
  EXPECT_EQ(GemmCublasLt(biased, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.m = 1;
  EXPECT_TRUE(Gemm(args, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
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

// Plans tuned among the heuristic's candidates (kernels/common/cublaslt_autotune.h, forced on)
// on decode-like shapes, n = 4096 and 6144: whichever candidate wins gives the reference, and
// accumulate adds exactly one product to c (the timing wrote scratch outputs only). Each
// accumulate case makes its plan (tuned at beta = 1), which the plain case after it reuses;
// m = 250 comes after 256, its bucket's tuned plan.
TEST(GemmCudaTest, TunedCublasLtPlansOnDecodeShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  ScopedLtAutotune on(true);
  const LtTuneStats before = GetLtTuneStats();
  uint64_t seed = 100;
  for (int64_t m : {1, 7, 33, 256, 250}) {
    for (int64_t n : {4096, 6144}) {
      CheckCase({.m = m, .n = n, .k = 264, .path = Path::kCublasLt, .accumulate = true}, seed++);
      CheckCase({.m = m, .n = n, .k = 264, .bias = m == 7, .path = Path::kCublasLt}, seed++);
    }
  }
  const LtTuneStats after = GetLtTuneStats();
  const int64_t timed = after.plans_timed - before.plans_timed;
  EXPECT_GE(timed, 1) << "no plan was tuned";
  EXPECT_GT(after.candidates_timed - before.candidates_timed, timed);
  EXPECT_EQ(after.plans_untimed, before.plans_untimed) << "a plan fell back untimed";
  std::cout << "tuned " << timed << " bf16 plans, " << after.bucket_reuses - before.bucket_reuses
            << " took their bucket's winner\n";
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

// A chain of dependent GEMMs with k == n, as in a decode step: step i reads step i-1's output
// (step 0 reads a). PDL launches (every step but each third, so PDL follows plain and plain
// follows PDL) may start while the previous step still runs; a step that read its input or wrote
// its output before the dependency wait would see the poisoned (NaN) buffer or partial results.
// Run in stream order and as a replayed CUDA graph (where capture turns PDL into programmatic
// edges); each step is checked against GemmRef applied to the previous step's actual output.
class PdlChain {
 public:
  PdlChain(int64_t m, int64_t k, int steps, uint64_t seed) : m_(m), k_(k), steps_(steps) {
    std::mt19937_64 rng(seed);
    const float s = std::sqrt(3.0f / static_cast<float>(k));  // keeps |c| ~ |a| along the chain
    a_host_ = RandomTensor(DType::kBF16, m * k, rng);
    for (int i = 0; i < steps; ++i) {
      w_.push_back(RandomTensor(DType::kBF16, k * k, rng, -s, s));
      bias_.push_back(RandomTensor(DType::kBF16, k, rng));
      dw_.push_back(std::make_unique<DeviceBuffer>(w_.back().bytes));
      dbias_.push_back(std::make_unique<DeviceBuffer>(bias_.back().bytes));
    }
    for (int i = 0; i <= steps; ++i) dc_.push_back(std::make_unique<DeviceBuffer>(m * k * 2));
    dc_[0]->Upload(a_host_.data());
  }

  // Enqueues the chain on `stream` (plain launches or captured).
  void Enqueue(cudaStream_t stream) const {
    for (int i = 0; i < steps_; ++i) {
      const GemmArgs args{.a = dc_[i]->get(),
                          .w = dw_[i]->get(),
                          .bias = i % 2 == 0 ? dbias_[i]->get() : nullptr,
                          .c = dc_[i + 1]->get(),
                          .m = m_,
                          .n = k_,
                          .k = k_,
                          .overlap_launch = i % 3 != 2};
      ASSERT_TRUE(GemmSkinny(args, stream).ok()) << "step " << i;
    }
  }

  void PoisonOutputs() const {
    for (int i = 1; i <= steps_; ++i) dc_[i]->Poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  void CheckSteps() const {
    for (int i = 0; i < steps_; ++i) {
      SCOPED_TRACE(::testing::Message() << "m=" << m_ << " k=n=" << k_ << " step " << i);
      HostTensor in(DType::kBF16, m_ * k_), got(DType::kBF16, m_ * k_), want(DType::kBF16, m_ * k_);
      dc_[i]->Download(in.data());
      dc_[i + 1]->Download(got.data());
      GemmArgs ref{.a = in.data(),
                   .w = w_[i].data(),
                   .bias = i % 2 == 0 ? bias_[i].data() : nullptr,
                   .c = want.data(),
                   .m = m_,
                   .n = k_,
                   .k = k_};
      GemmRef(ref);
      const double w_max = std::sqrt(3.0 / static_cast<double>(k_));
      for (int64_t row = 0; row < m_; ++row) {
        double sum_abs_a = 0;  // sum |a| max |w| bounds the summation-order difference
        for (int64_t kk = 0; kk < k_; ++kk) sum_abs_a += std::abs(in.at(row * k_ + kk));
        ASSERT_FALSE(std::isnan(sum_abs_a)) << "input of step " << i << " row " << row;
        for (int64_t col = 0; col < k_; ++col) {
          const double x = got.at(row * k_ + col), r = want.at(row * k_ + col);
          ASSERT_FALSE(std::isnan(x)) << "at (" << row << "," << col << ")";
          ASSERT_NEAR(x, r, 1e-5 * w_max * sum_abs_a + Bf16Ulp(r))
              << "at (" << row << "," << col << ")";
        }
      }
    }
  }

 private:
  int64_t m_, k_;
  int steps_;
  HostTensor a_host_{DType::kBF16, 0};
  std::vector<HostTensor> w_, bias_;
  std::vector<std::unique_ptr<DeviceBuffer>> dw_, dbias_, dc_;  // dc_[0] = a, dc_[i] = step i-1's c
};

TEST(GemmCudaTest, PdlChainReadsPreviousOutput) {
  TANDEM_SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct Shape {
    int64_t m, k;
    int steps;
  };
  // 4096: 2 rows per block, ~4 waves; 8200: 8 rows per block (long rows); 264: 1 row per block;
  // k = 8: one vector per row (threads past it wait after the loop); m = 3 and 16: wider tiles.
  const Shape shapes[] = {{1, 4096, 6}, {1, 8200, 3}, {1, 264, 6}, {3, 8, 6}, {16, 1032, 3}};
  uint64_t seed = 900;
  for (const Shape& sh : shapes) {
    PdlChain chain(sh.m, sh.k, sh.steps, seed++);
    ASSERT_NO_FATAL_FAILURE(testing::RunInStreamAndGraph(
        stream, [&] { chain.PoisonOutputs(); }, [&](cudaStream_t s) { chain.Enqueue(s); },
        [&](const char* run) {
          SCOPED_TRACE(run);
          chain.CheckSteps();
        }));
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tandem
