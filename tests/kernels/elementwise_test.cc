// CUDA Embedding, RmsNorm and SiluMul against their CPU references.
#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/embedding/embedding.h"
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

// |got - want| <= ulps bf16 ulps (bf16) or a relative 1e-5 (f32); NaN fails.
void ExpectClose(const HostTensor& got, const HostTensor& want, double ulps, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (int64_t i = 0; i < got.size(); ++i) {
    const double g = got.at(i), w = want.at(i);
    ASSERT_FALSE(std::isnan(g)) << what << " at " << i;
    const double tol = got.dtype == DType::kBF16 ? ulps * Bf16Ulp(w) : 1e-5 * std::abs(w) + 1e-6;
    ASSERT_NEAR(g, w, tol) << what << " at " << i;
  }
}

TEST(EmbeddingCudaTest, GathersRowsAndZeroesBadIds) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(1);
  for (DType t : {DType::kBF16, DType::kF32}) {
    for (int64_t hidden : {4096, 19, 8}) {
      for (int64_t tokens : {1, 17, 255}) {
        const int64_t vocab = 1001;
        HostTensor table = RandomTensor(t, vocab * hidden, rng);
        std::vector<int32_t> ids(tokens);
        for (auto& id : ids) id = static_cast<int32_t>(rng() % vocab);
        ids[0] = vocab - 1;
        HostTensor want(t, tokens * hidden), got(t, tokens * hidden);
        EmbeddingArgs args{.token_ids = ids.data(),
                           .table = table.data(),
                           .out = want.data(),
                           .num_tokens = tokens,
                           .vocab_size = vocab,
                           .hidden = hidden,
                           .dtype = t};
        EmbeddingRef(args);
        DeviceBuffer dids(ids), dtable(table.bytes), dout(got.bytes.size());
        dtable.Upload(table.data());
        dout.Poison();
        args.token_ids = dids.as<int32_t>(), args.table = dtable.get(), args.out = dout.get();
        ASSERT_TRUE(Embedding(args, nullptr).ok());
        dout.Download(got.data());
        ASSERT_EQ(got.bytes, want.bytes) << "hidden " << hidden << " tokens " << tokens;
      }
    }
  }
  // An out-of-range id gives a zero row, not a fault.
  std::vector<int32_t> bad = {5, -1};
  std::vector<float> table(10 * 8, 1.0f);
  DeviceBuffer dids(bad), dtable(table), dout(2 * 8 * sizeof(float));
  ASSERT_TRUE(Embedding({.token_ids = dids.as<int32_t>(),
                         .table = dtable.get(),
                         .out = dout.get(),
                         .num_tokens = 2,
                         .vocab_size = 10,
                         .hidden = 8,
                         .dtype = DType::kF32},
                        nullptr)
                  .ok());
  std::vector<float> out(16);
  dout.Download(out.data());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[8], 0.0f);
}

void CheckRmsNorm(DType t, int64_t rows, int64_t hidden, int64_t stride, bool residual,
                  bool in_place, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "rows=" << rows << " hidden=" << hidden
                                    << " stride=" << stride << " residual=" << residual);
  std::mt19937_64 rng(seed);
  HostTensor input = RandomTensor(t, rows * stride, rng, -3.0f, 3.0f);
  HostTensor res = RandomTensor(t, rows * hidden, rng, -3.0f, 3.0f);
  HostTensor weight = RandomTensor(t, hidden, rng, 0.5f, 1.5f);
  HostTensor out = RandomTensor(t, rows * stride, rng);
  DeviceBuffer din(input.bytes.size()), dres(res.bytes.size()), dw(weight.bytes.size()),
      dout(out.bytes.size());
  din.Upload(input.data());
  dres.Upload(res.data());
  dw.Upload(weight.data());
  dout.Upload(out.data());
  RmsNormArgs args{.input = input.data(),
                   .residual = residual ? res.data() : nullptr,
                   .weight = weight.data(),
                   .out = in_place ? input.data() : out.data(),
                   .num_rows = rows,
                   .hidden = hidden,
                   .input_stride = stride,
                   .out_stride = stride,
                   .eps = 1e-6f,
                   .dtype = t};
  RmsNormRef(args);
  args.input = din.get(), args.residual = residual ? dres.get() : nullptr;
  args.weight = dw.get(), args.out = in_place ? din.get() : dout.get();
  ASSERT_TRUE(RmsNorm(args, nullptr).ok());
  HostTensor got_out(t, rows * stride), got_res(t, rows * hidden);
  (in_place ? din : dout).Download(got_out.data());
  dres.Download(got_res.data());
  ExpectClose(got_out, in_place ? input : out, 2, "out");
  if (residual) ExpectClose(got_res, res, 0, "residual");
}

TEST(RmsNormCudaTest, FastAndGenericPaths) {
  TANDEM_SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (int64_t rows : {1, 3, 17, 255}) {
    CheckRmsNorm(DType::kBF16, rows, 4096, 4096, true, false, seed++);   // block per row
    CheckRmsNorm(DType::kBF16, rows, 5120, 5120, false, false, seed++);  // ragged vectors
    CheckRmsNorm(DType::kBF16, rows, 128, 1024, false, true, seed++);    // QK-norm in place
    CheckRmsNorm(DType::kBF16, rows, 1000, 1000, true, false, seed++);   // warp per row
    CheckRmsNorm(DType::kBF16, rows, 100, 100, true, false, seed++);     // generic (unaligned)
    CheckRmsNorm(DType::kBF16, rows, 8200, 8200, true, false, seed++);   // generic (too long)
    CheckRmsNorm(DType::kF32, rows, 333, 400, true, false, seed++);      // generic f32
  }
}

TEST(SiluMulCudaTest, FastAndGenericPaths) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(3);
  for (DType t : {DType::kBF16, DType::kF32}) {
    for (int64_t inter : {1376, 77, 8}) {
      for (int64_t tokens : {1, 17, 255}) {
        HostTensor gu = RandomTensor(t, tokens * 2 * inter, rng, -8.0f, 8.0f);
        HostTensor want(t, tokens * inter), got(t, tokens * inter);
        SiluMulArgs args{.gate_up = gu.data(),
                         .out = want.data(),
                         .num_tokens = tokens,
                         .intermediate = inter,
                         .dtype = t};
        SiluMulRef(args);
        DeviceBuffer din(gu.bytes.size()), dout(got.bytes.size());
        din.Upload(gu.data());
        dout.Poison();
        args.gate_up = din.get(), args.out = dout.get();
        ASSERT_TRUE(SiluMul(args, nullptr).ok());
        dout.Download(got.data());
        ExpectClose(got, want, 2, "silu_mul");
      }
    }
  }
}

}  // namespace
}  // namespace tandem
