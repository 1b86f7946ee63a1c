// CUDA paged attention (decode and prefill) against PagedAttentionRef on awkward batches:
// batch 1, 3, 17, 255; lengths 1, 15, 16, 17, 1000, 32k; ragged; chunked-prefill positions;
// page sizes 2..128 (powers of two, and 24; the stream kernel's TMA stages 8..512); head_dim 64 and
// 128; GQA groups 1..8; empty batch;
// CUDA-graph replay of a rebuilt plan. The output is poisoned with NaN first, so an unwritten
// element fails, and the cache slots past each sequence hold NaN, so a key read beyond a sequence
// fails too.
#include "kernels/paged_attention/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/paged_attention/stream_decode.h"
#include "kernels/rope_kv_store/rope_kv_store.h"
#include "tests/kernels/attention_gpu_util.h"

namespace tandem {
namespace {

using testing::AttentionBatch;
using testing::DeviceAttentionBatch;
using testing::DeviceVector;
using testing::ExpectClose;
using testing::ExpectPlan;
using testing::kNanBf16;
using testing::LongAndShort;
using testing::MakeBatch;
using testing::RandomLens;
using testing::Reference;
using testing::RunGpu;
using testing::WantPlan;

using Path = testing::AttentionPath;

// bf16 operands and a bf16 output: relative L2 error well under 1e-2, every element written.
// Decode runs twice: the stream kernel's stages filled by cp.async and by TMA (DecodeCopies;
// TMA where head_dim is 128 and pages are powers of two >= 8, cp.async elsewhere).
void Check(const std::vector<int>& lens, const std::vector<int>& q_lens, int nq, int nkv, int d,
           int page_size, uint32_t seed, Path path) {
  std::mt19937 rng(seed);
  const AttentionBatch b = MakeBatch(lens, q_lens, nq, nkv, d, page_size, rng);
  const std::vector<float> want = Reference(b);
  ExpectClose(RunGpu(b, path, DecodeCopies::kCpAsync), want);
  if (path == Path::kDecode) {
    SCOPED_TRACE("TMA stages");
    ExpectClose(RunGpu(b, path, DecodeCopies::kTma), want);
  }
}

// Small shapes for compute-sanitizer (memcheck, racecheck) runs: both paths, both head dims, and
// a plan without merges (33 x 8 items: the stream kernel) and a balanced one (one long sequence
// among many short ones: cut between CTAs, merges, empty items).
TEST(PagedAttentionGpuTest, SmallBothPaths) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (Path path : {Path::kDecode, Path::kPrefill}) {
    Check({1, 17, 300}, {1, 5, 70}, 8, 2, 128, 16, 31, path);
    Check({40, 9}, {40, 2}, 4, 1, 64, 32, 32, path);
  }
  Check(std::vector<int>(33, 300), std::vector<int>(33, 1), 32, 8, 128, 16, 33, Path::kDecode);
  Check(LongAndShort(1057, 384, 64), std::vector<int>(1057, 1), 4, 1, 64, 16, 34, Path::kDecode);
}

TEST(PagedAttentionGpuTest, DecodeAwkwardLengths) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int len : {1, 15, 16, 17, 1000}) {
    SCOPED_TRACE(len);
    Check({len}, {1}, 32, 8, 128, 16, len, Path::kDecode);
  }
}

// Page sizes around the decode copies' block-table read (one entry per lane, one tile ahead):
// 4 and 8 tokens (17 and 9 pages per 64-key tile), and pages the generic copy takes (2 tokens:
// more pages per tile than lanes; 24: not a power of two); lengths that end inside a page and
// inside a tile, with and without splits, both head dims.
TEST(PagedAttentionGpuTest, DecodeSmallAndOddPageSizes) {
  TANDEM_SKIP_WITHOUT_GPU();
  for (int page : {2, 4, 8, 24}) {
    SCOPED_TRACE(page);
    Check({1, 77, 1000, 5001}, {1, 1, 1, 1}, 32, 8, 128, page, 70 + page, Path::kDecode);
    Check({3001}, {1}, 8, 1, 64, page, 100 + page, Path::kDecode);
  }
}

