// CUDA Sampling against SamplingRef, for each kernel: Sampling() (the resident cluster kernel up to
// a vocabulary of 155648, the one-block-per-row kernel above) and the one-block-per-row kernel on
// every vocabulary. Greedy rows must match exactly; sampled rows must match except at rounding
// boundaries (fixed-point weights on the GPU, float/double on the CPU), which the tests bound to
// 1-2% of rows, and every GPU token must lie in the row's top-k set.
#include "kernels/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iostream>
#include <random>

#include "gtest/gtest.h"
#include "kernels/sampling/sampling_variants.h"
#include "tests/kernels/cuda_test_util.h"

namespace tandem {
namespace {

using testing::DeviceBuffer;
using SampleFn = absl::Status (*)(const SamplingArgs&, cudaStream_t);

struct Variant {
  const char* name;
  SampleFn fn;
  int64_t max_vocab;
};
const Variant kVariants[] = {{"Sampling", &Sampling, 262144},
                             {"OneBlockPerRow", &SamplingOneBlockPerRow, 262144}};
constexpr int kNumVariants = sizeof(kVariants) / sizeof(kVariants[0]);

struct Batch {
  std::vector<float> logits, temperature, top_p, min_p;
  std::vector<int32_t> top_k;
  std::vector<uint64_t> seeds, steps;
  void AddRow(float t, int32_t k, float p, uint64_t seed, uint64_t step, float mp = 0.0f) {
    temperature.push_back(t), top_k.push_back(k), top_p.push_back(p), min_p.push_back(mp);
    seeds.push_back(seed), steps.push_back(step);
  }
};

// batch rows of vocab logits ~ N(0, spread^2).
void FillNormalLogits(Batch& b, int64_t batch, int64_t vocab, float spread, std::mt19937_64& rng) {
  b.logits.resize(batch * vocab);
  std::normal_distribution<float> dist(0.0f, spread);
  for (float& x : b.logits) x = dist(rng);
}

// An LLM-like row from a N(0, 3^2) one: the background scaled to N(0, 2^2), then `strong` tokens
// at uniform positions in [lo, hi) raised by `raise` to twice that (kb_bench's *_peaked rows at
// raise = 8: at p = 0.95 the nucleus is a handful of them).
void AddPeaks(float* row, int64_t vocab, uint64_t seed, int strong, int64_t lo, int64_t hi,
              float raise = 8.0f) {
  for (int64_t i = 0; i < vocab; ++i) row[i] *= 2.0f / 3.0f;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> at(lo, hi - 1);
  std::uniform_real_distribution<float> by(raise, 2.0f * raise);
  for (int i = 0; i < strong; ++i) row[at(rng)] += by(rng);
}

// Row r cycles through: greedy, temperature only, top-k, top-p, top-k + top-p; every third row
// also sets min_p (0.01 .. 0.2).
Batch MakeBatch(int64_t batch, int64_t vocab, float spread, std::mt19937_64& rng) {
  Batch b;
  FillNormalLogits(b, batch, vocab, spread, rng);
  for (int64_t r = 0; r < batch; ++r) {
    const int kind = r % 5;
    b.AddRow(kind == 0 ? 0.0f : 0.5f + 0.1f * (r % 7),
             kind == 2 || kind == 4 ? static_cast<int32_t>(1 + (r * 37) % 200) : 0,
             kind == 3 || kind == 4 ? 0.5f + 0.05f * (r % 9) : 1.0f, rng(), r * 3,
             r % 3 == 1 ? 0.01f * (1 + r % 20) : 0.0f);
  }
  return b;
}

SamplingArgs ArgsOf(const Batch& b, int64_t batch, int64_t vocab) {
  return {.logits = b.logits.data(),
          .temperature = b.temperature.data(),
          .top_k = b.top_k.data(),
          .top_p = b.top_p.data(),
          .min_p = b.min_p.data(),
          .seeds = b.seeds.data(),
          .steps = b.steps.data(),
          .batch = batch,
          .vocab_size = vocab};
}

std::vector<int32_t> RunRef(const Batch& b, int64_t batch, int64_t vocab) {
  std::vector<int32_t> out(batch, -1);
  SamplingArgs args = ArgsOf(b, batch, vocab);
  args.out_tokens = out.data();
  SamplingRef(args);
  return out;
}

std::vector<int32_t> RunGpu(SampleFn fn, const Batch& b, int64_t batch, int64_t vocab) {
  DeviceBuffer logits(b.logits), temp(b.temperature), top_k(b.top_k), top_p(b.top_p),
      min_p(b.min_p), seeds(b.seeds), steps(b.steps), out(batch * sizeof(int32_t));
  out.Poison();
  const absl::Status st = fn({.logits = logits.as<float>(),
                              .temperature = temp.as<float>(),
                              .top_k = top_k.as<int32_t>(),
                              .top_p = top_p.as<float>(),
                              .min_p = min_p.as<float>(),
                              .seeds = seeds.as<uint64_t>(),
                              .steps = steps.as<uint64_t>(),
                              .out_tokens = out.as<int32_t>(),
                              .batch = batch,
                              .vocab_size = vocab},
                             nullptr);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int32_t> host(batch);
  out.Download(host.data());
  return host;
}

// Mismatching sampled rows and all sampled rows, per variant.
struct Tally {
  int mismatches[kNumVariants] = {};
  int rows = 0;
  void ExpectWithin(double fraction) const {
    for (int v = 0; v < kNumVariants; ++v) {
      EXPECT_LE(mismatches[v], rows * fraction)
          << kVariants[v].name << ": " << mismatches[v] << " of " << rows << " rows differ";
    }
  }
};

void CheckRows(const Batch& b, int64_t batch, int64_t vocab, Tally* tally) {
  SCOPED_TRACE(::testing::Message() << "batch=" << batch << " vocab=" << vocab);
  const std::vector<int32_t> want = RunRef(b, batch, vocab);
  for (int64_t r = 0; r < batch; ++r) tally->rows += b.temperature[r] > 0.0f;
  for (int v = 0; v < kNumVariants; ++v) {
    if (vocab > kVariants[v].max_vocab) continue;
    SCOPED_TRACE(kVariants[v].name);
    const std::vector<int32_t> got = RunGpu(kVariants[v].fn, b, batch, vocab);
    EXPECT_EQ(RunGpu(kVariants[v].fn, b, batch, vocab), got) << "not deterministic";
    for (int64_t r = 0; r < batch; ++r) {
      ASSERT_GE(got[r], 0) << "row " << r;
      ASSERT_LT(got[r], vocab) << "row " << r;
      const float* row = &b.logits[r * vocab];
      if (!(b.temperature[r] > 0.0f)) {
        ASSERT_EQ(got[r], want[r]) << "greedy row " << r;
        continue;
      }
      const int32_t k = b.top_k[r];
      if (k > 0 && k < vocab) {
        std::vector<float> sorted(row, row + vocab);
        std::nth_element(sorted.begin(), sorted.begin() + k - 1, sorted.end(),
                         std::greater<float>());
        ASSERT_GE(row[got[r]], sorted[k - 1]) << "outside top-k, row " << r;
      }
      if (got[r] != want[r] && tally->mismatches[v] < 8) {
        auto rank = [&](int32_t t) {
          return std::count_if(row, row + vocab, [&](float x) { return x > row[t]; });
        };
        std::cerr << kVariants[v].name << " rounding mismatch (allowed up to 1%): row " << r
                  << " T=" << b.temperature[r] << " k=" << k << " p=" << b.top_p[r] << " got "
                  << got[r] << " (logit " << row[got[r]] << ", rank " << rank(got[r]) << ") want "
                  << want[r] << " (logit " << row[want[r]] << ", rank " << rank(want[r]) << ")\n";
      }
      tally->mismatches[v] += got[r] != want[r];
    }
  }
}

TEST(SamplingCudaTest, MatchesReferenceOnAwkwardShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  Tally tally;
  uint64_t seed = 1;
  for (int64_t batch : {1, 3, 17, 255}) {
    for (int64_t vocab : {1, 2, 1000, 32000, 50257, 151937, 152064}) {
      std::mt19937_64 rng(seed++);
      CheckRows(MakeBatch(batch, vocab, 3.0f, rng), batch, vocab, &tally);
    }
  }
  std::mt19937_64 rng(99);
  CheckRows(MakeBatch(256, 152064, 3.0f, rng), 256, 152064, &tally);
  tally.ExpectWithin(0.01);
}

// Vocabularies above the resident kernel's 155648, where Sampling() runs the one-block-per-row
// kernel: just above it, odd (scalar loads), and the largest supported (Gemma 3's 262144).
TEST(SamplingCudaTest, LargeVocabularies) {
  TANDEM_SKIP_WITHOUT_GPU();
  Tally tally;
  uint64_t seed = 500;
  for (int64_t batch : {1, 17, 64}) {
    for (int64_t vocab : {155649, 200003, 262144}) {
      std::mt19937_64 rng(seed++);
      CheckRows(MakeBatch(batch, vocab, 3.0f, rng), batch, vocab, &tally);
    }
  }
  tally.ExpectWithin(0.02);
}

TEST(SamplingCudaTest, FlatLogitsTakeTheFullRowPath) {
  TANDEM_SKIP_WITHOUT_GPU();
  // Nearly equal logits put more candidates in the boundary bins than fit on chip: the exact
  // slow paths (whole-row selects).
  Tally tally;
  std::mt19937_64 rng(77);
  CheckRows(MakeBatch(20, 152064, 0.01f, rng), 20, 152064, &tally);
  tally.ExpectWithin(0.07);  // at most 1 of the 16 sampled rows
}

// Edge parameters, each row its own case: k = 1, k = vocab, k > vocab, p tiny and p = 1,
// temperature tiny and large, with greedy rows mixed in.
TEST(SamplingCudaTest, EdgeParameters) {
  TANDEM_SKIP_WITHOUT_GPU();
  Tally tally;
  for (int64_t vocab : {1000, 151937, 152064}) {
    std::mt19937_64 rng(vocab);
    Batch b = MakeBatch(0, vocab, 3.0f, rng);
    const int32_t v = static_cast<int32_t>(vocab);
    const struct {
      float t;
      int32_t k;
      float p;
    } cases[] = {{0.7f, 1, 1.0f},   {0.7f, v, 1.0f},   {0.7f, v + 5, 0.9f}, {1.0f, 0, 1e-6f},
                 {1.0f, 0, 1.0f},   {1e-4f, 0, 1.0f},  {1e-4f, 50, 0.9f},   {50.0f, 0, 1.0f},
                 {50.0f, 0, 0.9f},  {50.0f, 40, 1.0f}, {0.0f, 5, 0.5f},     {1.0f, 1, 1e-6f},
                 {0.7f, 50, 0.999f}};
    uint64_t step = 0;
    for (int rep = 0; rep < 3; ++rep) {
      for (const auto& c : cases) b.AddRow(c.t, c.k, c.p, rng(), step++);
    }
    const int64_t batch = static_cast<int64_t>(b.temperature.size());
    FillNormalLogits(b, batch, vocab, 3.0f, rng);
    CheckRows(b, batch, vocab, &tally);
  }
  tally.ExpectWithin(0.02);
}

// Rows with -inf logits, huge logits, many ties at the top-k boundary (integer logits), and NaN
// in greedy rows (the reference: NaN never wins).
TEST(SamplingCudaTest, SpecialLogits) {
  TANDEM_SKIP_WITHOUT_GPU();
  Tally tally;
  for (int64_t vocab : {1000, 152064}) {
    std::mt19937_64 rng(vocab + 1);
    const int64_t batch = 40;
    Batch b = MakeBatch(batch, vocab, 3.0f, rng);
    for (int64_t r = 0; r < batch; ++r) {
      float* row = &b.logits[r * vocab];
      switch (r % 4) {
        case 0:  // every other logit -inf
          for (int64_t i = 0; i < vocab; i += 2) row[i] = -INFINITY;
          break;
        case 1:  // one huge logit, some hugely negative ones
          row[(r * 7919) % vocab] = 1e30f;
          for (int64_t i = 1; i < vocab; i += 3) row[i] = -1e30f;
          break;
        case 2:  // integer logits: thousands of ties at every boundary
          for (int64_t i = 0; i < vocab; ++i) row[i] = std::round(row[i]);
          break;
        default:  // NaN sprinkled in (greedy rows only: the reference is undefined otherwise)
          b.temperature[r] = 0.0f;
          for (int64_t i = 3; i < vocab; i += 11) row[i] = NAN;
      }
    }
    CheckRows(b, batch, vocab, &tally);
  }
  tally.ExpectWithin(0.02);
}

// A small batch through every path of the resident kernel (greedy, temperature, top-k, top-p,
// both, the whole-row selects when the candidates overflow, rank 0's direct draw of a top-k row,
// an LLM-like top-p row): small enough for compute-sanitizer (kernels/bench/gpu_run_all.sh).
TEST(SamplingCudaTest, SmallBatchAllPaths) {
  TANDEM_SKIP_WITHOUT_GPU();
  Tally tally;
  const int64_t batch = 10, vocab = 152064;
  std::mt19937_64 rng(5);
  Batch b = MakeBatch(batch, vocab, 3.0f, rng);
  b.temperature[6] = 50.0f, b.top_k[6] = 40;  // wide bins: candidates overflow
  for (int64_t i = 0; i < vocab; ++i) b.logits[7 * vocab + i] *= 0.003f;  // nearly flat
  b.temperature[7] = 1.0f, b.top_p[7] = 0.9f;
  std::fill(&b.logits[8 * vocab], &b.logits[9 * vocab], 1.5f);  // all tied: candidates overflow
  b.top_k[8] = 50;
  AddPeaks(&b.logits[9 * vocab], vocab, 9, 40, 0, vocab);  // LLM-like
  b.temperature[9] = 1.0f, b.top_k[9] = 0, b.top_p[9] = 0.95f;
  CheckRows(b, batch, vocab, &tally);
  tally.ExpectWithin(0.12);  // at most 1 of the 9 sampled rows
}

TEST(SamplingCudaTest, GreedyTiesAndRejectsHugeVocab) {
  TANDEM_SKIP_WITHOUT_GPU();
  Batch b;
  b.logits = {1.0f, 7.0f, 3.0f, 7.0f, 7.0f};
  b.AddRow(0.0f, 0, 1.0f, 1, 0);
  for (const Variant& v : kVariants) EXPECT_EQ(RunGpu(v.fn, b, 1, 5)[0], 1) << v.name;
  SamplingArgs args{.batch = 1, .vocab_size = 300000};
  EXPECT_EQ(Sampling(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.vocab_size = 262145;
  EXPECT_EQ(Sampling(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.vocab_size = 155649;
  EXPECT_EQ(SamplingCluster(args, nullptr).code(), absl::StatusCode::kInvalidArgument);
  args.batch = 0, args.vocab_size = 1000;  // empty batch: nothing to do
  for (const Variant& v : kVariants) EXPECT_TRUE(v.fn(args, nullptr).ok()) << v.name;
  EXPECT_TRUE(SamplingCluster(args, nullptr).ok());
}

// Adversarial shapes of row r (logits initially N(0, 3^2)) for the top-k / top-p stress tests.
enum class RowShape {
  kAscending,  // every later load group beats the earlier ones
  kDescending,
  kIntegerTies,        // integer logits: thousands of ties at the k-th value / the threshold
  kConstant,           // every logit ties (at `constant`)
  kNearlyFlat,         // one histogram bin holds the whole row
  kFewFinite,          // -inf but for 20 logits: fewer finite logits than k
  kHugeAmongNegative,  // one 1e30 logit among -1e30 ones
  kTiedMaxima,         // 300 logits at 20
  kMaskedPrefix,       // -inf over the first 60% of the row (no finite logit in the first chunks)
  kPeaked,             // LLM-like (AddPeaks): a N(0, 2^2) background and 40 strong tokens
  kNormal,             // left as drawn
};

void ShapeRow(float* row, int64_t vocab, int64_t r, RowShape shape, float constant) {
  const float step = 12.0f / static_cast<float>(vocab);
  switch (shape) {
    case RowShape::kAscending:
      for (int64_t i = 0; i < vocab; ++i) row[i] = -6.0f + step * i;
      break;
    case RowShape::kDescending:
      for (int64_t i = 0; i < vocab; ++i) row[i] = 6.0f - step * i;
      break;
    case RowShape::kIntegerTies:
      for (int64_t i = 0; i < vocab; ++i) row[i] = std::round(row[i]);
      break;
    case RowShape::kConstant:
      std::fill(row, row + vocab, constant);
      break;
    case RowShape::kNearlyFlat:
      for (int64_t i = 0; i < vocab; ++i) row[i] *= 0.003f;
      break;
    case RowShape::kFewFinite:
      for (int64_t i = 0; i < vocab; ++i) row[i] = i % (vocab / 20) == 3 ? row[i] : -INFINITY;
      break;
    case RowShape::kHugeAmongNegative:
      for (int64_t i = 1; i < vocab; i += 3) row[i] = -1e30f;
      row[(r * 7919) % vocab] = 1e30f;
      break;
    case RowShape::kTiedMaxima:
      for (int64_t i = 0; i < 300; ++i) row[(i * 7877 + r) % vocab] = 20.0f;
      break;
    case RowShape::kMaskedPrefix:
      std::fill(row, row + vocab * 3 / 5, -INFINITY);
      break;
    case RowShape::kPeaked:
      AddPeaks(row, vocab, r, 40, 0, vocab);
      break;
    case RowShape::kNormal:
      break;
  }
}

// Top-k rows that stress the candidate buffers and selects, through every variant: ascending and
// descending logits, k = 1 and k at and beyond the resident kernel's direct draw from rank 0's
// candidates (kDirectDrawMax, 128), thousands of ties at the k-th value (integer logits, a
// constant row: the candidates overflow, the whole-row selects run), -inf everywhere but a few
// logits (fewer finite logits than k), one 1e30 logit among -1e30 ones, 300 tied maxima.
TEST(SamplingCudaTest, TopKAdversarialRows) {
  TANDEM_SKIP_WITHOUT_GPU();
  Tally tally;
  const int32_t ks[] = {1, 50, 127, 128, 129};
  for (int64_t vocab : {1000, 151937, 152064}) {
    std::mt19937_64 rng(vocab + 3);
    const int64_t batch = 40;
    Batch b;
    for (int64_t r = 0; r < batch; ++r) {
      b.AddRow(0.5f + 0.25f * (r % 3), ks[r % 5], r % 2 == 0 ? 1.0f : 0.9f, rng(), r);
    }
    FillNormalLogits(b, batch, vocab, 3.0f, rng);
    constexpr RowShape kShapes[] = {RowShape::kAscending,   RowShape::kDescending,
                                    RowShape::kIntegerTies, RowShape::kConstant,
                                    RowShape::kFewFinite,   RowShape::kHugeAmongNegative,
                                    RowShape::kTiedMaxima,  RowShape::kNormal};
    for (int64_t r = 0; r < batch; ++r) {
      ShapeRow(&b.logits[r * vocab], vocab, r, kShapes[(r / 5) % 8], 0.25f);
    }
    CheckRows(b, batch, vocab, &tally);
  }
  tally.ExpectWithin(0.02);
}

// Top-p-only rows (no top-k: the resident kernel's per-range merge and sub-bin select,
// sampling_cluster_topp.cuh) at every batch and vocabulary shape, p from 1e-6 to 0.999 and
// temperatures 0.05 to 5 (top-p bins from a handful of candidates to thousands, so the pairwise,
// block radix and whole-row selects all run), mixed with greedy, temperature-only and top-k rows,
// through every variant.
TEST(SamplingCudaTest, TopPRowsAcrossShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  Tally tally;
  const float ps[] = {1e-6f, 0.5f, 0.9f, 0.95f, 0.99f, 0.999f, 0.3f};
  const float ts[] = {0.05f, 0.3f, 0.7f, 1.0f, 1.5f, 5.0f};
  const std::pair<int64_t, int64_t> shapes[] = {
      {1, 152064}, {3, 1000}, {17, 151937}, {255, 50257}, {256, 152064}};
  for (const auto& [batch, vocab] : shapes) {
    std::mt19937_64 rng(batch * 13 + vocab);
    Batch b;
    for (int64_t r = 0; r < batch; ++r) {
      const int kind = static_cast<int>((r + batch) % 8);
      const float t = ts[(r * 5 + batch) % 6], p = ps[(r * 3 + batch) % 7];
      if (kind == 0) {
        b.AddRow(0.0f, 0, 1.0f, rng(), r);  // greedy
      } else if (kind == 1) {
        b.AddRow(t, 0, 1.0f, rng(), r);  // temperature only
      } else if (kind == 2) {
        b.AddRow(t, 50, 0.9f, rng(), r);  // top-k and top-p
      } else {
        b.AddRow(t, 0, p, rng(), r);  // top-p only
      }
    }
    FillNormalLogits(b, batch, vocab, 3.0f, rng);
    CheckRows(b, batch, vocab, &tally);
  }
  tally.ExpectWithin(0.01);
}

// Top-p-only rows that stress the top-p bracket and selects, through every variant: ascending and
// descending logits, integer logits (thousands of ties at the threshold), a constant row and a
// nearly flat one (every logit in one bin: far more candidates than the pairwise select takes, so
// the block radix and whole-row selects run), -inf everywhere but 20 logits, one 1e30 logit among
// -1e30 ones, 300 tied maxima, -inf over the first 60% of the row (no finite logit in the first
// slices), LLM-like rows, plain N(0, 3^2); p from 1e-6 to 0.999.
TEST(SamplingCudaTest, TopPAdversarialRows) {
  TANDEM_SKIP_WITHOUT_GPU();
  Tally tally;
  const float ps[] = {0.5f, 0.9f, 0.95f, 0.999f, 1e-6f};
  for (int64_t vocab : {1000, 151937, 152064}) {
    std::mt19937_64 rng(vocab + 11);
    const int64_t batch = 55;
    Batch b;
    for (int64_t r = 0; r < batch; ++r) {
      b.AddRow(0.7f + 0.4f * (r % 3), 0, ps[r % 5], rng(), r);
    }
    FillNormalLogits(b, batch, vocab, 3.0f, rng);
    constexpr RowShape kShapes[] = {RowShape::kAscending,
                                    RowShape::kDescending,
                                    RowShape::kIntegerTies,
                                    RowShape::kConstant,
                                    RowShape::kNearlyFlat,
                                    RowShape::kFewFinite,
                                    RowShape::kHugeAmongNegative,
                                    RowShape::kTiedMaxima,
                                    RowShape::kMaskedPrefix,
                                    RowShape::kPeaked,
                                    RowShape::kNormal};
    for (int64_t r = 0; r < batch; ++r) {
      ShapeRow(&b.logits[r * vocab], vocab, r, kShapes[(r / 5) % 11], -0.75f);
    }
    CheckRows(b, batch, vocab, &tally);
  }
  tally.ExpectWithin(0.02);
}

// LLM-like top-p-only rows (AddPeaks): the strong tokens anywhere in the row, only in its last
// 8192 logits, only in its first 4096, all in one entry of 128, and weak (raised by 2.5 to 5: a
// nucleus of thousands); vocabularies of 4096 to the largest; batches above the clusters that fit
// at once (each cluster takes several rows), with greedy and temperature-only rows between the
// top-p rows. Every variant against the reference.
TEST(SamplingCudaTest, TopPPeakedRows) {
  TANDEM_SKIP_WITHOUT_GPU();
  Tally tally;
  const float ps[] = {0.5f, 0.9f, 0.95f, 0.99f, 0.999f, 1e-6f, 0.8f};
  const float ts[] = {0.5f, 0.7f, 1.0f, 1.5f, 0.3f};
  const std::pair<int64_t, int64_t> shapes[] = {
      {40, 4096}, {70, 20000}, {40, 151936}, {200, 152064}, {600, 20000}};
  for (const auto& [batch, vocab] : shapes) {
    SCOPED_TRACE(::testing::Message() << "batch=" << batch << " vocab=" << vocab);
    std::mt19937_64 rng(batch + vocab);
    Batch b;
    for (int64_t r = 0; r < batch; ++r) {
      const bool top_p = r % 6 != 5;  // else greedy (r % 12 == 5) or temperature only
      b.AddRow(top_p || r % 12 == 11 ? ts[r % 5] : 0.0f, 0, top_p ? ps[r % 7] : 1.0f, rng(), r);
    }
    FillNormalLogits(b, batch, vocab, 3.0f, rng);
    for (int64_t r = 0; r < batch; ++r) {
      float* row = &b.logits[r * vocab];
      const uint64_t seed = r * 31 + vocab;
      const int64_t entry = (r * 7919) % (vocab / 128) * 128;
      switch (r % 5) {
        case 0:
        case 1:
          AddPeaks(row, vocab, seed, 40, 0, vocab);
          break;
        case 2:  // the last 8192 logits, or the first 4096
          AddPeaks(row, vocab, seed, 40, r % 2 ? std::max<int64_t>(vocab - 8192, 0) : 0,
                   r % 2 ? vocab : std::min<int64_t>(vocab, 4096));
          break;
        case 3:
          AddPeaks(row, vocab, seed, 40, entry, entry + 128);
          break;
        default:
          AddPeaks(row, vocab, seed, 40, 0, vocab, 2.5f);
      }
    }
    CheckRows(b, batch, vocab, &tally);
  }
  tally.ExpectWithin(0.01);
}

}  // namespace
}  // namespace tandem
