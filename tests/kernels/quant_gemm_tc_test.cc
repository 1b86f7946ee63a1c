// QuantGemmTc (CUDA, the mixed-input tensor-core GEMM) against QuantGemmRef: INT8 per channel and
// per 128-group, UINT4 group 128 with zero points 0..16 and with none (symmetric 8), a partial
// last group, m = 1 .. 64 (every token tile, partial ones), n not a multiple of the 32-row block
// or the 16-row mma tile, bias, accumulate into random c, plain and PDL launches; outputs start as
// NaN so a missed write fails, and a second run must give the same bits (fixed reduction order).
// Split-K across blocks (WORKLOG.md step 8): every call gets a workspace, so the automatic plan
// splits where it would in the engine, and split counts forced through QuantGemmArgs::tc_splits
// (2, 3, 4, 8: partial last splits, and more splits than groups) run at m = 1..64 on the same
// awkward shapes; each asserts the plan really split, that two runs and two CUDA graph replays
// give the same bits (summation in split order, whatever block arrives last; counters reset by
// each call, or a replay stores nothing and the NaN poison fails it), and that the counters end
// at zero. QuantGemv (the tensor-core GEMV for m <= 8) on the same checks: GemvMatchesReference
// and GemvManyTilesAndLlamaRows. Skips without a device. Refusals need no device.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/quant_gemm/quant_gemm.h"
#include "tests/kernels/cuda_test_util.h"

namespace tandem {
namespace {

using testing::DeviceBuffer;

struct Shape {
  QuantCode code;
  int64_t m, n, k, group;
  bool zeros, bias, accumulate, pdl;
  int splits = 0;  // QuantGemmArgs::tc_splits: 0 the automatic plan
  // QuantGemv (the tensor-core GEMV) instead of QuantGemmTc, at QuantGemmArgs::gemv_depth.
  bool gemv = false;
  int depth = 0;
  bool tc16 = false;  // the GEMV on QuantLayout::kTc16 codes (repacked on the device)
};

// A workspace for any plan of n rows at m <= 64 (counters zeroed).
struct Workspace {
  explicit Workspace(int64_t n)
      : partials(kQuantTcMaxSplits * QuantTcRowTiles(n) * kQuantTcBlockRows * kQuantTcMaxM * 4),
        counters(QuantTcRowTiles(n) * 4) {
    EXPECT_EQ(cudaMemset(counters.get(), 0, QuantTcRowTiles(n) * 4), cudaSuccess);
  }
  QuantTcWorkspace Get(int64_t n) const {
    return {
        .partials = partials.as<float>(),
        .partial_floats = kQuantTcMaxSplits * QuantTcRowTiles(n) * kQuantTcBlockRows * kQuantTcMaxM,
        .counters = counters.as<uint32_t>(),
        .num_counters = QuantTcRowTiles(n)};
  }
  std::vector<uint32_t> Counters(int64_t n) const {
    std::vector<uint32_t> out(QuantTcRowTiles(n));
    counters.Download(out.data());
    return out;
  }
  DeviceBuffer partials, counters;
};

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = F32ToBf16(v[i]);
  return out;
}

void Check(const Shape& s) {
  SCOPED_TRACE(::testing::Message()
               << "code " << static_cast<int>(s.code) << " m " << s.m << " n " << s.n << " k "
               << s.k << " group " << s.group << " zeros " << s.zeros << " bias " << s.bias
               << " accumulate " << s.accumulate << " pdl " << s.pdl);
  std::mt19937 rng(static_cast<uint32_t>(s.m * 7 + s.n * 131 + s.k * 3 + s.group));
  const int64_t groups = QuantNumGroups(s.k, s.group);
  std::vector<uint8_t> codes(s.n * QuantRowBytes(s.code, s.k)), zeros(s.zeros ? s.n * groups : 0);
  for (auto& b : codes) b = static_cast<uint8_t>(rng());
  for (auto& z : zeros) z = static_cast<uint8_t>(rng() % 17);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.005f, 0.05f);
  std::vector<float> scales(s.n * groups), a(s.m * s.k), bias(s.n), c0(s.m * s.n);
  for (auto& x : scales) x = pos(rng);
  for (auto& x : a) x = u(rng);
  for (auto& x : bias) x = u(rng);
  for (auto& x : c0) x = u(rng);
  const std::vector<uint16_t> a_h = ToBf16(a), bias_h = ToBf16(bias), c0_h = ToBf16(c0);
  std::vector<uint16_t> want = c0_h;
  QuantGemmArgs args{.a = a_h.data(),
                     .bias = s.bias ? bias_h.data() : nullptr,
                     .c = want.data(),
                     .m = s.m,
                     .n = s.n,
                     .k = s.k,
                     .a_dtype = DType::kBF16,
                     .c_dtype = DType::kBF16,
                     .accumulate = s.accumulate,
                     .code = s.code,
                     .w = codes.data(),
                     .scales = scales.data(),
                     .zeros = s.zeros ? zeros.data() : nullptr,
                     .group_size = s.group};
  QuantGemmRef(args);

