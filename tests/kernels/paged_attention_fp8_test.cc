// CUDA paged attention over an FP8 cache (kernels/common/kv_layout.h: e4m3 codes + per-token fp32
// scales) against PagedAttentionRef over the same fp8 pages (which dequantizes exactly in fp32):
// decode (both fp8 decode kernels, Fp8DecodeKernel kDequant and kFused, the latter with the
// stream kernel's cp.async and TMA stages, DecodeCopies, on every decode case) and prefill
// paths, awkward page sizes (1, 3, 7, 16, 64; the TMA stages 8 to 512), head dims 64 / 128,
// contexts not a
// multiple of the page, GQA groups 1 / 4 / 8 (and 7), split and unsplit plans, several queries
// per sequence, magnitudes far from 1 (the fused kernel's power-of-two ranges), and a
// RopeKvStore -> decode pair with PDL. kDequant rounds each dequantized K/V value to bf16 once
// more, kFused rounds P x V scale to f16: the bound is the bf16 kernels' (attention_gpu_util.h).
// Unused rows of each sequence's last page hold NaN codes and NaN scales: they must not leak.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/kv_layout.h"
#include "kernels/paged_attention/stream_decode.h"
#include "kernels/quant_gemm/fp8_e4m3.h"
#include "kernels/rope_kv_store/rope_kv_store.h"
#include "tests/kernels/attention_gpu_util.h"

