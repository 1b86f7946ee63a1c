// A decode step's producer -> GEMM pairs under programmatic dependent launch: RMSNorm and SiLU-mul
// release their dependents at their start (kernels/common/pdl.cuh) and the skinny GEMM after them
// is PDL-launched, so it starts while its producer is still running. A GEMM that read its input
// before its dependency wait would read the poisoned (NaN) buffer or a half-written one; a
// producer (a plain launch) that started before the GEMM ahead of it finished would read a
// poisoned or partial GEMM output. Each step is checked against the CPU references applied to the
// step's actual device input, in stream order and as a replayed CUDA graph.
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/silu_mul/silu_mul.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/kernel_test_util.h"

namespace tandem {
namespace {

using testing::Bf16Ulp;
using testing::DeviceBuffer;
using testing::HostTensor;
using testing::RandomTensor;

enum class Producer { kRmsNorm, kSiluMul };

// steps x (producer -> GEMM). kRmsNorm: g[i] [m, k] -> fused residual-add RMSNorm (residual r[i])
// -> x[i] [m, k] -> GEMM k -> k -> g[i + 1]. kSiluMul: g[i] [m, 2k] -> SiluMul -> x[i] [m, k] ->
// GEMM k -> 2k -> g[i + 1]. m = 1 goes through Gemm() with its default launch (PDL on); other m
// through GemmSkinny with overlap_launch set.
class ProducerGemmChain {
 public:
  ProducerGemmChain(Producer p, int64_t m, int64_t k, int steps, uint64_t seed)
      : p_(p), m_(m), k_(k), g_width_(p == Producer::kSiluMul ? 2 * k : k), steps_(steps) {
    std::mt19937_64 rng(seed);
    const float s = std::sqrt(3.0f / static_cast<float>(k));  // keeps |g| ~ |x| along the chain
    g0_ = RandomTensor(DType::kBF16, m * g_width_, rng);
    norm_weight_ = RandomTensor(DType::kBF16, k, rng, 0.5f, 1.5f);
    d_norm_weight_ = std::make_unique<DeviceBuffer>(norm_weight_.bytes.size());
    d_norm_weight_->Upload(norm_weight_.data());
    for (int i = 0; i < steps; ++i) {
      w_.push_back(RandomTensor(DType::kBF16, g_width_ * k, rng, -s, s));
      r0_.push_back(RandomTensor(DType::kBF16, m * k, rng));
      dw_.push_back(std::make_unique<DeviceBuffer>(w_.back().bytes.size()));
      dw_.back()->Upload(w_.back().data());
      dr_.push_back(std::make_unique<DeviceBuffer>(m * k * 2));
      dx_.push_back(std::make_unique<DeviceBuffer>(m * k * 2));
    }
    for (int i = 0; i <= steps; ++i)
      dg_.push_back(std::make_unique<DeviceBuffer>(m * g_width_ * 2));
  }

  void Enqueue(cudaStream_t stream) const {
    for (int i = 0; i < steps_; ++i) {
      if (p_ == Producer::kRmsNorm) {
        ASSERT_TRUE(RmsNorm({.input = dg_[i]->get(),
                             .residual = dr_[i]->get(),
                             .weight = d_norm_weight_->get(),
                             .out = dx_[i]->get(),
                             .num_rows = m_,
                             .hidden = k_},
                            stream)
                        .ok());
      } else {
        ASSERT_TRUE(SiluMul({.gate_up = dg_[i]->get(),
                             .out = dx_[i]->get(),
                             .num_tokens = m_,
                             .intermediate = k_},
                            stream)
                        .ok());
      }
      GemmArgs args{.a = dx_[i]->get(),
                    .w = dw_[i]->get(),
                    .c = dg_[i + 1]->get(),
                    .m = m_,
                    .n = g_width_,
                    .k = k_};
      if (m_ == 1) {
        ASSERT_TRUE(Gemm(args, stream).ok()) << "step " << i;
      } else {
        args.overlap_launch = true;
        ASSERT_TRUE(GemmSkinny(args, stream).ok()) << "step " << i;
      }
    }
  }