  DeviceBuffer da(a_h), dbias(bias_h), dw(codes), dscales(scales),
      dzeros(std::max<size_t>(zeros.size(), 1)), dc(c0_h.size() * 2);
  if (!zeros.empty()) dzeros.Upload(zeros.data());
  QuantGemmArgs d = args;
  d.a = da.get();
  d.bias = s.bias ? dbias.get() : nullptr;
  d.c = dc.get();
  d.w = dw.as<uint8_t>();
  d.scales = dscales.as<float>();
  d.zeros = s.zeros ? dzeros.as<uint8_t>() : nullptr;
  d.overlap_launch = s.pdl;
  Workspace ws(s.n);
  d.tc_workspace = ws.Get(s.n);
  d.tc_splits = s.splits;
  d.gemv_depth = s.depth;
  // kTc16: the host's layout (QuantTc16Offset, the definition) must equal the device repack's
  // bytes, and the GEMV then reads the repacked buffer.
  DeviceBuffer dtiled(s.tc16 ? QuantTc16Bytes(s.code, s.n, s.k) : 16);
  if (s.tc16) {
    const int64_t row_bytes = QuantRowBytes(s.code, s.k);
    std::vector<uint8_t> want_tiled(QuantTc16Bytes(s.code, s.n, s.k), 0);
    for (int64_t j = 0; j < s.n; ++j) {
      for (int64_t b = 0; b < row_bytes; ++b) {
        want_tiled[QuantTc16Offset(s.code, s.k, j, b)] = codes[j * row_bytes + b];
      }
    }
    dtiled.Poison();
    const absl::Status repacked = QuantRepackTc16(d, dtiled.as<uint8_t>(), nullptr);
    ASSERT_TRUE(repacked.ok()) << repacked;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> got_tiled(want_tiled.size());
    dtiled.Download(got_tiled.data());
    ASSERT_EQ(got_tiled, want_tiled) << "QuantRepackTc16 differs from QuantTc16Offset";
    d.w = dtiled.as<uint8_t>();
    d.layout = QuantLayout::kTc16;
  }
  if (!s.tc16) {
    ASSERT_TRUE(QuantGemmTcCovers(d).ok()) << QuantGemmTcCovers(d);
  }
  if (s.gemv) {
    ASSERT_TRUE(QuantGemvCovers(d).ok()) << QuantGemvCovers(d);
  }
  auto run = [&](cudaStream_t stream) {
    return s.gemv ? QuantGemv(d, stream) : QuantGemmTc(d, stream);
  };
  const int64_t chunks = s.k / QuantGemmTcChunkK(s.code);
  const QuantTcSplitPlan plan = s.gemv ? QuantTcSplitPlan{1, chunks} : QuantGemmTcPlan(d);
  const int64_t units = s.group == s.k ? chunks : QuantNumGroups(s.k, s.group);
  if (s.splits > 1 && units > 1) {  // the hook must really split (a missed split fails here)
    ASSERT_GT(plan.splits, 1);
    ASSERT_LE(plan.splits, s.splits);
  }
  ASSERT_LE(plan.chunks_per_split * (plan.splits - 1), chunks - 1);  // no empty split
  ASSERT_GE(plan.chunks_per_split * plan.splits, chunks);            // no chunk left out
  SCOPED_TRACE(::testing::Message() << "splits " << plan.splits << " of " << plan.chunks_per_split
                                    << " chunks; gemv " << s.gemv << " depth " << s.depth);
  auto reset_c = [&] {
    if (s.accumulate) {
      dc.Upload(c0_h.data());
    } else {
      dc.Poison();
    }
  };
  std::vector<uint16_t> runs[2];
  for (std::vector<uint16_t>& got : runs) {
    reset_c();
    const absl::Status st = run(nullptr);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    got.resize(c0_h.size());
    dc.Download(got.data());
  }
  ASSERT_EQ(std::memcmp(runs[0].data(), runs[1].data(), runs[0].size() * 2), 0)
      << "two runs differ";
  if (plan.splits > 1 || s.gemv) {
    for (uint32_t counter : ws.Counters(s.n)) ASSERT_EQ(counter, 0u) << "a counter not reset";
    // Captured once, replayed twice: the same bits each time.
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status captured = run(stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(captured.ok()) << captured;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 2; ++replay) {
      reset_c();
      // The reset is on the legacy stream, which a non-blocking stream does not wait for (a
      // pageable upload may still be in flight when cudaMemcpy returns).
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      std::vector<uint16_t> got(c0_h.size());
      dc.Download(got.data());
      ASSERT_EQ(std::memcmp(got.data(), runs[0].data(), got.size() * 2), 0)
          << "graph replay " << replay << " differs from the eager run";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
    for (uint32_t counter : ws.Counters(s.n)) ASSERT_EQ(counter, 0u) << "a counter not reset";
  }
  for (int64_t i = 0; i < s.m * s.n; ++i) {
    const float g = Bf16ToF32(runs[0][i]), w = Bf16ToF32(want[i]);
    // fp32 sums of k products in another order; the bf16 output may round to a neighbour.
    const float tol = 1e-4f * std::sqrt(static_cast<float>(s.k)) + 8e-3f * std::fabs(w) + 1e-5f;
    ASSERT_TRUE(std::isfinite(g)) << "element " << i << " (token " << i / s.n << ", row " << i % s.n
                                  << ")";
    ASSERT_NEAR(g, w, tol) << "element " << i << " (token " << i / s.n << ", row " << i % s.n
                           << ")";
  }
}

TEST(QuantGemmTcTest, Int8PerChannelMatchesReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int64_t m : {1, 5, 7, 8, 9, 16, 17, 33, 63, 64}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{1, 64}, {200, 64}, {200, 448}, {37, 1024}}) {
      Check({QuantCode::kInt8, m, n, k, k, false, m % 2 == 1, m % 3 == 0, (m + n) % 2 == 0});
    }
  }
  // Llama-sized rows, n = 4100 (a partial 32-row block with a partial 16-row tile).
  for (int64_t m : {5, 33, 64}) {
    Check({QuantCode::kInt8, m, 4100, 4096, 4096, false, m == 5, m == 33, m == 64});
  }
}

