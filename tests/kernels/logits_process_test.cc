// CUDA LogitsProcess against LogitsProcessRef, bit for bit (NaN as NaN): awkward batches and
// vocabularies, every row kind of MakeProcessBatch (nothing to do, each step alone, everything,
// long repetitive prompts, bad ids and prompt counts, duplicates, ids 0 and vocab - 1, -inf and
// +-1e30 logits), null optional arrays, empty batches, bad arguments, and a CUDA graph replay.
#include "kernels/logits_process/logits_process.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/cuda_test_util.h"
#include "tests/kernels/logits_test_util.h"

namespace tandem {
namespace {

using testing::DeviceVector;
using testing::MakeProcessBatch;
using testing::ProcessBatch;
using testing::SameFloat;

// Device copies of a batch's arrays; Args() points at them.
struct DeviceBatch {
  explicit DeviceBatch(const ProcessBatch& b)
      : logits(b.logits),
        rp(b.rp),
        freq(b.freq),
        pres(b.pres),
        bias_values(b.bias_values),
        history(b.history),
        history_start(b.history_start),
        num_prompt(b.num_prompt),
        bias_tokens(b.bias_tokens),
        bias_start(b.bias_start),
        batch(b.batch),
        vocab(b.vocab) {}
  DeviceVector<float> logits, rp, freq, pres, bias_values;
  DeviceVector<int32_t> history, history_start, num_prompt, bias_tokens, bias_start;
  int64_t batch, vocab;

  LogitsProcessArgs Args() const {
    return {.logits = logits.get(),
            .batch = batch,
            .vocab_size = vocab,
            .repetition_penalty = rp.get(),
            .frequency_penalty = freq.get(),
            .presence_penalty = pres.get(),
            .history_tokens = history.get(),
            .history_start = history_start.get(),
            .num_prompt_history = num_prompt.get(),
            .bias_tokens = bias_tokens.get(),
            .bias_values = bias_values.get(),
            .bias_start = bias_start.get()};
  }
};

void ExpectSameLogits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!SameFloat(got[i], want[i])) first = first < 0 ? static_cast<int64_t>(i) : first, ++bad;
  }
  ASSERT_EQ(bad, 0) << "first at " << first << ": " << got[first] << " vs " << want[first];
}

// Runs the kernel on a copy of b and the reference on b; compares.
void CheckBatch(ProcessBatch& b) {
  DeviceBatch d(b);
  LogitsProcessRef(b.Args());
  ASSERT_TRUE(LogitsProcess(d.Args(), nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectSameLogits(d.logits.Download(), b.logits);
}

TEST(LogitsProcessCudaTest, MatchesReferenceOnAwkwardShapes) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(21);
  for (int64_t vocab : {1, 7, 1000, 32000, 128256, 151936}) {
    for (int64_t batch : {1, 3, 17, 256}) {
      SCOPED_TRACE(::testing::Message() << "batch " << batch << " vocab " << vocab);
      ProcessBatch b = MakeProcessBatch(batch, vocab, rng);
      ASSERT_NO_FATAL_FAILURE(CheckBatch(b));
    }
  }
}

// Every row kind on small shapes, for compute-sanitizer (kernels/bench/gpu_run_all.sh).
TEST(LogitsProcessCudaTest, SmallForSanitizer) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(25);
  for (int64_t vocab : {7, 1000}) {
    ProcessBatch b = MakeProcessBatch(9, vocab, rng);
    ASSERT_NO_FATAL_FAILURE(CheckBatch(b));
  }
}

// Rows whose lists cover every token of the vocabulary (each range of every pass is hit), with
// heavy duplication: one token repeated 40000 times among the output tokens.
TEST(LogitsProcessCudaTest, DenseAndRepeatedHistories) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(22);
  for (int64_t vocab : {1000, 151936, 262144}) {
    ProcessBatch b = MakeProcessBatch(2, vocab, rng);
    b.history.clear(), b.history_start = {0}, b.num_prompt.clear();
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t t = 0; t < vocab; ++t) b.history.push_back(static_cast<int32_t>(t));
      for (int i = 0; i < 40000; ++i) b.history.push_back(static_cast<int32_t>(vocab / 2 + r));
      b.history_start.push_back(static_cast<int32_t>(b.history.size()));
      b.num_prompt.push_back(static_cast<int32_t>(vocab / 3));
      b.rp[r] = 1.3f, b.freq[r] = 0.01f, b.pres[r] = 0.5f;
    }
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    ASSERT_NO_FATAL_FAILURE(CheckBatch(b));
  }
}

TEST(LogitsProcessCudaTest, NullArraysAndEmptyBatch) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(23);
  ProcessBatch b = MakeProcessBatch(17, 1000, rng);
  DeviceBatch d(b);
  // Only bias: every penalty and the history absent.
  LogitsProcessArgs args = b.Args();
  args.repetition_penalty = args.frequency_penalty = args.presence_penalty = nullptr;
  args.history_start = nullptr;
  LogitsProcessRef(args);
  LogitsProcessArgs dargs = d.Args();
  dargs.repetition_penalty = dargs.frequency_penalty = dargs.presence_penalty = nullptr;
  dargs.history_start = nullptr;
  ASSERT_TRUE(LogitsProcess(dargs, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectSameLogits(d.logits.Download(), b.logits);
  // Penalties with histories, no num_prompt_history and no bias.
  args = b.Args(), dargs = d.Args();
  args.num_prompt_history = dargs.num_prompt_history = nullptr;
  args.bias_start = dargs.bias_start = nullptr;
  LogitsProcessRef(args);
  ASSERT_TRUE(LogitsProcess(dargs, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectSameLogits(d.logits.Download(), b.logits);
  // batch 0 launches nothing; bad arguments are errors, not launches.
  dargs.batch = 0;
  EXPECT_TRUE(LogitsProcess(dargs, nullptr).ok());
  dargs.batch = 1, dargs.vocab_size = 0;
  EXPECT_EQ(LogitsProcess(dargs, nullptr).code(), absl::StatusCode::kInvalidArgument);
  dargs.vocab_size = 1000, dargs.bias_start = d.bias_start.get(), dargs.bias_values = nullptr;
  EXPECT_EQ(LogitsProcess(dargs, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// Captured into a CUDA graph and replayed (the engine's decode steps): each replay processes a
// fresh copy of the logits and gives the reference's bits.
TEST(LogitsProcessCudaTest, GraphReplay) {
  TANDEM_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(24);
  ProcessBatch b = MakeProcessBatch(33, 32000, rng);
  const std::vector<float> input = b.logits;
  DeviceBatch d(b);
  LogitsProcessRef(b.Args());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  testing::RunInStreamAndGraph(
      stream,
      [&] {
        ASSERT_EQ(
            cudaMemcpy(d.logits.get(), input.data(), input.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
      },
      [&](cudaStream_t s) { ASSERT_TRUE(LogitsProcess(d.Args(), s).ok()); },
      [&](const char* label) {
        SCOPED_TRACE(label);
        ExpectSameLogits(d.logits.Download(), b.logits);
      });
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace tandem
