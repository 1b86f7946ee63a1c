#include "loadgen/arrivals.h"

#include <cmath>
#include <random>

#include "absl/strings/str_format.h"

namespace tandem::loadgen {

absl::StatusOr<std::vector<double>> GammaArrivals(int num_requests, double request_rate,
                                                  double burstiness, uint64_t seed) {
  if (num_requests < 0) return absl::InvalidArgumentError("negative number of requests");
  if (!(request_rate > 0)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--request-rate must be > 0, got %g", request_rate));
  }
  if (!(burstiness > 0) || std::isinf(burstiness)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--burstiness must be finite and > 0, got %g", burstiness));
  }
  std::vector<double> times(num_requests, 0.0);
  if (std::isinf(request_rate) || num_requests == 0) return times;
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  double t = 0;
  for (double& time : times) {
    t += gap(rng);
    time = t;
  }
  double target_end = num_requests / request_rate;
  if (t > 0) {
    for (double& time : times) time *= target_end / t;
  }
  return times;
}

}  // namespace tandem::loadgen