TEST(QuantGemmTcTest, Int8GroupedMatchesReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  // Group 128 over k = 448: three full groups and a partial one of 64; group 64 = one chunk.
  for (int64_t m : {1, 8, 9, 63}) {
    Check({QuantCode::kInt8, m, 200, 448, 128, false, true, m == 9, m == 8});
    Check({QuantCode::kInt8, m, 77, 640, 64, false, false, true, false});
  }
}

TEST(QuantGemmTcTest, Uint4MatchesReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (bool zeros : {true, false}) {
    for (int64_t m : {1, 5, 7, 8, 9, 33, 63, 64}) {
      for (auto [n, k] : {std::pair<int64_t, int64_t>{200, 128}, {200, 4096}, {45, 1152}}) {
        Check({QuantCode::kUint4, m, n, k, 128, zeros, m % 2 == 0, m % 3 == 0, m % 4 == 1});
      }
      // Group 256 over k = 640: a partial last group of 128; and one scale per row (group k).
      Check({QuantCode::kUint4, m, 131, 640, 256, zeros, true, m == 33, false});
      Check({QuantCode::kUint4, m, 131, 512, 512, zeros, false, false, m == 7});
    }
    for (int64_t m : {5, 64}) {
      Check({QuantCode::kUint4, m, 4100, 4096, 128, zeros, m == 5, m == 64, m == 64});
    }
  }
}