TEST(PagedAttentionGpuTest, DecodeRaggedBatches) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  Check({1, 17, 1000}, {1, 1, 1}, 32, 8, 128, 32, 1, Path::kDecode);
  Check(RandomLens(17, 3000, rng), std::vector<int>(17, 1), 32, 8, 128, 64, 2, Path::kDecode);
  Check(RandomLens(255, 700, rng), std::vector<int>(255, 1), 32, 8, 128, 16, 3, Path::kDecode);
  Check(RandomLens(17, 2000, rng), std::vector<int>(17, 1), 8, 1, 64, 128, 4, Path::kDecode);
  Check(RandomLens(3, 500, rng), std::vector<int>(3, 1), 4, 4, 64, 16, 5, Path::kDecode);
}

TEST(PagedAttentionGpuTest, OddAndWideGqaGroups) {
  // Group 7 (Qwen2.5-7B: 28 q / 4 KV heads) puts token boundaries inside the 16-row tiles;
  // groups 16 and 32 fill one and two tiles per token.
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(41);
  for (Path path : {Path::kDecode, Path::kPrefill}) {
    Check(RandomLens(9, 1500, rng), std::vector<int>(9, 1), 28, 4, 128, 16, 42, path);
    Check({200, 31}, {200, 9}, 28, 4, 128, 32, 43, path);
    Check(RandomLens(5, 900, rng), std::vector<int>(5, 1), 16, 1, 64, 16, 44, path);
    Check({300, 70}, {2, 70}, 32, 1, 128, 64, 45, path);
  }
}

TEST(PagedAttentionGpuTest, DecodeLongContext32k) {
  TANDEM_SKIP_WITHOUT_GPU();
  Check({32768, 20000}, {1, 1}, 32, 8, 128, 64, 8, Path::kDecode);
}

// The small-batch decode shapes of the benchmark (many splits per KV head, merged by the last
// CTA): batch 1 at 8k and 32k keys, batch 8 at 4k, pages of 16 and 64.
TEST(PagedAttentionGpuTest, DecodeSmallBatchManySplits) {
  TANDEM_SKIP_WITHOUT_GPU();
  Check({8192}, {1}, 32, 8, 128, 16, 51, Path::kDecode);
  Check({8192}, {1}, 32, 8, 128, 64, 52, Path::kDecode);
  Check({32768}, {1}, 32, 8, 128, 16, 53, Path::kDecode);
  Check(std::vector<int>(8, 4096), std::vector<int>(8, 1), 32, 8, 128, 16, 54, Path::kDecode);
  Check({8191}, {1}, 8, 1, 64, 32, 55, Path::kDecode);
  Check({32768}, {1}, 32, 2, 128, 16, 56, Path::kDecode);  // group 16: 128 splits
}

// The split combine reads 32 splits per round: 16-row merge items with more splits than that
// take several rounds, rescaled by a running maximum (40 splits of 256 keys here; the 32k
// group-16 shape above takes 4); q_len 4 x group 4 also gives rows whose causal limit ends a
// split early. Small enough for compute-sanitizer.
TEST(PagedAttentionGpuTest, DecodeCombineInBatches) {
  TANDEM_SKIP_WITHOUT_GPU();
  Check({10200}, {1}, 16, 1, 128, 16, 61, Path::kDecode);
  Check({10200}, {1}, 16, 1, 64, 32, 62, Path::kDecode);
  Check({5000, 3000}, {4, 2}, 32, 8, 128, 16, 63, Path::kDecode);
}

TEST(PagedAttentionGpuTest, DecodeSeveralQueriesPerSequence) {
  // Speculative-decoding shape: a few new tokens per sequence, causal among themselves.
  TANDEM_SKIP_WITHOUT_GPU();
  Check({40, 900, 5}, {3, 4, 5}, 32, 8, 128, 16, 9, Path::kDecode);
}

TEST(PagedAttentionGpuTest, PrefillChunks) {
  TANDEM_SKIP_WITHOUT_GPU();
  // Whole prompts, chunks over cached pages (q_len < seq_len), single tokens.
  Check({1000, 1500, 17, 5}, {1000, 100, 17, 1}, 32, 8, 128, 16, 10, Path::kPrefill);
  Check({333, 64, 129}, {200, 64, 129}, 16, 2, 64, 64, 11, Path::kPrefill);
  Check({2048}, {2048}, 8, 8, 128, 128, 12, Path::kPrefill);
  Check({95, 300}, {95, 77}, 12, 4, 128, 32, 13, Path::kPrefill);
}