  // Fresh inputs and residuals, NaN in every buffer the chain writes.
  void Reset() const {
    dg_[0]->Upload(g0_.data());
    for (int i = 0; i < steps_; ++i) {
      dr_[i]->Upload(r0_[i].data());
      dx_[i]->Poison();
      dg_[i + 1]->Poison();
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  void CheckSteps() const {
    for (int i = 0; i < steps_; ++i) {
      SCOPED_TRACE(::testing::Message() << "producer " << static_cast<int>(p_) << " m=" << m_
                                        << " k=" << k_ << " step " << i);
      HostTensor g(DType::kBF16, m_ * g_width_), x(DType::kBF16, m_ * k_);
      HostTensor out(DType::kBF16, m_ * g_width_);
      dg_[i]->Download(g.data());
      dx_[i]->Download(x.data());
      dg_[i + 1]->Download(out.data());
      // The producer against its reference on the input the GEMM before it actually wrote.
      HostTensor want_x(DType::kBF16, m_ * k_);
      if (p_ == Producer::kRmsNorm) {
        HostTensor res = r0_[i], got_res(DType::kBF16, m_ * k_);
        dr_[i]->Download(got_res.data());
        RmsNormRef({.input = g.data(),
                    .residual = res.data(),
                    .weight = norm_weight_.data(),
                    .out = want_x.data(),
                    .num_rows = m_,
                    .hidden = k_});
        for (int64_t j = 0; j < m_ * k_; ++j) {
          ASSERT_FALSE(std::isnan(got_res.at(j))) << "residual at " << j;
          ASSERT_EQ(got_res.at(j), res.at(j)) << "residual at " << j;
        }
      } else {
        SiluMulRef(
            {.gate_up = g.data(), .out = want_x.data(), .num_tokens = m_, .intermediate = k_});
      }
      for (int64_t j = 0; j < m_ * k_; ++j) {
        ASSERT_FALSE(std::isnan(x.at(j))) << "producer output at " << j;
        ASSERT_NEAR(x.at(j), want_x.at(j), 2 * Bf16Ulp(want_x.at(j))) << "producer output at " << j;
      }
      // The GEMM against GemmRef on the producer's actual output.
      HostTensor want(DType::kBF16, m_ * g_width_);
      GemmRef(
          {.a = x.data(), .w = w_[i].data(), .c = want.data(), .m = m_, .n = g_width_, .k = k_});
      const double w_max = std::sqrt(3.0 / static_cast<double>(k_));
      for (int64_t row = 0; row < m_; ++row) {
        double sum_abs_a = 0;  // sum |a| max |w| bounds the summation-order difference
        for (int64_t kk = 0; kk < k_; ++kk) sum_abs_a += std::abs(x.at(row * k_ + kk));
        for (int64_t col = 0; col < g_width_; ++col) {
          const double got = out.at(row * g_width_ + col), r = want.at(row * g_width_ + col);
          ASSERT_FALSE(std::isnan(got)) << "GEMM output at (" << row << "," << col << ")";
          ASSERT_NEAR(got, r, 1e-5 * w_max * sum_abs_a + Bf16Ulp(r))
              << "GEMM output at (" << row << "," << col << ")";
        }
      }
    }
  }

 private:
  Producer p_;
  int64_t m_, k_, g_width_;
  int steps_;
  HostTensor g0_{DType::kBF16, 0}, norm_weight_{DType::kBF16, 0};
  std::vector<HostTensor> w_, r0_;
  std::unique_ptr<DeviceBuffer> d_norm_weight_;
  std::vector<std::unique_ptr<DeviceBuffer>> dw_, dr_, dx_, dg_;
};

TEST(PdlChainTest, ProducersReleaseEarlyAndPdlGemmsWait) {
  TANDEM_SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct Shape {
    Producer p;
    int64_t m, k;
    int steps;
  };
  // k = 4096: the model's hidden size (RMSNorm's block-per-row kernel); 1032: a warp per row and a
  // partial last vector tile; m = 3: several rows per producer and the 2-row GEMM tile.
  const Shape shapes[] = {{Producer::kRmsNorm, 1, 4096, 5},
                          {Producer::kRmsNorm, 3, 1032, 4},
                          {Producer::kSiluMul, 1, 4096, 4},
                          {Producer::kSiluMul, 3, 1032, 4}};
  uint64_t seed = 1200;
  for (const Shape& sh : shapes) {
    ProducerGemmChain chain(sh.p, sh.m, sh.k, sh.steps, seed++);
    ASSERT_NO_FATAL_FAILURE(testing::RunInStreamAndGraph(
        stream, [&] { chain.Reset(); }, [&](cudaStream_t s) { chain.Enqueue(s); },
        [&](const char* run) {
          SCOPED_TRACE(run);
          chain.CheckSteps();
        }));
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tandem