// Forced splits over the shapes above: int8 per channel (k = 448: 7 chunks, so 8 splits come out
// as 7 of one chunk; k = 1024: 3 splits of 6, 6 and 4 chunks), int8 per 128-group with a partial
// last group (k = 448, group 128: 4 groups of which the last has one chunk) and per 64-group,
// uint4 group 128 / 256 with and without zero points; n not a multiple of 32 or 16.
TEST(QuantGemmTcTest, SplitKMatchesReferenceAndIsDeterministic) {
  TANDEM_SKIP_WITHOUT_GPU();
  int i = 0;
  for (int64_t m : {1, 2, 3, 4, 5, 8, 33, 64}) {
    for (int splits : {2, 3, 4, 8}) {
      const bool odd = (i++ % 2) == 1;
      Check({QuantCode::kInt8, m, 200, 448, 448, false, odd, !odd, odd, splits});
      Check({QuantCode::kInt8, m, 37, 1024, 1024, false, !odd, odd, !odd, splits});
      Check({QuantCode::kInt8, m, 200, 448, 128, false, true, odd, !odd, splits});
      Check({QuantCode::kInt8, m, 77, 640, 64, false, false, true, odd, splits});
      Check({QuantCode::kUint4, m, 45, 1152, 128, true, odd, !odd, odd, splits});
      Check({QuantCode::kUint4, m, 131, 640, 256, false, true, odd, !odd, splits});
      Check({QuantCode::kUint4, m, 200, 4096, 128, odd, !odd, true, odd, splits});
    }
  }
}

// Llama-sized n = 4100 (129 row tiles: fewer than 2 per SM on any H100 / H200) with the
// automatic plan, which must split there at m = 1..16 (2 blocks fit an SM), and forced splits.
TEST(QuantGemmTcTest, SplitKOnLlamaRows) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int64_t m : {1, 4, 8, 16, 33, 64}) {
    for (int splits : {0, 3}) {
      Check({QuantCode::kInt8, m, 4100, 4096, 4096, false, m == 1, m == 8, m == 4, splits});
      Check({QuantCode::kUint4, m, 4100, 4096, 128, m == 4, m == 16, m == 1, m == 64, splits});
    }
  }
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  if (QuantTcRowTiles(4100) < 2 * sms) {
    Workspace ws(4100);
    alignas(16) static uint8_t dummy[16];
    for (int64_t m : {1, 8}) {
      QuantGemmArgs a{.a = dummy,
                      .m = m,
                      .n = 4100,
                      .k = 4096,
                      .a_dtype = DType::kBF16,
                      .c_dtype = DType::kBF16,
                      .code = QuantCode::kInt8,
                      .w = dummy,
                      .group_size = 4096};
      a.tc_workspace = ws.Get(4100);
      EXPECT_GT(QuantGemmTcPlan(a).splits, 1) << "m " << m;
      // The engine's workspace size covers the plan.
      EXPECT_GE(
          QuantGemmTcWorkspaceFloats(a, kQuantTcMaxM),
          QuantTcPartialFloats(QuantTcSplitShape{.n = 4100, .m_tile = 8}, QuantGemmTcPlan(a)));
      a.tc_workspace = {};
      EXPECT_EQ(QuantGemmTcPlan(a).splits, 1) << "no workspace: unsplit";
    }
  }
}

// QuantGemv (the tensor-core GEMV, WORKLOG.md step 10) at m = 1..8 and every ring depth (0 is the
// default, 8): int8 per channel (k = 64: one chunk, so three of the four warps have none; k = 448:
// 7 chunks, not a multiple of the warps) and per 128- / 64-group, uint4 group 128 / 256 / whole
// row with and without zero points, n not a multiple of the 16-row tile, bias, accumulate, PDL.
// Every shape also replays a CUDA graph twice (bitwise equal to the eager run).
TEST(QuantGemmTcTest, GemvMatchesReference) {
  TANDEM_SKIP_WITHOUT_GPU();
  int i = 0;
  for (int64_t m : {1, 2, 3, 5, 8}) {
    for (int depth : {0, 2, 4}) {
      const bool odd = (i++ % 2) == 1;
      auto gemv = [&](QuantCode code, int64_t n, int64_t k, int64_t group, bool zeros, bool bias,
                      bool accumulate) {
        Check({code, m, n, k, group, zeros, bias, accumulate, odd, 0, true, depth});
        Check({code, m, n, k, group, zeros, !bias, accumulate, !odd, 0, true, depth, true});
      };
      gemv(QuantCode::kInt8, 200, 448, 448, false, odd, !odd);
      gemv(QuantCode::kInt8, 37, 1024, 1024, false, !odd, odd);
      gemv(QuantCode::kInt8, 1, 64, 64, false, true, false);
      gemv(QuantCode::kInt8, 200, 448, 128, false, true, odd);
      gemv(QuantCode::kInt8, 77, 640, 64, false, false, true);
      gemv(QuantCode::kUint4, 200, 128, 128, odd, odd, !odd);
      gemv(QuantCode::kUint4, 45, 1152, 128, !odd, !odd, odd);
      gemv(QuantCode::kUint4, 131, 640, 256, odd, true, false);
      gemv(QuantCode::kUint4, 131, 512, 512, !odd, false, true);
    }
  }
}

