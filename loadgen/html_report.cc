#include "loadgen/html_report.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "loadgen/svg_chart.h"

namespace tandem::loadgen {

using nlohmann::json;

namespace {

double Number(const json& j, const std::string& key, double fallback = NAN) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

bool IsConcurrencySweep(const json& point) {
  return point.value("sweep_variable", std::string()) == "concurrency" ||
         (!point.contains("sweep_variable") && !Number(point, "request_rate", 0) &&
          point.contains("max_concurrency") && point["max_concurrency"].is_number());
}

// The offered load of a point: its concurrency for concurrency sweeps, else its request rate
// (or, for an infinite rate, the achieved request throughput).
double OfferedLoad(const json& point) {
  if (IsConcurrencySweep(point)) return Number(point, "max_concurrency");
  double rate = Number(point, "request_rate");
  return std::isnan(rate) ? Number(point, "request_throughput") : rate;
}

// Percentile p of metric m: from the cdf_ms extra, else vLLM's median_/pNN_ keys.
double Pct(const json& point, const std::string& m, int p) {
  if (point.contains("cdf_ms") && point["cdf_ms"].contains(m)) {
    const json& cdf = point["cdf_ms"][m];
    if (cdf.is_array() && cdf.size() == 101) return cdf[p].get<double>();
  }
  return Number(point,
                p == 50 ? absl::StrCat("median_", m, "_ms") : absl::StrCat("p", p, "_", m, "_ms"));
}

std::string PointName(const ReportSeries& s, const json& point) {
  return absl::StrFormat("%s @ %g%s", s.label, OfferedLoad(point),
                         IsConcurrencySweep(point) ? " conc" : " req/s");
}

std::string LoadLabel(const std::vector<ReportSeries>& series) {
  bool conc = true;
  for (const ReportSeries& s : series) {
    for (const json& p : s.points) conc = conc && IsConcurrencySweep(p);
  }
  return conc ? "max concurrency" : "offered load (req/s; inf rate: achieved)";
}

std::string LatencyChart(const std::vector<ReportSeries>& series, const std::string& metric,
                         const std::string& title) {
  LineChart chart{title, LoadLabel(series), "ms", {}};
  for (size_t i = 0; i < series.size(); ++i) {
    for (int p : {50, 99}) {
      ChartLine line{absl::StrCat(series[i].label, " p", p), ChartColor(i), p == 50, true, {}};
      for (const json& point : series[i].points)
        line.points.emplace_back(OfferedLoad(point), Pct(point, metric, p));
      chart.lines.push_back(line);
    }
  }
  return RenderLineChart(chart);
}

std::string ThroughputChart(const std::vector<ReportSeries>& series) {
  LineChart chart{"Throughput and goodput", LoadLabel(series), "req/s", {}};
  for (size_t i = 0; i < series.size(); ++i) {
    ChartLine done{absl::StrCat(series[i].label, " throughput"), ChartColor(i), false, true, {}};
    ChartLine good{absl::StrCat(series[i].label, " goodput"), ChartColor(i), true, true, {}};
    for (const json& point : series[i].points) {
      done.points.emplace_back(OfferedLoad(point), Number(point, "request_throughput"));
      good.points.emplace_back(OfferedLoad(point), Number(point, "request_goodput"));
    }
    chart.lines.push_back(done);
    chart.lines.push_back(good);
  }
  return RenderLineChart(chart);
}

std::string CdfChart(const std::vector<ReportSeries>& series, const std::string& metric,
                     const std::string& title) {
  LineChart chart{title, "ms", "fraction of samples", {}};
  int color = 0;
  for (const ReportSeries& s : series) {
    for (const json& point : s.points) {
      ChartLine line{PointName(s, point), ChartColor(color++), false, false, {}};
      if (!point.contains("cdf_ms") || !point["cdf_ms"].contains(metric)) continue;
      const json& cdf = point["cdf_ms"][metric];
      for (size_t p = 0; p < cdf.size(); ++p)
        line.points.emplace_back(cdf[p].get<double>(), p / 100.0);
      chart.lines.push_back(line);
    }
  }
  return RenderLineChart(chart);
}

std::string PhaseChart(const std::vector<ReportSeries>& series) {
  StackedBars bars{
      "TTFT breakdown (mean, server-reported phases)",
      "ms",
      {"queue", "prefill", "kv_transfer", "first_decode", "other (client, network, router)"},
      {}};
  for (const ReportSeries& s : series) {
    for (const json& point : s.points) {
      BarRow row{PointName(s, point), {}};
      const json timing = point.value("server_timing", json::object());
      if (timing.value("requests", 0) > 0) {
        for (const char* phase : {"queue", "prefill", "kv_transfer", "first_decode", "other"}) {
          row.values.push_back(Number(timing, absl::StrCat("mean_", phase, "_ms"), 0));
        }
      } else {  // no phases reported: the whole TTFT is "other"
        row.values = {0, 0, 0, 0, Number(point, "mean_ttft_ms", Pct(point, "ttft", 50))};
      }
      bars.rows.push_back(row);
    }
  }
  return RenderStackedBars(bars);
}

std::string Table(const std::vector<ReportSeries>& series) {
  std::string t =
      "<table><tr><th>point</th><th>completed</th><th>failed</th><th>req/s</th><th>goodput</th>"
      "<th>out tok/s</th><th>TTFT p50 / p99</th><th>TPOT p50 / p99</th><th>ITL p50 / p99</th>"
      "<th>E2EL p50 / p99</th><th>seed</th></tr>\n";
  std::string notes;
  for (const ReportSeries& s : series) {
    bool shared = false;
    for (const json& p : s.points) {
      shared = shared || p.value("prompts_shared_across_points", false);
      // Seeds are 64-bit: printed from the integer, not through Number()'s double.
      std::string seed =
          p.contains("seed") && p["seed"].is_number_integer() ? p["seed"].dump() : "";
      absl::StrAppend(
          &t, absl::StrFormat(
                  "<tr><td>%s</td><td>%g</td><td>%g</td><td>%.2f</td><td>%.2f</td><td>%.1f</td>"
                  "<td>%.2f / %.2f</td><td>%.2f / %.2f</td><td>%.2f / %.2f</td><td>%.1f / "
                  "%.1f</td><td>%s</td></tr>\n",
                  HtmlEscape(PointName(s, p)), Number(p, "completed"), Number(p, "failed"),
                  Number(p, "request_throughput"), Number(p, "request_goodput"),
                  Number(p, "output_throughput"), Pct(p, "ttft", 50), Pct(p, "ttft", 99),
                  Pct(p, "tpot", 50), Pct(p, "tpot", 99), Pct(p, "itl", 50), Pct(p, "itl", 99),
                  Pct(p, "e2el", 50), Pct(p, "e2el", 99), seed));
    }
    if (shared) {
      absl::StrAppend(&notes, "<p><b>", HtmlEscape(s.label),
                      ": the points sent the same prompts</b> (prompts_shared_across_points): a "
                      "server's prefix cache served the points after the first, so their TTFTs "
                      "are not cold prefills.</p>\n");
    }
  }
  return t + "</table>\n" + notes;
}

}  // namespace

absl::StatusOr<ReportSeries> LoadSeries(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a result JSON"));
  }
  ReportSeries s;
  if (j.contains("points") && j["points"].is_array()) {
    s.label = j.value("label", path);
    for (const json& p : j["points"]) s.points.push_back(p);
  } else {
    s.label = j.value("label", path);
    s.points.push_back(j);
  }
  return s;
}

