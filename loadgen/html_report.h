// The self-contained HTML report (inline SVG, no scripts, no network) of one or more series of
// result JSONs: a sweep is one series (one point per offered load); --compare puts several
// series (e.g. two layouts) side by side. Plots: TTFT / TPOT / ITL / E2EL p50 and p99 against
// offered load, throughput and goodput against offered load, TTFT and ITL CDFs, and the
// server-reported TTFT phase breakdown; then a table of every point.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::loadgen {

struct ReportSeries {
  std::string label;
  std::vector<nlohmann::json> points;  // result JSONs (result_io.h), in load order
};

// Reads a result JSON (one point) or a sweep JSON ({"tandem_sweep": ..., "points": [...]}).
absl::StatusOr<ReportSeries> LoadSeries(const std::string& path);

std::string RenderHtmlReport(const std::vector<ReportSeries>& series, const std::string& title);

}  // namespace tandem::loadgen
