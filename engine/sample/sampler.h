// Sampler: turns one row of logits per sampling sequence into the next token, through the
// sampling kernel (kernels/sampling/sampling.h). Each row carries its request's own seed and
// step (the number of tokens the request sampled before), so a request samples the same
// tokens whatever batch it runs in, and again after a preemption.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/request.h"

namespace tandem {

struct SampleRow {
  float temperature = 1.0f;  // 0: greedy
  int32_t top_k = -1;
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint64_t step = 0;
};

// InvalidArgument naming the field: temperature < 0 or not finite, top_p outside (0, 1],
// max_tokens < 1.
absl::Status ValidateSamplingParams(const SamplingParams& params);

// The seed of a request without an explicit one: a stable hash of its id.
uint64_t SeedFromRequestId(std::string_view id);

class Sampler {
 public:
  explicit Sampler(Backend backend) : backend_(backend) {}

  // `logits`: [rows.size(), vocab_size] fp32 in host memory (the CPU backend's logits buffer).
  absl::StatusOr<std::vector<int32_t>> Sample(const float* logits, int64_t vocab_size,
                                              const std::vector<SampleRow>& rows) const;

 private:
  Backend backend_;
};

}  // namespace tandem
