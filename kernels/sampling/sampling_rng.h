// The counter-based uniform draw behind SamplingUniform, usable on the host and in CUDA code so
// the CPU reference and the kernel draw the same number for a (seed, step) pair.
//
//   u(seed, step) = (SplitMix64(seed ^ SplitMix64(step)) >> 11) * 2^-53   in [0, 1)
//
// and the row's further draws, when it takes more than one, continue SplitMix64's sequence.
//
// SplitMix64 is the finaliser of Steele et al.'s SplittableRandom: a bijection on 64 bits whose
// outputs pass BigCrush, so nearby steps and seeds give independent-looking draws.
#pragma once

#include <cstdint>

#include "kernels/common/host_device.h"

namespace tandem {

// Weights are w = 2^((logit - max) * (kSamplingLog2e / temperature)) = exp((logit - max) / T),
// computed this way (one multiply, one exp2) by both the reference and the kernel.
inline constexpr float kSamplingLog2e = 1.44269504088896340736f;

TANDEM_HOST_DEVICE inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Draw `attempt` of a row: the attempt-th output of the SplitMix64 generator whose state starts
// at seed ^ SplitMix64(step) (its state advances by the golden-ratio constant that SplitMix64
// adds first), so attempt 0 is the row's one draw. Top-p rows without top-k take more
// (sampling.h: up to kTopPAttempts draws from the temperature distribution, then one more).
TANDEM_HOST_DEVICE inline double SamplingUniformImpl(uint64_t seed, uint64_t step,
                                                     uint32_t attempt = 0) {
  const uint64_t state = (seed ^ SplitMix64(step)) + attempt * 0x9e3779b97f4a7c15ull;
  const uint64_t bits = SplitMix64(state);
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

// Top-p rows without top-k: draws from the temperature distribution before the inverse CDF over
// the nucleus (sampling.h, step 5).
inline constexpr uint32_t kTopPAttempts = 32;

}  // namespace tandem
