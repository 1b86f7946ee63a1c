// kb_bench's "logits" section: LogitsProcess and Logprobs at B = 1 / 32 / 256 over 152064 fp32
// logits, rows that need nothing next to rows that need everything, beside the time to read the
// logits once with the read-ceiling kernel (launched and timed like them). Unit "x read": the
// median time over the time to read the logits at the read ceiling (as the sampling rows).
#include "kernels/bench/logits_bench.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/logits_process/logits_process.h"
#include "kernels/logprobs/logprobs.h"

namespace tandem::bench {
namespace {

void Ok(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    std::abort();
  }
}

template <typename T>
T* Upload(const std::vector<T>& host) {
  T* p = nullptr;
  BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(host.size(), 1) * sizeof(T)));
  BENCH_CUDA(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// Per-row parameters of one mode, in device memory. "everything": repetition 1.1, frequency 0.2,
// presence 0.3 over a 1024-token prompt and 256 output tokens (ids spread over the vocabulary,
// repeats included), and 16 bias pairs (a few -inf: stop tokens before min_tokens).
struct ProcessInputs {
  float *rp, *freq, *pres, *bias_values;
  int32_t *history, *history_start, *num_prompt, *bias_tokens, *bias_start;
};

ProcessInputs MakeProcessInputs(int64_t batch, int64_t vocab, bool everything) {
  constexpr int kPrompt = 1024, kOutput = 256, kBias = 16;
  std::vector<float> rp(batch, everything ? 1.1f : 1.0f), freq(batch, everything ? 0.2f : 0.0f),
      pres(batch, everything ? 0.3f : 0.0f), values;
  std::vector<int32_t> history, hstart{0}, prompt(batch, kPrompt), tokens, bstart{0};
  uint64_t x = 12345;
  auto next = [&] { return x = x * 6364136223846793005ull + 1442695040888963407ull; };
  for (int64_t r = 0; r < batch; ++r) {
    for (int i = 0; i < kPrompt + kOutput; ++i) {
      history.push_back(static_cast<int32_t>((next() >> 33) % (i % 4 == 0 ? 500 : vocab)));
    }
    hstart.push_back(static_cast<int32_t>(history.size()));
    for (int j = 0; everything && j < kBias; ++j) {
      tokens.push_back(static_cast<int32_t>((next() >> 33) % vocab));
      values.push_back(j % 8 == 0 ? -INFINITY : 2.0f);
    }
    bstart.push_back(static_cast<int32_t>(tokens.size()));
  }
  return {Upload(rp),     Upload(freq),   Upload(pres),   Upload(values), Upload(history),
          Upload(hstart), Upload(prompt), Upload(tokens), Upload(bstart)};
}

void Free(const ProcessInputs& p) {
  cudaFree(p.rp), cudaFree(p.freq), cudaFree(p.pres), cudaFree(p.bias_values);
  cudaFree(p.history), cudaFree(p.history_start), cudaFree(p.num_prompt);
  cudaFree(p.bias_tokens), cudaFree(p.bias_start);
}

void BenchProcess(int64_t batch, int64_t vocab, const std::vector<float*>& logits, double read_us) {
  for (bool everything : {false, true}) {
    const ProcessInputs p = MakeProcessInputs(batch, vocab, everything);
    const double us = MedianMicros(
        [&](int it) {
          Ok(LogitsProcess({.logits = logits[it % logits.size()],
                            .batch = batch,
                            .vocab_size = vocab,
                            .repetition_penalty = p.rp,
                            .frequency_penalty = p.freq,
                            .presence_penalty = p.pres,
                            .history_tokens = p.history,
                            .history_start = p.history_start,
                            .num_prompt_history = p.num_prompt,
                            .bias_tokens = p.bias_tokens,
                            .bias_values = p.bias_values,
                            .bias_start = p.bias_start},
                           nullptr));
        },
        nullptr, 5, 50);
    Report(everything ? "logits_process.everything" : "logits_process.nothing",
           absl::StrCat("B=", batch, " V=", vocab), us, "x read", us / read_us, 2.0 * 1e300);
    Free(p);
  }
}

// num_top -1 (nothing), 0 (the sampled token's logprob only) and 20 (everything).
void BenchLogprobs(int64_t batch, int64_t vocab, const std::vector<float*>& logits,
                   double read_us) {
  std::vector<int32_t> tokens(batch);
  for (int64_t r = 0; r < batch; ++r) tokens[r] = static_cast<int32_t>((r * 7919) % vocab);
  int32_t* dtokens = Upload(tokens);
  float* token_lp = Upload(std::vector<float>(batch));
  float* top_lp = Upload(std::vector<float>(batch * kMaxTopLogprobs));
  int32_t* top_id = Upload(std::vector<int32_t>(batch * kMaxTopLogprobs));
  for (int32_t n : {-1, 0, kMaxTopLogprobs}) {
    int32_t* num_top = Upload(std::vector<int32_t>(batch, n));
    const double us = MedianMicros(
        [&](int it) {
          Ok(Logprobs({.logits = logits[it % logits.size()],
                       .tokens = dtokens,
                       .num_top = num_top,
                       .token_logprob = token_lp,
                       .top_tokens = top_id,
                       .top_logprobs = top_lp,
                       .batch = batch,
                       .vocab_size = vocab},
                      nullptr));
        },
        nullptr, 5, 50);
    const char* name = n < 0 ? "logprobs.nothing" : (n == 0 ? "logprobs.token" : "logprobs.top20");
    Report(name, absl::StrCat("B=", batch, " V=", vocab), us, "x read", us / read_us, 2.0 * 1e300);
    cudaFree(num_top);
  }
  cudaFree(dtokens), cudaFree(token_lp), cudaFree(top_lp), cudaFree(top_id);
}

}  // namespace

void BenchLogits(const Ceilings& c) {
  const int64_t vocab = 152064;
  for (int64_t batch : {1, 32, 256}) {
    const size_t bytes = batch * vocab * 4;
    std::vector<float*> logits(RotationCopies(bytes));
    for (size_t i = 0; i < logits.size(); ++i) {
      BENCH_CUDA(cudaMalloc(&logits[i], bytes));
      FillNormalF32(logits[i], batch * vocab, 300 + i, 3.0f);
    }
    uint32_t* sink = nullptr;
    BENCH_CUDA(cudaMalloc(&sink, 4096 * sizeof(uint32_t)));
    const double once_us = MedianMicros(
        [&](int it) { ReadOnce(c.read_shape, logits[it % logits.size()], bytes, sink); }, nullptr,
        5, 50);
    const double read_us = bytes / (c.read_tbps * 1e6);
    Report("logits.read_logits_once", absl::StrCat("B=", batch, " V=", vocab), once_us, "x read",
           once_us / read_us, 2.0 * 1e300);
    BenchProcess(batch, vocab, logits, read_us);
    BenchLogprobs(batch, vocab, logits, read_us);
    cudaFree(sink);
    for (float* l : logits) cudaFree(l);
  }
}

}  // namespace tandem::bench