std::string RenderHtmlReport(const std::vector<ReportSeries>& series, const std::string& title) {
  std::string h = absl::StrCat(
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>", HtmlEscape(title),
      "</title><style>body{font-family:sans-serif;margin:20px}svg{margin:8px;border:1px solid #ccc}"
      "table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:3px 8px;text-align:right}"
      "</style></head><body>\n<h1>",
      HtmlEscape(title), "</h1>\n");
  absl::StrAppend(&h,
                  "<p>Dashed lines: p50 (and goodput); solid: p99 (and throughput). "
                  "Latencies are measured from each request's scheduled send time.</p>\n");
  absl::StrAppend(&h, "<div>", LatencyChart(series, "ttft", "Time to first token"),
                  LatencyChart(series, "tpot", "Time per output token (excl. 1st)"), "</div>\n");
  absl::StrAppend(&h, "<div>", LatencyChart(series, "itl", "Inter-token latency"),
                  LatencyChart(series, "e2el", "End-to-end latency"), "</div>\n");
  absl::StrAppend(&h, "<div>", ThroughputChart(series), "</div>\n");
  absl::StrAppend(&h, "<div>", CdfChart(series, "ttft", "TTFT CDF"),
                  CdfChart(series, "itl", "ITL CDF"), "</div>\n");
  absl::StrAppend(&h, "<div>", PhaseChart(series), "</div>\n<h2>Points</h2>\n", Table(series));
  return h + "</body></html>\n";
}

}  // namespace tandem::loadgen