// Persistent blocks that own several tiles (far more 16-row tiles than blocks fit the device, so
// the ring runs across tile boundaries), and Llama-sized rows (n = 4100: a partial last tile).
TEST(QuantGemmTcTest, GemvManyTilesAndLlamaRows) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int64_t m : {1, 4, 8}) {
    for (int depth : {0, 2}) {
      Check({QuantCode::kInt8, m, 40003, 320, 320, false, m == 4, m == 1, m == 1, 0, true, depth});
      Check({QuantCode::kInt8, m, 4100, 4096, 4096, false, m == 1, m == 8, m == 4, 0, true, depth});
      Check(
          {QuantCode::kUint4, m, 4100, 4096, 128, m == 4, m == 8, m == 1, m == 8, 0, true, depth});
      for (bool tc16 : {false, true}) {
        Check({QuantCode::kUint4, m, 40000, 256, 128, m != 4, m == 1, m == 8, m == 4, 0, true,
               depth, tc16});
      }
      Check({QuantCode::kInt8, m, 40003, 320, 320, false, m == 4, m == 1, m == 1, 0, true, depth,
             true});
      Check({QuantCode::kInt8, m, 4100, 4096, 4096, false, m == 1, m == 8, m == 4, 0, true, depth,
             true});
      Check({QuantCode::kUint4, m, 4100, 4096, 128, m == 4, m == 8, m == 1, m == 8, 0, true, depth,
             true});
    }
  }
}

