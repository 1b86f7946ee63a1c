// CUDA paged attention over an FP8 cache (kernels/common/kv_layout.h: e4m3 codes + per-token fp32
// scales) against PagedAttentionRef over the same fp8 pages (which dequantizes exactly in fp32):
// decode and prefill paths, awkward page sizes (1, 3, 7, 16, 64), head dims 64 / 128, contexts
// not a multiple of the page, GQA groups 1 / 4 / 8 (and 7). The GPU rounds each dequantized
// K/V value to bf16 once more, so the bound is the bf16 kernels' (attention_gpu_util.h). Unused
// rows of each sequence's last page hold NaN codes and NaN scales: they must not leak.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/kv_layout.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "tests/kernels/attention_gpu_util.h"

namespace tandem {
namespace {

using testing::AttentionBatch;
using testing::DeviceVector;
using testing::ExpectClose;
using testing::MakeBatch;
using Path = testing::AttentionPath;

// The bf16 batch's pages quantized as RopeKvStoreRef stores them; NaN rows (unwritten slots)
// become NaN codes with a NaN scale.
std::vector<uint8_t> ToFp8(const AttentionBatch& b, KvLayout* layout) {
  const int64_t page_elems = int64_t{2} * b.num_kv_heads * b.page_size * b.head_dim;
  *layout = KvLayout{1,           static_cast<int>(b.kv.size() / page_elems),
                     b.page_size, b.num_kv_heads,
                     b.head_dim,  DType::kF8E4M3};
  std::vector<uint8_t> out(layout->LayerBytes(), 0);
  KvLayout bf = *layout;
  bf.dtype = DType::kBF16;
  for (int64_t slot = 0; slot < int64_t{layout->num_pages} * b.page_size; ++slot) {
    for (int kv = 0; kv < 2; ++kv) {
      for (int h = 0; h < b.num_kv_heads; ++h) {
        const uint16_t* row = &b.kv[bf.SlotOffset(slot, kv, h)];
        uint8_t* codes = &out[layout->SlotOffset(slot, kv, h)];
        float amax = 0.0f, scale;
        bool nan = false;
        for (int d = 0; d < b.head_dim; ++d) {
          const float x = Bf16ToF32(row[d]);
          nan |= std::isnan(x);
          amax = std::max(amax, std::fabs(x));
        }
        if (nan) {
          scale = NAN;
          std::memset(codes, 0x7f, b.head_dim);
        } else {
          scale = amax / kFp8E4M3Max;
          for (int d = 0; d < b.head_dim; ++d) {
            codes[d] = amax == 0.0f ? 0 : F32ToFp8E4M3(Bf16ToF32(row[d]) / scale);
          }
        }
        std::memcpy(&out[layout->ScaleOffset(slot, kv, h)], &scale, 4);
      }
    }
  }
  return out;
}

void Check(const std::vector<int>& lens, const std::vector<int>& q_lens, int nq, int nkv, int d,
           int page_size, uint32_t seed, Path path) {
  SCOPED_TRACE(::testing::Message() << "nq " << nq << " nkv " << nkv << " d " << d << " page "
                                    << page_size << " seed " << seed);
  std::mt19937 rng(seed);
  const AttentionBatch b = MakeBatch(lens, q_lens, nq, nkv, d, page_size, rng);
  KvLayout layout;
  const std::vector<uint8_t> kv8 = ToFp8(b, &layout);
  // Reference: fp32 q, the fp8 pages.
  std::vector<float> q(b.q.size()), want(b.q.size());
  for (size_t i = 0; i < q.size(); ++i) q[i] = Bf16ToF32(b.q[i]);
  PagedAttentionArgs r = testing::ArgsFor(b);
  r.q = q.data();
  r.out = want.data();
  r.kv_layer = kv8.data();
  r.block_tables = b.tables.data();
  r.seq_lens = b.seq_lens.data();
  r.query_start = b.query_start.data();
  r.dtype = DType::kF32;
  r.kv_dtype = DType::kF8E4M3;
  PagedAttentionRef(r);
  // GPU.
  testing::DeviceAttentionBatch dev(b);
  DeviceVector<uint8_t> d_kv(kv8);
  dev.args.kv_layer = d_kv.get();
  dev.args.kv_dtype = DType::kF8E4M3;
  auto plan = AttentionPlan::Create({});
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::Status st;
  if (path == Path::kDecode) {
    ASSERT_TRUE((*plan)->BuildDecode(dev.shape, nullptr).ok());
    st = PagedAttentionDecode(dev.args, **plan, nullptr);
  } else {
    ASSERT_TRUE((*plan)->BuildPrefill(dev.shape, nullptr).ok());
    st = PagedAttentionPrefill(dev.args, **plan, nullptr);
  }
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectClose(dev.out.Download(), want);
}

std::vector<int> RandomLens(int n, int max_len, std::mt19937& rng) {
  std::vector<int> v(n);
  for (int& x : v) x = 1 + static_cast<int>(rng() % max_len);
  return v;
}

TEST(PagedAttentionFp8GpuTest, DecodeAwkwardShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  for (int page : {1, 3, 7, 16, 64}) {
    Check({1, 77, 1000, 4097}, {1, 1, 1, 1}, 32, 8, 128, page, 10 + page, Path::kDecode);  // g 4
    Check({3001, 5}, {1, 1}, 8, 1, 64, page, 20 + page, Path::kDecode);                    // g 8
    Check({999}, {1}, 4, 4, 128, page, 30 + page, Path::kDecode);                          // g 1
  }
  Check(RandomLens(33, 5000, rng), std::vector<int>(33, 1), 28, 4, 128, 16, 2, Path::kDecode);
  Check({32768}, {1}, 32, 8, 128, 16, 3, Path::kDecode);  // many splits, combine
  Check(std::vector<int>(64, 4100), std::vector<int>(64, 1), 32, 8, 128, 16, 4, Path::kDecode);
}

TEST(PagedAttentionFp8GpuTest, PrefillChunksOverCachedPages) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int page : {1, 7, 16, 64}) {
    Check({1, 17, 300}, {1, 5, 70}, 8, 2, 128, page, 40 + page, Path::kPrefill);
    Check({200, 31}, {200, 9}, 28, 4, 128, page, 50 + page, Path::kPrefill);
    Check({300, 70}, {2, 70}, 32, 4, 64, page, 60 + page, Path::kPrefill);
    Check({513}, {129}, 8, 8, 64, page, 70 + page, Path::kPrefill);
  }
}

}  // namespace
}  // namespace tandem
