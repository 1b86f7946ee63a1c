// CudaOps with TANDEM_FUSED_ACT_QUANT (engine/cuda/fused_act_quant.h) at the Ops seam (label
// gpu; skips without a device). A GEMM given the norm (GemmArgs::a_norm_weight) on an FP8 W8A8
// weight runs the fused RMSNorm + e4m3 quantization, then the cuBLASLt FP8 GEMM:
//   - bitwise the output of RmsNorm into a buffer followed by the plain FP8 GEMM on it, per
//     token and per 128-group, at m = 5, 6 and 37 (m % 4 != 0: the tail GEMM);
//   - never on stale codes: the codes live in the GEMM's scratch only inside the one Gemm() call
//     that writes them, so after the residual changes (a copy into it, or another GEMM that
//     fills the same scratch with other activations in between) the next fused GEMM is again
//     bitwise the unfused result on the new contents, and different from the old one;
//   - Ops::FusesNormIntoGemm says so only above the skinny kernel's 4 rows and after
//     ReserveStep (the fallback scratch); a bad TANDEM_FUSED_ACT_QUANT value fails the backend.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "engine/cuda/cuda_device.h"
#include "engine/model/ops.h"
#include "engine/model/quant_weight.h"
#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "tests/engine/cuda_skip.h"

namespace tandem {
namespace {

std::vector<uint16_t> RandomBf16(int64_t n, std::mt19937& rng, float mag) {
  std::uniform_real_distribution<float> u(-mag, mag);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = F32ToBf16(u(rng));
  return v;
}

HostTensor Fp8Weight(int64_t n, int64_t k, ActQuant act, std::mt19937& rng) {
  auto w = std::make_shared<QuantizedWeight>();
  w->code = QuantCode::kFp8E4M3;
  w->n = n;
  w->k = k;
  w->group_size = act == ActQuant::kFp8PerToken ? k : 128;
  w->act_quant = act;
  w->codes.resize(n * k);
  for (auto& b : w->codes) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
  }
  std::uniform_real_distribution<float> s(0.001f, 0.01f);
  w->scales.resize(n * w->num_groups());
  for (auto& x : w->scales) x = s(rng);
  if (act == ActQuant::kFp8PerTokenGroup) {  // 128x128 blocks: one scale per block
    const int64_t g = w->num_groups();
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t b = 0; b < g; ++b) w->scales[j * g + b] = w->scales[j / 128 * 128 * g + b];
    }
  }
  HostTensor t;
  t.dtype = DType::kBF16;
  t.shape = {n, k};
  t.quant = w;
  return t;
}

