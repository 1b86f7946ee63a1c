#include "engine/spec/verify.h"

#include <algorithm>

#include "base/check.h"
#include "engine/spec/token_distribution.h"
#include "kernels/sampling/sampling_rng.h"

namespace tandem {
namespace {

// Seed salts of the speculative streams (the sampler uses the seed itself).
constexpr uint64_t kAcceptSalt = 0x5bd1e9955bd1e995ull;
constexpr uint64_t kDraftSalt = 0xc2b2ae3d27d4eb4full;

}  // namespace

double AcceptanceUniform(uint64_t seed, uint64_t step, uint32_t attempt) {
  return SamplingUniformImpl(SplitMix64(seed ^ kAcceptSalt), step, attempt);
}

double DraftUniform(uint64_t seed, uint64_t step) {
  return SamplingUniformImpl(SplitMix64(seed ^ kDraftSalt), step, 0);
}

VerifyResult Verify(const VerifyInput& in) {
  const size_t m = in.proposals.size();
  CHECK_EQ(in.target_tokens.size(), m + 1);
  VerifyResult out;
  if (in.rule == SpecAcceptance::kAcceptAllForTesting) {
    out.tokens.assign(in.proposals.begin(), in.proposals.end());
    out.tokens.push_back(in.target_tokens[m]);
    out.num_accepted = static_cast<int>(m);
    return out;
  }
  if (in.q.empty()) {
    size_t j = 0;
    while (j < m && in.target_tokens[j] == in.proposals[j]) ++j;
    out.tokens.assign(in.proposals.begin(), in.proposals.begin() + j);
    out.tokens.push_back(in.target_tokens[j]);
    out.num_accepted = static_cast<int>(j);
    return out;
  }
  CHECK_EQ(in.q.size(), m);
  CHECK_EQ(in.p.size(), m);
  for (size_t i = 0; i < m; ++i) {
    const std::vector<float>& p = in.p[i];
    const std::vector<float>& q = in.q[i];
    CHECK_EQ(p.size(), q.size());
    const int32_t d = in.proposals[i];
    const uint64_t step = in.first_step + i;
    // Accept with probability min(1, p(d) / q(d)): u < p / q, written without the division.
    if (q[d] > 0.0f && AcceptanceUniform(in.seed, step, 0) * q[d] < p[d]) {
      out.tokens.push_back(d);
      continue;
    }
    std::vector<float> residual(p.size());
    double mass = 0.0;
    for (size_t x = 0; x < p.size(); ++x) {
      residual[x] = std::max(0.0f, p[x] - q[x]);
      mass += residual[x];
    }
    // p <= q everywhere leaves no residual mass only when p == q (up to rounding), where a
    // rejection has probability ~0: draw from p then.
    const std::vector<float>& from = mass > 0.0 ? residual : p;
    out.tokens.push_back(DrawToken(from, AcceptanceUniform(in.seed, step, 1)));
    out.num_accepted = static_cast<int>(i);
    return out;
  }
  out.tokens.push_back(in.target_tokens[m]);
  out.num_accepted = static_cast<int>(m);
  return out;
}

}  // namespace tandem
