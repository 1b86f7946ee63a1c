// Open-loop arrival schedules, as in `vllm bench serve`: inter-arrival gaps are drawn from
// Gamma(shape = burstiness, scale = 1 / (rate * burstiness)) — burstiness 1 is a Poisson process,
// larger is more regular, smaller is burstier — then the cumulative times are rescaled so that
// the last arrival lands exactly at N / rate (stabilises the achieved rate across seeds).
// An infinite rate puts every arrival at t = 0. Deterministic for a given seed.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::loadgen {

// Arrival offsets in seconds from the start, non-decreasing, one per request.
absl::StatusOr<std::vector<double>> GammaArrivals(int num_requests, double request_rate,
                                                  double burstiness, uint64_t seed);

}  // namespace tandem::loadgen
