// Runs one benchmark point, or a sweep of points over request rate or concurrency, and writes
// the results: per point the printed block, a result JSON and a CSV row; per sweep a sweep JSON
// (all points), a sweep CSV and the HTML report.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "loadgen/config.h"
#include "loadgen/grpc_target.h"
#include "loadgen/http_target.h"
#include "loadgen/metrics.h"
#include "loadgen/sweep_prompts.h"

namespace tandem::loadgen {

struct SweepPlan {
  Config config;
  bool grpc = false;  // --backend tandem-grpc: grpc_target, else target (HTTP)
  HttpTargetOptions target;
  GrpcTargetOptions grpc_target;
  std::string model;  // the served model name the results are labelled with
  Slo slo;
  std::vector<std::string> percentile_metrics;
  std::vector<double> percentiles;
  std::string sweep_variable;  // "", "rate" or "concurrency"
  std::vector<double> sweep_values;
  std::shared_ptr<const SweepPrompts> prompts;  // one point per sweep value (or the one run)
};

// "rate=1,2,4" / "concurrency=1,8,64" / "" (no sweep).
absl::Status ParseSweep(const std::string& text, std::string* variable,
                        std::vector<double>* values);

// Returns the exit code (130 when interrupted).
int RunSweep(const SweepPlan& plan);

}  // namespace tandem::loadgen
