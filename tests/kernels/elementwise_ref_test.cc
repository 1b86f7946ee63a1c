// EmbeddingRef, RmsNormRef and SiluMulRef against naive double-precision computations.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/embedding/embedding.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/silu_mul/silu_mul.h"
#include "tests/kernels/kernel_test_util.h"

namespace tandem {
namespace {

using testing::Bf16Ulp;
using testing::HostTensor;
using testing::RandomTensor;

TEST(EmbeddingRefTest, GathersRowsBitExact) {
  std::mt19937_64 rng(3);
  for (DType t : {DType::kF32, DType::kBF16}) {
    const int64_t vocab = 37, hidden = 19, tokens = 23;
    HostTensor table = RandomTensor(t, vocab * hidden, rng);
    HostTensor out = RandomTensor(t, tokens * hidden, rng);
    std::vector<int32_t> ids(tokens);
    for (int64_t i = 0; i < tokens; ++i) ids[i] = static_cast<int32_t>((i * 11 + 5) % vocab);
    ids[0] = 0;
    ids[1] = vocab - 1;
    EmbeddingRef({.token_ids = ids.data(),
                  .table = table.data(),
                  .out = out.data(),
                  .num_tokens = tokens,
                  .vocab_size = vocab,
                  .hidden = hidden,
                  .dtype = t});
    for (int64_t i = 0; i < tokens; ++i) {
      for (int64_t j = 0; j < hidden; ++j) {
        ASSERT_EQ(out.at(i * hidden + j), table.at(ids[i] * hidden + j)) << i << "," << j;
      }
    }
  }
}

// Naive RMSNorm of one row in double; rounds where the reference documents a bf16 tensor op.
std::vector<double> NaiveRmsNormRow(const std::vector<double>& x, const HostTensor& weight,
                                    double eps, DType t) {
  double sum_sq = 0.0;
  for (double v : x) sum_sq += v * v;
  const double inv = 1.0 / std::sqrt(sum_sq / x.size() + eps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double normed =
        t == DType::kBF16 ? RoundToBf16(static_cast<float>(x[i] * inv)) : x[i] * inv;
    out[i] = normed * weight.at(i);
  }
  return out;
}

void CheckRmsNorm(DType t, int64_t rows, int64_t hidden, int64_t stride, bool residual,
                  bool in_place) {
  std::mt19937_64 rng(rows * 131 + hidden);
  HostTensor input = RandomTensor(t, rows * stride, rng, -2.0f, 2.0f);
  HostTensor res = RandomTensor(t, rows * hidden, rng, -2.0f, 2.0f);
  HostTensor weight = RandomTensor(t, hidden, rng, 0.5f, 1.5f);
  HostTensor out = RandomTensor(t, rows * stride, rng);
  const HostTensor input0 = input, res0 = res, out0 = out;
  RmsNormArgs args{.input = input.data(),
                   .residual = residual ? res.data() : nullptr,
                   .weight = weight.data(),
                   .out = in_place ? input.data() : out.data(),
                   .num_rows = rows,
                   .hidden = hidden,
                   .input_stride = stride,
                   .out_stride = stride,
                   .eps = 1e-5f,
                   .dtype = t};
  RmsNormRef(args);
  const HostTensor& got = in_place ? input : out;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> x(hidden);
    for (int64_t i = 0; i < hidden; ++i) {
      x[i] = input0.at(r * stride + i);
      if (residual) {
        x[i] += res0.at(r * hidden + i);
        if (t == DType::kBF16) x[i] = RoundToBf16(static_cast<float>(x[i]));
        ASSERT_NEAR(res.at(r * hidden + i), x[i], 1e-6 * std::abs(x[i])) << "residual " << r;
      }
    }
    const std::vector<double> want = NaiveRmsNormRow(x, weight, 1e-5, t);
    for (int64_t i = 0; i < hidden; ++i) {
      const double tol = t == DType::kBF16 ? 2 * Bf16Ulp(want[i]) : 1e-5 * std::abs(want[i]) + 1e-6;
      ASSERT_NEAR(got.at(r * stride + i), want[i], tol) << "row " << r << " col " << i;
    }
    // Elements between rows (stride > hidden) are untouched.
    for (int64_t i = hidden; i < stride; ++i) {
      ASSERT_EQ(got.at(r * stride + i), (in_place ? input0 : out0).at(r * stride + i));
    }
  }
}

TEST(RmsNormRefTest, PlainFusedResidualStridedAndInPlace) {
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t rows : {1, 7, 19}) {
      CheckRmsNorm(t, rows, 64, 64, /*residual=*/false, /*in_place=*/false);
      CheckRmsNorm(t, rows, 111, 111, /*residual=*/true, /*in_place=*/false);
      // QK-norm: per-head slices of 32 inside rows of 128, normalised in place.
      CheckRmsNorm(t, rows, 32, 128, /*residual=*/false, /*in_place=*/true);
    }
  }
}

TEST(SiluMulRefTest, MatchesNaive) {
  std::mt19937_64 rng(5);
  for (DType t : {DType::kF32, DType::kBF16}) {
    const int64_t tokens = 13, inter = 77;
    HostTensor gu = RandomTensor(t, tokens * 2 * inter, rng, -6.0f, 6.0f);
    HostTensor out = RandomTensor(t, tokens * inter, rng);
    SiluMulRef({.gate_up = gu.data(),
                .out = out.data(),
                .num_tokens = tokens,
                .intermediate = inter,
                .dtype = t});
    for (int64_t r = 0; r < tokens; ++r) {
      for (int64_t i = 0; i < inter; ++i) {
        const double g = gu.at(r * 2 * inter + i), u = gu.at(r * 2 * inter + inter + i);
        const double want = g / (1.0 + std::exp(-g)) * u;
        const double tol = t == DType::kBF16 ? 2 * Bf16Ulp(want) : 1e-6 * std::abs(want) + 1e-7;
        ASSERT_NEAR(out.at(r * inter + i), want, tol) << r << "," << i;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
