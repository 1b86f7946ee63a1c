// GemmRef against a naive double-precision dot product on awkward shapes and dtype mixes.
#include <cmath>
#include <random>
#include <tuple>

#include "gtest/gtest.h"
#include "kernels/gemm/gemm.h"
#include "tests/kernels/kernel_test_util.h"

namespace tandem {
namespace {

using testing::Bf16Ulp;
using testing::HostTensor;
using testing::RandomTensor;

struct Case {
  int64_t m, n, k;
  DType a, w, c;
  bool bias;
};

void CheckCase(const Case& cs, uint64_t seed) {
  std::mt19937_64 rng(seed);
  HostTensor a = RandomTensor(cs.a, cs.m * cs.k, rng);
  HostTensor w = RandomTensor(cs.w, cs.n * cs.k, rng);
  HostTensor bias = RandomTensor(cs.c, cs.n, rng);
  HostTensor c = RandomTensor(cs.c, cs.m * cs.n, rng);  // poison: every element must be written
  GemmArgs args{.a = a.data(),
                .w = w.data(),
                .bias = cs.bias ? bias.data() : nullptr,
                .c = c.data(),
                .m = cs.m,
                .n = cs.n,
                .k = cs.k,
                .a_dtype = cs.a,
                .w_dtype = cs.w,
                .c_dtype = cs.c};
  GemmRef(args);
  for (int64_t i = 0; i < cs.m; ++i) {
    for (int64_t j = 0; j < cs.n; ++j) {
      double ref = cs.bias ? bias.at(j) : 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < cs.k; ++kk) {
        const double p = static_cast<double>(a.at(i * cs.k + kk)) * w.at(j * cs.k + kk);
        ref += p;
        mag += std::abs(p);
      }
      // fp32 accumulation (a statistical bound, ~30x the typical error at k = 600, and far below
      // any indexing mistake, which is O(1)), plus half an ulp of the output rounding.
      double tol = 2e-6 * mag + 1e-6;
      if (cs.c == DType::kBF16) tol += 0.5 * Bf16Ulp(ref);
      const double got = c.at(i * cs.n + j);
      ASSERT_FALSE(std::isnan(got));
      ASSERT_NEAR(got, ref, tol) << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " at (" << i
                                 << "," << j << ")";
    }
  }
}

TEST(GemmRefTest, MatchesNaiveDotOnAwkwardShapes) {
  uint64_t seed = 1;
  for (int64_t m : {1, 3, 17}) {
    for (int64_t n : {1, 7, 33, 100}) {
      for (int64_t k : {1, 5, 257, 600}) {
        CheckCase({m, n, k, DType::kBF16, DType::kBF16, DType::kBF16, (n % 2) == 1}, seed++);
      }
    }
  }
}

TEST(GemmRefTest, EveryDtypeMixAndBias) {
  const DType kTypes[] = {DType::kF32, DType::kBF16};
  uint64_t seed = 100;
  for (DType a : kTypes) {
    for (DType w : kTypes) {
      for (DType c : kTypes) {
        for (bool bias : {false, true}) CheckCase({5, 65, 300, a, w, c, bias}, seed++);
      }
    }
  }
}

TEST(GemmRefTest, LargeMPrefillShape) {
  CheckCase({300, 96, 512, DType::kBF16, DType::kBF16, DType::kF32, true}, 7);
}

TEST(GemmRefTest, EmptyMOrNWritesNothing) {
  std::vector<float> a(4, 1.0f), w(4, 1.0f), c(1, 42.0f);
  GemmArgs args{.a = a.data(),
                .w = w.data(),
                .c = c.data(),
                .m = 0,
                .n = 1,
                .k = 4,
                .a_dtype = DType::kF32,
                .w_dtype = DType::kF32,
                .c_dtype = DType::kF32};
  GemmRef(args);
  EXPECT_EQ(c[0], 42.0f);
}

// accumulate adds to what c held; a_norm_weight normalises each row of a (RMSNorm) first.
TEST(GemmRefTest, FusedNormAndAccumulate) {
  std::mt19937_64 rng(7);
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 33, 257}, {3, 7, 600}}) {
    for (DType dt : {DType::kF32, DType::kBF16}) {
      HostTensor a = RandomTensor(dt, m * k, rng);
      for (int64_t i = 0; i < m * k; ++i) a.set(i, a.at(i) * (1 + 2 * (i / k)));  // row scales
      HostTensor w = RandomTensor(dt, n * k, rng);
      HostTensor g = RandomTensor(dt, k, rng, 0.5f, 1.5f);
      HostTensor c = RandomTensor(dt, m * n, rng);
      const HostTensor c0 = c;
      GemmArgs args{.a = a.data(),
                    .w = w.data(),
                    .c = c.data(),
                    .m = m,
                    .n = n,
                    .k = k,
                    .a_dtype = dt,
                    .w_dtype = dt,
                    .c_dtype = dt,
                    .accumulate = true,
                    .a_norm_weight = g.data(),
                    .a_norm_eps = 1e-5f};
      GemmRef(args);
      for (int64_t i = 0; i < m; ++i) {
        double ss = 0;
        for (int64_t kk = 0; kk < k; ++kk) ss += a.at(i * k + kk) * a.at(i * k + kk);
        const double inv_rms = 1.0 / std::sqrt(ss / k + 1e-5);
        for (int64_t j = 0; j < n; ++j) {
          double ref = c0.at(i * n + j), mag = std::abs(ref);
          for (int64_t kk = 0; kk < k; ++kk) {
            const double p = a.at(i * k + kk) * inv_rms * g.at(kk) * w.at(j * k + kk);
            ref += p;
            mag += std::abs(p);
          }
          double tol = 4e-6 * mag + 1e-6;
          if (dt == DType::kBF16) tol += 0.5 * Bf16Ulp(ref);
          ASSERT_NEAR(c.at(i * n + j), ref, tol) << "m=" << m << " (" << i << "," << j << ")";
        }
      }
    }
  }
}

}  // namespace
}  // namespace tandem