TEST(PagedAttentionGpuTest, DecodePathHandlesPrefillBatches) {
  TANDEM_SKIP_WITHOUT_GPU();
  Check({300, 45}, {300, 20}, 32, 8, 128, 16, 14, Path::kDecode);
}

TEST(PagedAttentionGpuTest, GraphReplaysARebuiltPlan) {
  // Capture the decode launch once, then change the lengths, rebuild the plan and replay: the
  // replay must compute the new batch (the graph reads the plan from its fixed buffers).
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(21);
  AttentionBatch b = MakeBatch({1200, 37, 500}, {1, 1, 1}, 32, 8, 128, 16, rng);
  DeviceAttentionBatch d(b);
  auto plan = AttentionPlan::Create({});
  ASSERT_TRUE(plan.ok());
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_TRUE((*plan)->BuildDecode(d.shape, stream).ok());
  ASSERT_TRUE(PagedAttentionDecode(d.args, **plan, stream).ok());  // warm-up: kernel attributes
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_TRUE(PagedAttentionDecode(d.args, **plan, stream).ok());
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  b.seq_lens = {77, 37, 499};
  ASSERT_EQ(
      cudaMemcpy(d.lens.get(), b.seq_lens.data(), 3 * sizeof(int32_t), cudaMemcpyHostToDevice),
      cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d.out.get(), std::vector<uint16_t>(b.q.size(), kNanBf16).data(),
                       b.q.size() * 2, cudaMemcpyHostToDevice),
            cudaSuccess);
  d.shape.seq_lens = b.seq_lens.data();
  ASSERT_TRUE((*plan)->BuildDecode(d.shape, stream).ok());
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ExpectClose(d.out.Download(), Reference(b));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The stream kernel (stream_decode.h: one pipeline across a CTA's items) launched directly.
// PagedAttentionDecode gives it unsplit and balanced plans (the cuts' merges: partials, the
// combine 8 splits a round in its merge buffer), but a CUDA graph captured with such a plan
// replays whatever plan the next build makes, so it must also be right on split plans.
// Unsplit and balanced: many items per CTA of mixed lengths, 1-key items and items shorter than
// the ring, more than 8 packed rows, the generic copies (pages 2, 24).
// Both stage fillings (DecodeCopies): cp.async and TMA.
void CheckStream(const std::vector<int>& lens, const std::vector<int>& q_lens, int nq, int nkv,
                 int d, int page_size, uint32_t seed, WantPlan want) {
  SCOPED_TRACE(::testing::Message() << "stream kernel, nq " << nq << " nkv " << nkv << " d " << d
                                    << " page " << page_size << " seed " << seed);
  std::mt19937 rng(seed);
  const AttentionBatch b = MakeBatch(lens, q_lens, nq, nkv, d, page_size, rng);
  const std::vector<float> ref = Reference(b);
  for (const DecodeCopies copies : {DecodeCopies::kCpAsync, DecodeCopies::kTma}) {
    SCOPED_TRACE(::testing::Message() << "copies " << DecodeCopiesName(copies));
    DeviceAttentionBatch dev(b);
    dev.args.decode_copies = copies;
    auto plan = AttentionPlan::Create({});
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE((*plan)->BuildDecode(dev.shape, nullptr).ok());
    ExpectPlan(**plan, want);
    ASSERT_TRUE(attention::LaunchStreamDecode(dev.args, **plan, nullptr).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ExpectClose(dev.out.Download(), ref);
  }
}

TEST(PagedAttentionGpuTest, StreamKernelOnSplitUnsplitAndBalancedPlans) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  for (int page : {2, 16, 24, 64}) {
    CheckStream({32768}, {1}, 32, 8, 128, page, 210 + page, WantPlan::kSplit);  // many a merge
    CheckStream({1, 77, 1000, 4097}, {1, 1, 1, 1}, 32, 8, 128, page, 220 + page, WantPlan::kSplit);
    CheckStream({2500, 63}, {2, 3}, 16, 2, 64, page, 230 + page, WantPlan::kSplit);  // 16, 24 rows
    CheckStream(RandomLens(300, 900, rng), std::vector<int>(300, 1), 32, 8, 128, page, 240 + page,
                WantPlan::kUnsplit);
    CheckStream(RandomLens(700, 400, rng), std::vector<int>(700, 1), 16, 2, 64, page, 250 + page,
                WantPlan::kUnsplit);
    CheckStream(LongAndShort(100, 3000, 640), std::vector<int>(100, 1), 32, 8, 128, page,
                260 + page, WantPlan::kBalanced);
  }
  CheckStream(std::vector<int>(160, 2000), std::vector<int>(160, 3), 32, 8, 128, 16, 270,
              WantPlan::kUnsplit);
  // Balanced with several query tokens a sequence (12 and 24 packed rows: 1 and 2 row groups).
  CheckStream(LongAndShort(120, 2000, 600), std::vector<int>(120, 3), 32, 8, 128, 16, 271,
              WantPlan::kBalanced);
  CheckStream(LongAndShort(120, 3000, 600), std::vector<int>(120, 3), 64, 8, 128, 64, 272,
              WantPlan::kBalanced);
}

// The TMA stages (tma_tile.cuh) on every page size they take: a tile of 8, 4, 2 or 1 whole pages,
// or a part of one (128 / 256 / 512); lengths of every residue (an item's last page copied whole,
// its rows past the keys NaN here, so the tail-row zeroing must hold), split, unsplit and
// balanced plans, 20 packed rows.
TEST(PagedAttentionGpuTest, StreamKernelTmaStagesOnEveryPageSize) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  for (int page : {8, 16, 32, 64, 128, 256, 512}) {
    CheckStream(RandomLens(300, 1500, rng), std::vector<int>(300, 1), 32, 8, 128, page, 280 + page,
                WantPlan::kUnsplit);
    CheckStream(LongAndShort(100, 3000, 640), std::vector<int>(100, 1), 32, 8, 128, page,
                281 + page, WantPlan::kBalanced);
    CheckStream({1, 77, 1000, 4097}, {1, 1, 1, 1}, 32, 8, 128, page, 282 + page, WantPlan::kSplit);
  }
  std::vector<int> lens = RandomLens(200, 700, rng);
  for (int& len : lens) len += 4;
  CheckStream(lens, std::vector<int>(200, 5), 16, 4, 128, 16, 290, WantPlan::kUnsplit);
}