class Env {
 public:
  Env(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~Env() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(CudaOpsFusedActQuantTest, BadSwitchValueFailsTheBackend) {
  SKIP_WITHOUT_GPU();
  Env env("TANDEM_FUSED_ACT_QUANT", "yes");
  absl::StatusOr<std::unique_ptr<Ops>> ops = MakeCudaOps();
  EXPECT_TRUE(absl::IsInvalidArgument(ops.status())) << ops.status();
}

TEST(CudaOpsFusedActQuantTest, FusedGemmIsTheUnfusedOpsAndNeverStale) {
  SKIP_WITHOUT_GPU();
  Env lt("TANDEM_FP8_LT", "require");
  Env fused("TANDEM_FUSED_ACT_QUANT", "require");
  for (ActQuant act : {ActQuant::kFp8PerToken, ActQuant::kFp8PerTokenGroup}) {
    SCOPED_TRACE(act == ActQuant::kFp8PerToken ? "per token" : "per 128-group");
    absl::StatusOr<std::unique_ptr<Ops>> made = MakeCudaOps();
    ASSERT_TRUE(made.ok()) << made.status();
    Ops& ops = **made;
    constexpr int64_t kN = 256, kN2 = 384, kK = 1024, kMaxM = 64;
    std::mt19937 rng(static_cast<uint32_t>(act) + 11);
    absl::StatusOr<const void*> w = ops.AdoptWeight(Fp8Weight(kN, kK, act, rng));
    absl::StatusOr<const void*> w2 = ops.AdoptWeight(Fp8Weight(kN2, kK, act, rng));
    ASSERT_TRUE(w.ok() && w2.ok());
    HostTensor g{DType::kBF16, {kK}, {}};
    const std::vector<uint16_t> g_host = RandomBf16(kK, rng, 2.0f);
    g.bytes.resize(kK * 2);
    std::memcpy(g.bytes.data(), g_host.data(), kK * 2);
    absl::StatusOr<const void*> gamma = ops.AdoptWeight(std::move(g));
    ASSERT_TRUE(gamma.ok());
    EXPECT_FALSE(ops.FusesNormIntoGemm(37)) << "before ReserveStep: no fallback scratch";
    ASSERT_TRUE(ops.ReserveStep(StepCapacity{.max_tokens = kMaxM,
                                             .max_seqs = kMaxM,
                                             .max_pages_per_seq = 1,
                                             .num_q_heads = 1,
                                             .num_kv_heads = 1})
                    .ok());
    EXPECT_FALSE(ops.FusesNormIntoGemm(4));
    EXPECT_TRUE(ops.FusesNormIntoGemm(5));
    EXPECT_TRUE(ops.FusesNormIntoGemm(kMaxM));
    auto buffer = [&](int id, int64_t bytes) {
      absl::StatusOr<void*> b = ops.Buffer(id, bytes);
      EXPECT_TRUE(b.ok()) << b.status();
      return b.ok() ? *b : nullptr;
    };
    void* residual = buffer(0, kMaxM * kK * 2);
    void* hidden = buffer(1, kMaxM * kK * 2);
    void* other = buffer(2, kMaxM * kK * 2);
    void* c_fused = buffer(3, kMaxM * kN2 * 2);
    void* c_plain = buffer(4, kMaxM * kN2 * 2);
    ASSERT_NE(c_plain, nullptr);
    auto gemm = [&](const void* a, const void* wt, void* c, int64_t m, int64_t n, bool norm) {
      GemmArgs args{.a = a, .w = wt, .c = c, .m = m, .n = n, .k = kK};
      if (norm) {
        args.a_norm_weight = *gamma;
        args.a_norm_eps = 1e-5f;
      }
      return ops.Gemm(args);
    };
    auto download = [&](const void* c, int64_t elems) {
      std::vector<uint16_t> h(elems);
      EXPECT_TRUE(ops.CopyToHost(h.data(), c, elems * 2).ok());
      return h;
    };
    // The unfused ops on the residual's current contents: RmsNorm into `hidden`, the GEMM.
    auto unfused = [&](int64_t m) {
      EXPECT_TRUE(ops.RmsNorm(RmsNormArgs{.input = residual,
                                          .weight = *gamma,
                                          .out = hidden,
                                          .num_rows = m,
                                          .hidden = kK,
                                          .eps = 1e-5f,
                                          .dtype = DType::kBF16})
                      .ok());
      EXPECT_TRUE(gemm(hidden, *w, c_plain, m, kN, false).ok());
      return download(c_plain, m * kN);
    };
    for (int64_t m : {5, 6, 37}) {
      SCOPED_TRACE(m);
      const std::vector<uint16_t> r1 = RandomBf16(m * kK, rng, 1.0f);
      const std::vector<uint16_t> r2 = RandomBf16(m * kK, rng, 4.0f);
      const std::vector<uint16_t> x = RandomBf16(m * kK, rng, 8.0f);
      ASSERT_TRUE(ops.CopyToDevice(residual, r1.data(), m * kK * 2).ok());
      ASSERT_TRUE(ops.CopyToDevice(other, x.data(), m * kK * 2).ok());
      absl::Status st = gemm(residual, *w, c_fused, m, kN, true);
      ASSERT_TRUE(st.ok()) << st;
      const std::vector<uint16_t> fused1 = download(c_fused, m * kN);
      const std::vector<uint16_t> want1 = unfused(m);
      ASSERT_EQ(fused1, want1) << "fused != RmsNorm + FP8 GEMM";
      // New residual contents, straight into the same buffer: the next fused GEMM sees them.
      ASSERT_TRUE(ops.CopyToDevice(residual, r2.data(), m * kK * 2).ok());
      ASSERT_TRUE(gemm(residual, *w, c_fused, m, kN, true).ok());
      const std::vector<uint16_t> fused2 = download(c_fused, m * kN);
      ASSERT_NE(fused2, fused1) << "the second fused GEMM repeated the first one's result";
      ASSERT_EQ(fused2, unfused(m));
      // Another FP8 GEMM fills the shared scratch with other activations in between; then the
      // residual changes back: the fused GEMM is r1's result again.
      ASSERT_TRUE(gemm(other, *w2, c_plain, m, kN2, false).ok());
      ASSERT_TRUE(ops.CopyToDevice(residual, r1.data(), m * kK * 2).ok());
      ASSERT_TRUE(gemm(residual, *w, c_fused, m, kN, true).ok());
      ASSERT_EQ(download(c_fused, m * kN), want1);
      // A fused GEMM on the other weight straight after one on the first (no op between).
      ASSERT_TRUE(gemm(residual, *w2, c_fused, m, kN2, true).ok());
      const std::vector<uint16_t> fused_w2 = download(c_fused, m * kN2);
      ASSERT_TRUE(ops.RmsNorm(RmsNormArgs{.input = residual,
                                          .weight = *gamma,
                                          .out = hidden,
                                          .num_rows = m,
                                          .hidden = kK,
                                          .eps = 1e-5f,
                                          .dtype = DType::kBF16})
                      .ok());
      ASSERT_TRUE(gemm(hidden, *w2, c_plain, m, kN2, false).ok());
      ASSERT_EQ(fused_w2, download(c_plain, m * kN2));
    }
  }
}

}  // namespace
}  // namespace tandem
