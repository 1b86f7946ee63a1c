#include "engine/sample/sampler.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "kernels/sampling/sampling.h"

namespace tandem {

absl::Status ValidateSamplingParams(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrFormat("temperature must be >= 0, got %g", params.temperature));
  }
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("top_p must be in (0, 1], got %g", params.top_p));
  }
  if (params.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_tokens must be >= 1, got %d", params.max_tokens));
  }
  return absl::OkStatus();
}

uint64_t SeedFromRequestId(std::string_view id) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : id) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

absl::StatusOr<std::vector<int32_t>> Sampler::Sample(const float* logits, int64_t vocab_size,
                                                     const std::vector<SampleRow>& rows) const {
  const size_t n = rows.size();
  std::vector<int32_t> tokens(n);
  if (n == 0) return tokens;
  std::vector<float> temperature(n), top_p(n);
  std::vector<int32_t> top_k(n);
  std::vector<uint64_t> seeds(n), steps(n);
  for (size_t i = 0; i < n; ++i) {
    temperature[i] = rows[i].temperature;
    top_k[i] = rows[i].top_k;
    top_p[i] = rows[i].top_p;
    seeds[i] = rows[i].seed;
    steps[i] = rows[i].step;
  }
  SamplingArgs args;
  args.logits = logits;
  args.temperature = temperature.data();
  args.top_k = top_k.data();
  args.top_p = top_p.data();
  args.seeds = seeds.data();
  args.steps = steps.data();
  args.out_tokens = tokens.data();
  args.batch = static_cast<int64_t>(n);
  args.vocab_size = vocab_size;
  if (backend_ != Backend::kCpu) {
    return absl::UnimplementedError("sampling on the CUDA backend is not wired up yet");
  }
  SamplingRef(args);
  return tokens;
}

}  // namespace tandem