// A decode step's RopeKvStore -> PagedAttentionDecode pair: RopeKvStore rotates q in place and
// stores the new tokens' K/V (their cache slots hold NaN before), and releases its dependents at
// its start; the decode kernel, launched with overlap_launch (PDL), may start its first K/V copies
// while RopeKvStore runs and must read q and the new tokens' rows only after its dependency wait.
// An early read shows as NaN or as a mismatch against PagedAttentionRef applied to the producer's
// actual outputs (downloaded after the pair). Both launch modes, in stream order and as replayed
// graphs (each run restores q and the poisoned slots first); batch 1 at 8k (every CTA a split
// whose prologue tiles precede the new token), ragged batches, several new tokens per sequence.
TEST(PagedAttentionGpuTest, DecodeAfterRopeKvStoreWithPdl) {
  TANDEM_SKIP_WITHOUT_GPU();
  struct Case {
    std::vector<int> lens, q_lens;
    int nq, nkv, d, page_size;
  };
  std::mt19937 rng(77);
  const std::vector<Case> cases = {
      {{8192}, {1}, 32, 8, 128, 16},
      {RandomLens(17, 3000, rng), std::vector<int>(17, 1), 32, 8, 128, 16},
      {{300, 40, 1000, 65}, {3, 1, 4, 2}, 32, 8, 128, 64},
      {{2000, 129}, {1, 1}, 8, 2, 64, 32}};
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const Case& c : cases) {
    for (bool pdl : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "seqs " << c.lens.size() << " len0 " << c.lens[0]
                                        << " d " << c.d << " pdl " << pdl);
      AttentionBatch b = MakeBatch(c.lens, c.q_lens, c.nq, c.nkv, c.d, c.page_size, rng);
      const int heads = c.nq + 2 * c.nkv;
      const int64_t tokens = b.num_tokens();
      std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
      std::vector<uint16_t> qkv(tokens * heads * c.d);
      for (auto& x : qkv) x = F32ToBf16(uni(rng));
      std::vector<int32_t> positions, slots;
      for (size_t s = 0; s < c.lens.size(); ++s) {
        for (int i = 0; i < c.q_lens[s]; ++i) {
          const int pos = c.lens[s] - c.q_lens[s] + i;
          positions.push_back(pos);
          slots.push_back(b.tables[s * b.max_pages + pos / c.page_size] * c.page_size +
                          pos % c.page_size);
          for (int h = 0; h < 2 * c.nkv; ++h) {  // the new token's K and V rows: NaN until stored
            const int64_t page = slots.back() / c.page_size, slot = slots.back() % c.page_size;
            auto* row = &b.kv[((page * 2 * c.nkv + h) * c.page_size + slot) * c.d];
            std::fill(row, row + c.d, kNanBf16);
          }
        }
      }
      std::vector<float> inv_freq(c.d / 2);
      for (int i = 0; i < c.d / 2; ++i) inv_freq[i] = std::pow(1e6f, -2.0f * i / c.d);
      DeviceAttentionBatch d(b);
      DeviceVector<uint16_t> qkv_dev(qkv), qkv_init(qkv), kv_init(b.kv);
      DeviceVector<int32_t> d_positions(positions), d_slots(slots);
      DeviceVector<float> d_freq(inv_freq);
      RopeKvStoreArgs rope;
      rope.qkv = qkv_dev.get();
      rope.positions = d_positions.get();
      rope.slot_mapping = d_slots.get();
      rope.kv_layer = d.kv.get();
      rope.inv_freq = d_freq.get();
      rope.num_tokens = tokens;
      rope.num_q_heads = c.nq;
      rope.num_kv_heads = c.nkv;
      rope.head_dim = c.d;
      rope.page_size = c.page_size;
      rope.num_pages = static_cast<int>(b.kv.size() / (int64_t{2} * c.nkv * c.page_size * c.d));
      PagedAttentionArgs args = d.args;
      args.q = qkv_dev.get();
      args.q_stride = int64_t{heads} * c.d;
      args.overlap_launch = pdl;
      auto plan = AttentionPlan::Create({});
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_TRUE((*plan)->BuildDecode(d.shape, stream).ok());
      const std::vector<uint16_t> nan_out(b.q.size(), kNanBf16);
      auto reset = [&] {
        ASSERT_EQ(
            cudaMemcpy(qkv_dev.get(), qkv_init.get(), qkv_init.bytes(), cudaMemcpyDeviceToDevice),
            cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d.kv.get(), kv_init.get(), kv_init.bytes(), cudaMemcpyDeviceToDevice),
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
        AttentionBatch actual = b;  // the producer's outputs: rotated q, stored K/V
        actual.kv = d.kv.Download();
        const std::vector<uint16_t> rotated = qkv_dev.Download();
        for (int64_t t = 0; t < tokens; ++t) {
          std::copy_n(&rotated[t * heads * c.d], c.nq * c.d, &actual.q[t * c.nq * c.d]);
        }
        ExpectClose(d.out.Download(), Reference(actual));
      };
      testing::RunInStreamAndGraph(stream, reset, enqueue, check, 3);
    }
  }
  cudaStreamDestroy(stream);
}

TEST(PagedAttentionGpuTest, EmptyBatchLaunchesNothing) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto plan = AttentionPlan::Create({});
  ASSERT_TRUE(plan.ok());
  PagedAttentionArgs a;
  a.num_seqs = 0;
  a.head_dim = 128;
  EXPECT_TRUE(PagedAttentionDecode(a, **plan, nullptr).ok());
  EXPECT_TRUE(PagedAttentionPrefill(a, **plan, nullptr).ok());
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST(PagedAttentionGpuTest, RejectsUnsupportedShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  auto plan = AttentionPlan::Create({});
  ASSERT_TRUE(plan.ok());
  PagedAttentionArgs a;
  a.num_seqs = 1;
  a.num_q_heads = 8;
  a.num_kv_heads = 8;
  a.page_size = 16;
  a.head_dim = 96;
  EXPECT_EQ(PagedAttentionDecode(a, **plan, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.head_dim = 128;
  a.dtype = DType::kF32;
  EXPECT_EQ(PagedAttentionPrefill(a, **plan, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