TEST(QuantGemmTcTest, GemvRefusesWhatItDoesNotCover) {
  alignas(16) static uint8_t w[64 * 128];
  alignas(16) static uint16_t act[64 * 128];
  float scales[64] = {};
  const QuantGemmArgs ok{.a = act,
                         .m = 1,
                         .n = 7,
                         .k = 128,
                         .a_dtype = DType::kBF16,
                         .c_dtype = DType::kBF16,
                         .code = QuantCode::kUint4,
                         .w = w,
                         .scales = scales,
                         .group_size = 128};
  auto refused = [](QuantGemmArgs a) {
    return QuantGemvCovers(a).code() == absl::StatusCode::kInvalidArgument &&
           QuantGemv(a, nullptr).code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(QuantGemvCovers(ok).ok());
  QuantGemmArgs a = ok;
  a.m = kQuantGemvMaxM;
  EXPECT_TRUE(QuantGemvCovers(a).ok());
  for (int64_t m : {int64_t{0}, kQuantGemvMaxM + 1}) {
    a.m = m;
    EXPECT_TRUE(refused(a)) << "m " << m;
  }
  for (int depth : {1, 3, 16}) {
    a = ok;
    a.gemv_depth = depth;
    EXPECT_TRUE(refused(a)) << "depth " << depth;
  }
  a = ok;
  a.code = QuantCode::kFp8E4M3;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.k = 64;  // uint4 chunks are 128 wide
  a.group_size = 64;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.c_dtype = DType::kF32;
  EXPECT_TRUE(refused(a));
  // kTc16 codes: the GEMV's alone; the other kernels refuse them.
  a = ok;
  a.layout = QuantLayout::kTc16;
  EXPECT_TRUE(QuantGemvCovers(a).ok());
  EXPECT_EQ(QuantGemmTcCovers(a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantGemmSkinnyCovers(a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(QuantDequantize(a, w, DType::kBF16, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  a = ok;
  a.k = 64;  // not a multiple of uint4's chunk: no kTc16 layout
  EXPECT_EQ(QuantRepackTc16(a, w, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// The kTc16 layout's definition: tile-major 1 KB chunk blocks, 512 bytes per row half.
TEST(QuantGemmTcTest, Tc16OffsetsTileTheRows) {
  // uint4 k = 256: 128 bytes a row, 2 chunks.
  EXPECT_EQ(QuantTc16Bytes(QuantCode::kUint4, 17, 256), 2 * 16 * 128);
  EXPECT_EQ(QuantTc16Offset(QuantCode::kUint4, 256, 0, 0), 0);
  EXPECT_EQ(QuantTc16Offset(QuantCode::kUint4, 256, 0, 16), 16);        // t = 1: the next lane
  EXPECT_EQ(QuantTc16Offset(QuantCode::kUint4, 256, 1, 0), 64);         // g = 1: lane 4
  EXPECT_EQ(QuantTc16Offset(QuantCode::kUint4, 256, 8, 0), 512);        // h = 1
  EXPECT_EQ(QuantTc16Offset(QuantCode::kUint4, 256, 0, 64), 1024);      // chunk 1
  EXPECT_EQ(QuantTc16Offset(QuantCode::kUint4, 256, 16, 5), 2048 + 5);  // tile 1
  EXPECT_EQ(QuantTc16Offset(QuantCode::kInt8, 128, 15, 127), 1024 + 512 + 16 * 31 + 15);
}

TEST(QuantGemmTcTest, RefusesWhatItDoesNotCover) {
  alignas(16) static uint8_t w[64 * 128];
  alignas(16) static uint16_t act[64 * 128];
  float scales[64] = {};
  const QuantGemmArgs ok{.a = act,
                         .m = 5,
                         .n = 7,
                         .k = 128,
                         .a_dtype = DType::kBF16,
                         .c_dtype = DType::kBF16,
                         .code = QuantCode::kInt8,
                         .w = w,
                         .scales = scales,
                         .group_size = 128};
  auto refused = [](QuantGemmArgs a) {
    return QuantGemmTcCovers(a).code() == absl::StatusCode::kInvalidArgument &&
           QuantGemmTc(a, nullptr).code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(QuantGemmTcCovers(ok).ok());
  QuantGemmArgs a = ok;
  a.code = QuantCode::kUint4;
  EXPECT_TRUE(QuantGemmTcCovers(a).ok());
  a.zeros = w;
  EXPECT_TRUE(QuantGemmTcCovers(a).ok());
  a.k = 64;  // uint4 chunks are 128 wide
  a.group_size = 64;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.zeros = w;  // zero points are for uint4 only
  EXPECT_TRUE(refused(a));
  a = ok;
  a.code = QuantCode::kFp8E4M3;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.act_quant = ActQuant::kFp8PerToken;
  EXPECT_TRUE(refused(a));
  for (int64_t m : {int64_t{0}, kQuantTcMaxM + 1}) {
    a = ok;
    a.m = m;
    EXPECT_TRUE(refused(a)) << "m " << m;
  }
  a = ok;
  a.m = kQuantTcMaxM;
  EXPECT_TRUE(QuantGemmTcCovers(a).ok());
  a = ok;
  a.k = 96;  // not a multiple of the 64-wide int8 chunk
  a.group_size = 96;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.k = 256;
  a.group_size = 96;  // neither k nor a multiple of the chunk
  EXPECT_TRUE(refused(a));
  a.group_size = 64;
  EXPECT_TRUE(QuantGemmTcCovers(a).ok());
  a = ok;
  a.w = w + 1;
  EXPECT_TRUE(refused(a));
  a = ok;
  a.a = act + 4;  // activations are read 16 bytes at a time
  EXPECT_TRUE(refused(a));
  a = ok;
  a.a_dtype = a.c_dtype = DType::kF32;
  EXPECT_TRUE(refused(a));
  // Forced splits without room for them: refused before any launch (covered otherwise).
  a = ok;
  a.k = a.group_size = 1024;
  a.tc_splits = 4;
  EXPECT_TRUE(QuantGemmTcCovers(a).ok());
  EXPECT_EQ(QuantGemmTc(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