namespace tandem {
namespace {

using testing::AttentionBatch;
using testing::DeviceVector;
using testing::ExpectClose;
using testing::ExpectPlan;
using testing::LongAndShort;
using testing::MakeBatch;
using testing::RandomLens;
using testing::WantPlan;
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

// Powers of two applied to the bf16 batch before it is quantized (exact in bf16): q times
// 2^q_exp; each token's K row times 2^(k_exp + a random integer in [-k_spread, k_spread]) and its
// V row times 2^-(a random integer in [0, v_spread]).
struct Magnitudes {
  int q_exp = 0;
  int k_exp = 0;
  int k_spread = 0;
  int v_spread = 0;
};

void Rescale(const Magnitudes& m, std::mt19937& rng, AttentionBatch& b) {
  if (m.q_exp == 0 && m.k_exp == 0 && m.k_spread == 0 && m.v_spread == 0) return;
  for (auto& x : b.q) x = F32ToBf16(std::ldexp(Bf16ToF32(x), m.q_exp));
  const int64_t rows = static_cast<int64_t>(b.kv.size()) / b.head_dim;  // [page][K|V][head][slot]
  const int64_t rows_per_half = int64_t{b.num_kv_heads} * b.page_size;
  for (int64_t r = 0; r < rows; ++r) {
    const bool is_v = (r / rows_per_half) % 2 == 1;
    const int e = is_v ? -static_cast<int>(rng() % (m.v_spread + 1))
                       : m.k_exp + static_cast<int>(rng() % (2 * m.k_spread + 1)) - m.k_spread;
    for (int d = 0; d < b.head_dim; ++d) {
      uint16_t& x = b.kv[r * b.head_dim + d];
      x = F32ToBf16(std::ldexp(Bf16ToF32(x), e));  // NaN stays NaN
    }
  }
}

// PagedAttentionRef over the fp8 pages `kv8` of `b`, fp32 q and output.
std::vector<float> Fp8Reference(const AttentionBatch& b, const std::vector<uint8_t>& kv8) {
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
  return want;
}

// How RunFp8 launches a decode: through PagedAttentionDecode, or the stream kernel directly
// (whatever the plan), and what the plan must be.
struct DirectStream {
  bool on = false;
  WantPlan want = WantPlan::kUnsplit;
};

// One GPU run of `path` (decode: with fp8 decode kernel `kernel`, the stream kernel's stages
// filled by `copies`) on the fp8 pages; bf16 output.
std::vector<uint16_t> RunFp8(const AttentionBatch& b, const std::vector<uint8_t>& kv8, Path path,
                             Fp8DecodeKernel kernel, DirectStream direct = {},
                             DecodeCopies copies = DecodeCopies::kDefault) {
  testing::DeviceAttentionBatch dev(b);
  DeviceVector<uint8_t> d_kv(kv8);
  dev.args.kv_layer = d_kv.get();
  dev.args.kv_dtype = DType::kF8E4M3;
  dev.args.fp8_decode = kernel;
  dev.args.decode_copies = copies;
  auto plan = AttentionPlan::Create({});
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return {};
  absl::Status st;
  if (path == Path::kDecode) {
    EXPECT_TRUE((*plan)->BuildDecode(dev.shape, nullptr).ok());
    if (direct.on) {
      ExpectPlan(**plan, direct.want);
      st = attention::LaunchStreamDecode(dev.args, **plan, nullptr);
    } else {
      st = PagedAttentionDecode(dev.args, **plan, nullptr);
    }
  } else {
    EXPECT_TRUE((*plan)->BuildPrefill(dev.shape, nullptr).ok());
    st = PagedAttentionPrefill(dev.args, **plan, nullptr);
  }
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return dev.out.Download();
}

// The reference once, then the GPU: the prefill kernel, or each fp8 decode kernel of `kernels`.
void Check(const std::vector<int>& lens, const std::vector<int>& q_lens, int nq, int nkv, int d,
           int page_size, uint32_t seed, Path path, const Magnitudes& mag = {},
           const std::vector<Fp8DecodeKernel>& kernels = {Fp8DecodeKernel::kDequant,
                                                          Fp8DecodeKernel::kFused}) {
  SCOPED_TRACE(::testing::Message() << "nq " << nq << " nkv " << nkv << " d " << d << " page "
                                    << page_size << " seed " << seed);
  std::mt19937 rng(seed);
  AttentionBatch b = MakeBatch(lens, q_lens, nq, nkv, d, page_size, rng);
  Rescale(mag, rng, b);
  KvLayout layout;
  const std::vector<uint8_t> kv8 = ToFp8(b, &layout);
  const std::vector<float> want = Fp8Reference(b, kv8);
  if (path == Path::kPrefill) {
    ExpectClose(RunFp8(b, kv8, path, Fp8DecodeKernel::kDefault), want);
    return;
  }
  for (const Fp8DecodeKernel kernel : kernels) {
    SCOPED_TRACE(::testing::Message() << "fp8 decode kernel " << Fp8DecodeKernelName(kernel));
    ExpectClose(RunFp8(b, kv8, path, kernel), want);
    if (kernel == Fp8DecodeKernel::kFused) {  // the stream kernel's TMA stages too
      SCOPED_TRACE("TMA stages");
      ExpectClose(RunFp8(b, kv8, path, kernel, {}, DecodeCopies::kTma), want);
    }
  }
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

// The fused kernel's stream variant (stream_decode.h: one pipeline across a CTA's items)
// launched directly. PagedAttentionDecode gives it unsplit and balanced plans (the cuts'
// partials, the combine in its smaller merge buffer: 8 splits a round), but a CUDA graph
// captured with such a plan replays with whatever plan the next build makes, so it must be
// right on split plans too. Unsplit and balanced: many items per CTA of mixed lengths (1-key
// items, items shorter than the five-tile lead, so the producer runs several items ahead), more
// than 8 packed rows, the generic copies (pages 1, 7).
// Both stage fillings (DecodeCopies): cp.async and TMA (head_dim 128 and pages of 8+ keys; it
// runs the cp.async stages elsewhere).
void CheckStream(const std::vector<int>& lens, const std::vector<int>& q_lens, int nq, int nkv,
                 int d, int page_size, uint32_t seed, WantPlan want, const Magnitudes& mag = {}) {
  SCOPED_TRACE(::testing::Message() << "stream kernel, nq " << nq << " nkv " << nkv << " d " << d
                                    << " page " << page_size << " seed " << seed);
  std::mt19937 rng(seed);
  AttentionBatch b = MakeBatch(lens, q_lens, nq, nkv, d, page_size, rng);
  Rescale(mag, rng, b);
  KvLayout layout;
  const std::vector<uint8_t> kv8 = ToFp8(b, &layout);
  const std::vector<float> want_out = Fp8Reference(b, kv8);
  for (const DecodeCopies copies : {DecodeCopies::kCpAsync, DecodeCopies::kTma}) {
    SCOPED_TRACE(::testing::Message() << "copies " << DecodeCopiesName(copies));
    ExpectClose(RunFp8(b, kv8, Path::kDecode, Fp8DecodeKernel::kFused, {true, want}, copies),
                want_out);
  }
}

// Small shapes for compute-sanitizer (memcheck, racecheck): the fp8 decode kernels, split plans
// (one sequence, nkv 1) and unsplit ones (33 x 8 items fill the GPU: the stream kernel), the
// per-lane copies (page 16) and the generic ones (page 1), head dims 128 and 64; and the stream
// kernel (cp.async and TMA stages) on a split plan, a balanced one, and on pages of 8 and 128.
TEST(PagedAttentionFp8GpuTest, SmallForSanitizer) {
  TANDEM_SKIP_WITHOUT_GPU();
  Check({700}, {1}, 8, 1, 128, 16, 100, Path::kDecode);
  Check({333}, {2}, 8, 1, 64, 1, 101, Path::kDecode);
  Check(std::vector<int>(33, 300), std::vector<int>(33, 1), 32, 8, 128, 16, 102, Path::kDecode);
  CheckStream({700}, {1}, 8, 1, 128, 16, 103, WantPlan::kSplit);  // the stream kernel, split
  // One long sequence among many short ones: a balanced plan (cuts, merges, empty items).
  CheckStream(LongAndShort(1057, 384, 64), std::vector<int>(1057, 1), 4, 1, 128, 16, 104,
              WantPlan::kBalanced);
  // The TMA stages with several segments a tile (page 8) and inside one page (page 128).
  CheckStream(std::vector<int>(33, 150), std::vector<int>(33, 1), 32, 8, 128, 8, 105,
              WantPlan::kUnsplit);
  CheckStream(std::vector<int>(33, 201), std::vector<int>(33, 2), 32, 8, 128, 128, 106,
              WantPlan::kUnsplit);
}

// The fused kernel's TMA stages (tma_tile.cuh) on every page size they take: a tile made of 8, 4,
// 2 or 1 whole pages, or a quarter, half or eighth of one (128 / 256 / 512); every length mod
// the page (an item's last page copied whole, its rows past the keys NaN in these pools, so the
// tail-row zeroing must hold), 1-key items, several packed-row groups, balanced cuts and split
// plans, and magnitudes far from 1 (the running V exponent, which a stale scale would move).
TEST(PagedAttentionFp8GpuTest, StreamKernelTmaStagesOnEveryPageSize) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  const Magnitudes small_q{.q_exp = -20, .k_exp = 20, .k_spread = 3, .v_spread = 20};
  for (int page : {8, 16, 32, 64, 128, 256, 512}) {
    CheckStream(RandomLens(300, 1500, rng), std::vector<int>(300, 1), 32, 8, 128, page, 180 + page,
                WantPlan::kUnsplit);
    CheckStream(LongAndShort(100, 3000, 640), std::vector<int>(100, 1), 32, 8, 128, page,
                181 + page, WantPlan::kBalanced);
    CheckStream({1, 77, 1000, 4097}, {1, 1, 1, 1}, 32, 8, 128, page, 182 + page, WantPlan::kSplit);
    CheckStream(std::vector<int>(40, 3000 + page + 1), std::vector<int>(40, 1), 32, 8, 128, page,
                183 + page, WantPlan::kUnsplit, small_q);
  }
  // 20 packed rows (two row groups per sequence), causal among the 5 new tokens.
  std::vector<int> lens = RandomLens(200, 700, rng);
  for (int& len : lens) len += 4;
  CheckStream(lens, std::vector<int>(200, 5), 16, 4, 128, 16, 190, WantPlan::kUnsplit);
}

TEST(PagedAttentionFp8GpuTest, DecodeSeveralQueriesPerSequence) {
  // Speculative-decoding shapes: causal among the new tokens, so rows of one 16-row tile see
  // different key ranges (the in-tile mask), and more packed rows than one tile (20, 24).
  TANDEM_SKIP_WITHOUT_GPU();
  Check({40, 900, 5}, {3, 4, 5}, 32, 8, 128, 16, 80, Path::kDecode);  // g 4: 12, 16, 20 rows
  Check({2500, 63}, {2, 3}, 16, 2, 64, 64, 81, Path::kDecode);        // g 8: 16, 24 rows
  Check({700, 16}, {16, 16}, 4, 4, 128, 1, 82, Path::kDecode);        // g 1, page 1
}

TEST(PagedAttentionFp8GpuTest, DecodeMagnitudesFarFromOne) {
  // The fused kernel's f16 operands are brought into range by powers of two: q 2^20 below 1
  // (would be f16 subnormals), K rows 2^17..2^23 (scores of ordinary size), V rows down to
  // 2^-20 with the running V exponent rising and falling between tiles; and the other way.
  TANDEM_SKIP_WITHOUT_GPU();
  const Magnitudes small_q{.q_exp = -20, .k_exp = 20, .k_spread = 3, .v_spread = 20};
  const Magnitudes large_q{.q_exp = 12, .k_exp = -14, .k_spread = 2, .v_spread = 12};
  for (int page : {1, 16, 64}) {
    Check({5000}, {1}, 32, 8, 128, page, 90 + page, Path::kDecode, small_q);  // splits
    Check(std::vector<int>(40, 3000), std::vector<int>(40, 1), 32, 8, 128, page, 91 + page,
          Path::kDecode, small_q);  // no splits
    Check({1777, 9}, {1, 1}, 8, 1, 64, page, 92 + page, Path::kDecode, large_q);
  }
}

TEST(PagedAttentionFp8GpuTest, StreamKernelOnSplitUnsplitAndBalancedPlans) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  for (int page : {1, 7, 16, 64}) {
    CheckStream({32768}, {1}, 32, 8, 128, page, 110 + page, WantPlan::kSplit);  // many a merge
    CheckStream({1, 77, 1000, 4097}, {1, 1, 1, 1}, 32, 8, 128, page, 120 + page, WantPlan::kSplit);
    CheckStream({2500, 63}, {2, 3}, 16, 2, 64, page, 130 + page, WantPlan::kSplit);  // 16, 24 rows
    CheckStream(RandomLens(300, 900, rng), std::vector<int>(300, 1), 32, 8, 128, page, 140 + page,
                WantPlan::kUnsplit);
    CheckStream(RandomLens(700, 400, rng), std::vector<int>(700, 1), 16, 2, 64, page, 150 + page,
                WantPlan::kUnsplit);
    CheckStream(LongAndShort(100, 3000, 640), std::vector<int>(100, 1), 32, 8, 128, page,
                160 + page, WantPlan::kBalanced);
  }
  CheckStream(std::vector<int>(160, 2000), std::vector<int>(160, 3), 32, 8, 128, 16, 170,
              WantPlan::kUnsplit);
  // Balanced, 12 packed rows a sequence.
  CheckStream(LongAndShort(120, 2000, 600), std::vector<int>(120, 3), 32, 8, 128, 16, 171,
              WantPlan::kBalanced);
}

TEST(PagedAttentionFp8GpuTest, DecodeDefaultKernel) {
  // kDefault: TANDEM_FP8_DECODE if set, else kFp8DecodeBuiltin (whatever it is, it must work).
  TANDEM_SKIP_WITHOUT_GPU();
  Check({1, 77, 4097}, {1, 1, 1}, 32, 8, 128, 16, 95, Path::kDecode, {},
        {Fp8DecodeKernel::kDefault});
}

// A decode step's RopeKvStore -> PagedAttentionDecode pair on an fp8 cache, both fp8 decode
// kernels, with PDL and without, in stream order and replayed from a graph: the new tokens' code
// rows and scales hold NaN until RopeKvStore stores them, so a decode kernel that reads them
// before its dependency wait (the fused kernel's prologue is five tiles deep) fails, as does a
// mismatch against PagedAttentionRef over the producer's actual outputs.
TEST(PagedAttentionFp8GpuTest, DecodeAfterRopeKvStoreWithPdl) {
  TANDEM_SKIP_WITHOUT_GPU();
  struct Case {
    std::vector<int> lens, q_lens;
    int nq, nkv, d, page_size;
  };
  const std::vector<Case> cases = {{{8192}, {1}, 32, 8, 128, 16},
                                   {{300, 40, 1000, 65}, {3, 1, 4, 2}, 32, 8, 128, 64},
                                   {{2000, 129}, {1, 1}, 8, 2, 64, 32}};
  std::mt19937 rng(96);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const Case& c : cases) {
    AttentionBatch b = MakeBatch(c.lens, c.q_lens, c.nq, c.nkv, c.d, c.page_size, rng);
    KvLayout layout;
    std::vector<uint8_t> kv8 = ToFp8(b, &layout);
    const int heads = c.nq + 2 * c.nkv;
    const int64_t tokens = b.num_tokens();
    std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
    std::vector<uint16_t> qkv(tokens * heads * c.d);
    for (auto& x : qkv) x = F32ToBf16(uni(rng));
    std::vector<int32_t> positions, slots;
    const float nan = NAN;
    for (size_t s = 0; s < c.lens.size(); ++s) {
      for (int i = 0; i < c.q_lens[s]; ++i) {
        const int pos = c.lens[s] - c.q_lens[s] + i;
        positions.push_back(pos);
        slots.push_back(b.tables[s * b.max_pages + pos / c.page_size] * c.page_size +
                        pos % c.page_size);
        for (int kv = 0; kv < 2; ++kv) {  // the new token's codes and scales: NaN until stored
          for (int h = 0; h < c.nkv; ++h) {
            std::memset(&kv8[layout.SlotOffset(slots.back(), kv, h)], 0x7f, c.d);
            std::memcpy(&kv8[layout.ScaleOffset(slots.back(), kv, h)], &nan, 4);
          }
        }
      }
    }
    std::vector<float> inv_freq(c.d / 2);
    for (int i = 0; i < c.d / 2; ++i) inv_freq[i] = std::pow(1e6f, -2.0f * i / c.d);
    testing::DeviceAttentionBatch d(b);
    DeviceVector<uint8_t> d_kv(kv8), kv_init(kv8);
    DeviceVector<uint16_t> qkv_dev(qkv), qkv_init(qkv);
    DeviceVector<int32_t> d_positions(positions), d_slots(slots);
    DeviceVector<float> d_freq(inv_freq);
    RopeKvStoreArgs rope;
    rope.qkv = qkv_dev.get();
    rope.positions = d_positions.get();
    rope.slot_mapping = d_slots.get();
    rope.kv_layer = d_kv.get();
    rope.inv_freq = d_freq.get();
    rope.num_tokens = tokens;
    rope.num_q_heads = c.nq;
    rope.num_kv_heads = c.nkv;
    rope.head_dim = c.d;
    rope.page_size = c.page_size;
    rope.num_pages = layout.num_pages;
    rope.kv_dtype = DType::kF8E4M3;
    auto plan = AttentionPlan::Create({});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE((*plan)->BuildDecode(d.shape, stream).ok());
    const std::vector<uint16_t> nan_out(b.q.size(), testing::kNanBf16);
    for (const Fp8DecodeKernel kernel : {Fp8DecodeKernel::kDequant, Fp8DecodeKernel::kFused}) {
      for (bool pdl : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << "seqs " << c.lens.size() << " len0 " << c.lens[0] << " d " << c.d
                     << " kernel " << Fp8DecodeKernelName(kernel) << " pdl " << pdl);
        PagedAttentionArgs args = d.args;
        args.q = qkv_dev.get();
        args.q_stride = int64_t{heads} * c.d;
        args.kv_layer = d_kv.get();
        args.kv_dtype = DType::kF8E4M3;
        args.fp8_decode = kernel;
        args.overlap_launch = pdl;
        auto reset = [&] {
          ASSERT_EQ(
              cudaMemcpy(qkv_dev.get(), qkv_init.get(), qkv_init.bytes(), cudaMemcpyDeviceToDevice),
              cudaSuccess);
          ASSERT_EQ(
              cudaMemcpy(d_kv.get(), kv_init.get(), kv_init.bytes(), cudaMemcpyDeviceToDevice),
              cudaSuccess);
          ASSERT_EQ(
              cudaMemcpy(d.out.get(), nan_out.data(), nan_out.size() * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
        };
        auto enqueue = [&](cudaStream_t st) {
          ASSERT_TRUE(RopeKvStore(rope, st).ok());
          ASSERT_TRUE(PagedAttentionDecode(args, **plan, st).ok());
        };
        auto check = [&](const char* label) {
          SCOPED_TRACE(label);
          AttentionBatch actual = b;  // the producer's outputs: rotated q, stored codes/scales
          const std::vector<uint8_t> stored = d_kv.Download();
          const std::vector<uint16_t> rotated = qkv_dev.Download();
          for (int64_t t = 0; t < tokens; ++t) {
            std::copy_n(&rotated[t * heads * c.d], c.nq * c.d, &actual.q[t * c.nq * c.d]);
          }
          ExpectClose(d.out.Download(), Fp8Reference(actual, stored));
        };
        testing::RunInStreamAndGraph(stream, reset, enqueue, check, 2);
      }
    }
  }
  cudaStreamDestroy(stream);
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
