#include "loadgen/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::loadgen {

const char* FailureCauseName(FailureCause cause) {
  switch (cause) {
    case FailureCause::kNone:
      return "none";
    case FailureCause::kConnect:
      return "connect";
    case FailureCause::kHttpStatus:
      return "http_status";
    case FailureCause::kGrpcStatus:
      return "grpc_status";
    case FailureCause::kStreamError:
      return "stream_error";
    case FailureCause::kNoToken:
      return "no_token";
    case FailureCause::kTransport:
      return "transport";
    case FailureCause::kTimeout:
      return "timeout";
    case FailureCause::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

absl::StatusOr<Slo> ParseGoodput(const std::vector<std::string>& items) {
  Slo slo;
  for (const std::string& item : items) {
    size_t colon = item.find(':');
    double value = 0;
    if (colon == std::string::npos || !absl::SimpleAtod(item.substr(colon + 1), &value) ||
        value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput expects KEY:MS with a non-negative number, got '", item, "'"));
    }
    std::string key = item.substr(0, colon);
    if (key == "ttft") {
      slo.ttft_ms = value;
    } else if (key == "tpot") {
      slo.tpot_ms = value;
    } else if (key == "e2el") {
      slo.e2el_ms = value;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("--goodput key must be ttft, tpot or e2el, got '", key, "'"));
    }
  }
  return slo;
}

namespace {

double Quantile(const std::vector<double>& sorted, double p) {
  double idx = p / 100.0 * (sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(idx));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (idx - lo);
}

}  // namespace

Distribution Summarize(std::vector<double> values, const std::vector<double>& percentiles) {
  Distribution d;
  d.count = values.size();
  if (values.empty()) {
    d.percentiles.assign(percentiles.size(), 0.0);
    return d;
  }
  std::sort(values.begin(), values.end());
  d.mean = std::accumulate(values.begin(), values.end(), 0.0) / values.size();
  double sq = 0;
  for (double v : values) sq += (v - d.mean) * (v - d.mean);
  d.std = std::sqrt(sq / values.size());
  d.median = Quantile(values, 50);
  for (double p : percentiles) d.percentiles.push_back(Quantile(values, p));
  for (int p = 0; p <= 100; ++p) d.cdf.push_back(Quantile(values, p));
  return d;
}

namespace {

struct Samples {
  std::map<std::string, std::vector<double>> metric;
  std::map<std::string, std::vector<double>> phase;
  std::vector<double> send_lag;
};

void AddPhases(const RequestRecord& r, double ttft, Samples* s) {
  const ServerTiming& t = *r.server_timing;
  double sum = 0;
  auto add = [&](const char* name, const std::optional<double>& v) {
    s->phase[name].push_back(v.value_or(0.0));
    sum += v.value_or(0.0);
  };
  add("queue", t.queue_ms);
  add("prefill", t.prefill_ms);
  add("kv_transfer", t.kv_transfer_ms);
  add("first_decode", t.first_decode_ms);
  s->phase["other"].push_back(ttft - sum);
}

bool MeetsSlo(const Slo& slo, double ttft, double tpot, double e2el) {
  return (!slo.ttft_ms || ttft <= *slo.ttft_ms) && (!slo.tpot_ms || tpot <= *slo.tpot_ms) &&
         (!slo.e2el_ms || e2el <= *slo.e2el_ms);
}

// vLLM's peak output tokens/s and peak concurrency: 1-second buckets from the first release.
void Peaks(const std::vector<const RequestRecord*>& ok, Metrics* m) {
  if (ok.empty()) return;
  int64_t t0 = ok.front()->released_ns, t1 = 0;
  for (const RequestRecord* r : ok) {
    t0 = std::min(t0, r->released_ns);
    t1 = std::max(t1, r->chunk_ns.back());
  }
  size_t buckets = static_cast<size_t>(std::ceil((t1 - t0) / 1e9)) + 1;
  std::vector<double> tokens(buckets, 0), concurrent(buckets, 0);
  for (const RequestRecord* r : ok) {
    for (int64_t t : r->chunk_ns) tokens[static_cast<size_t>((t - t0) / 1e9)] += 1;
    size_t first = static_cast<size_t>((r->released_ns - t0) / 1e9);
    size_t last = static_cast<size_t>((r->chunk_ns.back() - t0) / 1e9);
    for (size_t b = first; b <= last && b < buckets; ++b) concurrent[b] += 1;
  }
  m->max_output_tokens_per_s = *std::max_element(tokens.begin(), tokens.end());
  m->max_concurrent_requests = *std::max_element(concurrent.begin(), concurrent.end());
}

}  // namespace

Metrics ComputeMetrics(const std::vector<RequestRecord>& records, double duration_s,
                       const std::vector<double>& percentiles, const Slo& slo) {
  Metrics m;
  m.duration_s = duration_s;
  m.percentiles = percentiles;
  Samples s;
  std::vector<const RequestRecord*> ok;
  int good = 0;
  for (const RequestRecord& r : records) {
    s.send_lag.push_back((r.send_ns - r.released_ns) / 1e6);
    if (!r.success) {
      ++m.failed;
      ++m.failed_by_cause[FailureCauseName(r.cause)];
      if (m.errors.size() < 10) m.errors.push_back(r.error);
      continue;
    }
    ok.push_back(&r);
    ++m.completed;
    int n = r.output_tokens;
    m.total_input_tokens += std::max(0, r.prompt_len);
    m.total_output_tokens += n;
    double ttft = r.TtftMs(), e2el = r.E2elMs(), queue = r.ClientQueueMs();
    double tpot = n > 1 ? (e2el - ttft) / (n - 1) : 0.0;
    s.metric["ttft"].push_back(ttft);
    s.metric["e2el"].push_back(e2el);
    if (n > 1) s.metric["tpot"].push_back(tpot);
    for (size_t k = 1; k < r.chunk_ns.size(); ++k) {
      s.metric["itl"].push_back((r.chunk_ns[k] - r.chunk_ns[k - 1]) / 1e6);
    }
    s.metric["client_queue_time"].push_back(queue);
    s.metric["e2el_including_client_queue"].push_back(e2el + queue);
    if (r.server_timing) AddPhases(r, ttft, &s);
    if (MeetsSlo(slo, ttft, tpot, e2el)) ++good;
  }
  for (const char* name : kMetricNames) m.dists[name] = Summarize(s.metric[name], percentiles);
  m.phase_requests = static_cast<int>(s.phase["other"].size());
  if (m.phase_requests > 0) {
    for (const char* name : kPhaseNames) m.phases[name] = Summarize(s.phase[name], percentiles);
  }
  m.send_lag = Summarize(s.send_lag, percentiles);
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.output_throughput = m.total_output_tokens / duration_s;
    m.total_token_throughput = (m.total_input_tokens + m.total_output_tokens) / duration_s;
    if (slo.any()) m.request_goodput = good / duration_s;
  }
  Peaks(ok, &m);
  return m;
}

}  // namespace tandem::loadgen
