// /metrics of every process of a real 1 prefill + 1 decode layout after requests of known sizes:
// the router's request-level `tandem:` series count exactly what was sent, every sample carries
// model_name, no metric name is served by two kinds of process (so a sum over all scrape targets
// counts each quantity once: nothing is tripled as prompt tokens were when router and both
// workers exported one name), and the workers' own series agree with what they did.
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "deploy/launcher/http_get.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

constexpr char k1P1D[] = R"(
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
)";

// One scrape: the metric families (from "# TYPE" lines) and the sample lines.
struct Scrape {
  std::set<std::string> families;
  std::vector<std::string> samples;  // "name{labels} value"

  // Sum of the samples called exactly `name` whose label block contains every `labels` item.
  double Sum(const std::string& name, const std::vector<std::string>& labels = {}) const {
    double total = 0;
    for (absl::string_view line : samples) {
      if (!absl::ConsumePrefix(&line, name) || (line[0] != '{' && line[0] != ' ')) continue;
      const size_t space = line.rfind(' ');
      const absl::string_view label_block = line.substr(0, space);
      bool match = true;
      for (const std::string& l : labels) match = match && absl::StrContains(label_block, l);
      double v = 0;
      if (match && absl::SimpleAtod(line.substr(space + 1), &v)) total += v;
    }
    return total;
  }
};

Scrape ScrapeUrl(const std::string& metrics_url) {
  absl::string_view host_port = metrics_url;
  absl::ConsumePrefix(&host_port, "http://");
  absl::ConsumeSuffix(&host_port, "/metrics");
  Scrape s;
  absl::StatusOr<launcher::HttpResponse> r =
      launcher::HttpGet(std::string(host_port), "/metrics", absl::Seconds(5));
  EXPECT_TRUE(r.ok() && r->status == 200) << metrics_url << ": " << r.status();
  if (!r.ok()) return s;
  for (absl::string_view line : absl::StrSplit(r->body, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      s.families.insert(std::string(line.substr(0, line.find(' '))));
    } else if (!absl::StartsWith(line, "#")) {
      s.samples.emplace_back(line);
    }
  }
  return s;
}

TEST(MetricsE2E, EachQuantityIsCountedOnceAcrossScrapeTargetsAndEqualsWhatWasSent) {
  std::unique_ptr<launcher::Cluster> cluster = StartCluster(k1P1D);
  ASSERT_NE(cluster, nullptr);
  const std::vector<std::pair<int, int>> requests = {{5, 3}, {17, 8}, {40, 2}, {64, 12}, {1, 5}};
  double prompt_tokens = 0, generated_tokens = 0;
  for (const auto& [n, m] : requests) {
    GenerateArgs args;
    args.prompt = Prompt(n, static_cast<uint32_t>(n));
    args.max_tokens = m;
    StreamResult r = Generate(cluster->router().grpc_address, args);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    ASSERT_EQ(static_cast<int>(r.tokens.size()), m);
    prompt_tokens += n;
    generated_tokens += m;
  }
  std::string why;
  ASSERT_TRUE(WaitForIdle(*cluster, absl::Seconds(2), &why)) << why;
  const double k = static_cast<double>(requests.size());

  std::map<std::string, Scrape> by_process;  // "router", "prefill-0", "decode-0"
  by_process["router"] = ScrapeUrl(cluster->router().metrics_url);
  for (launcher::Process* w : cluster->workers()) by_process[w->name] = ScrapeUrl(w->metrics_url);
  ASSERT_EQ(by_process.size(), 3u);
  const Scrape& router = by_process["router"];
  const Scrape& prefill = by_process["prefill-0"];
  const Scrape& decode = by_process["decode-0"];

  // Summed over every scrape target, as a dashboard's sum() does.
  auto total = [&](const std::string& name, const std::vector<std::string>& labels = {}) {
    double t = 0;
    for (const auto& [process, scrape] : by_process) t += scrape.Sum(name, labels);
    return t;
  };
  EXPECT_EQ(total("tandem:prompt_tokens_total"), prompt_tokens);
  EXPECT_EQ(total("tandem:generation_tokens_total"), generated_tokens);
  EXPECT_EQ(total("tandem:request_success_total", {"finished_reason=\"length\""}), k);
  EXPECT_EQ(total("tandem:request_success_total"), k);
  EXPECT_EQ(total("tandem:request_prompt_tokens_count"), k);
  EXPECT_EQ(total("tandem:request_prompt_tokens_sum"), prompt_tokens);
  EXPECT_EQ(total("tandem:request_generation_tokens_sum"), generated_tokens);
  // The prompt of 1 token lands in the first bucket (le="1"), the 64-token one above le="50".
  EXPECT_EQ(total("tandem:request_prompt_tokens_bucket", {"le=\"1\""}), 1);
  EXPECT_EQ(total("tandem:request_prompt_tokens_bucket", {"le=\"50\""}), k - 1);
  for (const char* h :
       {"tandem:time_to_first_token_seconds", "tandem:e2e_request_latency_seconds",
        "tandem:request_queue_time_seconds", "tandem:request_prefill_time_seconds",
        "tandem:request_decode_time_seconds", "tandem:request_time_per_output_token_seconds",
        "tandem_kv_transfer_time_seconds"}) {
    EXPECT_EQ(total(std::string(h) + "_count"), k) << h;
  }
  // Inter-token gaps: every token after each request's first.
  EXPECT_EQ(total("tandem:inter_token_latency_seconds_count"), generated_tokens - k);
  EXPECT_GT(total("tandem_kv_transfer_bytes_total"), 0);

  // No metric name is exported by two kinds of process.
  for (const std::string& f : router.families) {
    EXPECT_FALSE(prefill.families.contains(f) || decode.families.contains(f)) << f;
  }
  // The engine's own state is per worker (one source each); the KV series name their side.
  for (const char* f : {"tandem:num_requests_running", "tandem:num_requests_waiting",
                        "tandem:kv_cache_usage_perc", "tandem:num_preemptions_total"}) {
    EXPECT_TRUE(prefill.families.contains(f) && decode.families.contains(f)) << f;
  }
  EXPECT_EQ(prefill.Sum("tandem_worker_kv_send_seconds_count"), k);
  // The part not overlapped with the prompt's compute: one per transfer, never more than the
  // transfer itself (a millisecond each of slack: the two are read at slightly different points).
  EXPECT_EQ(prefill.Sum("tandem_worker_kv_send_exposed_seconds_count"), k);
  EXPECT_LE(prefill.Sum("tandem_worker_kv_send_exposed_seconds_sum"),
            prefill.Sum("tandem_worker_kv_send_seconds_sum") + 1e-3 * k);
  EXPECT_FALSE(decode.families.contains("tandem_worker_kv_receive_exposed_seconds"));
  EXPECT_EQ(decode.Sum("tandem_worker_kv_receive_seconds_count"), k);
  // By data path: host TCP here (CPU workers).
  EXPECT_EQ(prefill.Sum("tandem_worker_kv_send_transfers_total", {"path=\"tcp\""}), k);
  EXPECT_EQ(decode.Sum("tandem_worker_kv_receive_transfers_total", {"path=\"tcp\""}), k);
  EXPECT_EQ(prefill.Sum("tandem_worker_kv_send_bytes_sum"),
            decode.Sum("tandem_worker_kv_receive_bytes_sum"));
  EXPECT_EQ(prefill.Sum("tandem_worker_kv_send_bytes_sum"),
            router.Sum("tandem_kv_transfer_bytes_total"));
  EXPECT_FALSE(decode.families.contains("tandem_worker_kv_send_seconds"));
  for (const Scrape* w : {&prefill, &decode}) {
    const double usage = w->Sum("tandem:kv_cache_usage_perc");
    EXPECT_GE(usage, 0.0);
    EXPECT_LE(usage, 1.0);
  }
  EXPECT_EQ(prefill.Sum("tandem_worker_requests_total", {"finished_reason=\"prefill_done\""}), k);
  EXPECT_EQ(decode.Sum("tandem_worker_requests_total", {"finished_reason=\"length\""}), k);

  // model_name on every sample of every process: the served name (the model directory's).
  const std::string model_label =
      "model_name=\"" + std::filesystem::path(TinyModelDir()).filename().string() + "\"";
  for (const auto& [process, scrape] : by_process) {
    ASSERT_FALSE(scrape.samples.empty()) << process;
    for (const std::string& line : scrape.samples) {
      EXPECT_TRUE(absl::StrContains(line, model_label)) << process << ": " << line;
    }
  }

  // The workers' probes (Kubernetes readiness and liveness): registered, healthy.
  for (launcher::Process* w : cluster->workers()) {
    absl::string_view host_port = w->metrics_url;
    absl::ConsumePrefix(&host_port, "http://");
    absl::ConsumeSuffix(&host_port, "/metrics");
    for (const char* path : {"/health", "/ready"}) {
      absl::StatusOr<launcher::HttpResponse> r =
          launcher::HttpGet(std::string(host_port), path, absl::Seconds(5));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->status, 200) << w->name << path << ": " << r->body;
    }
  }

  // The engines' token counters reach the workers' /metrics on their next refresh: the prefill
  // engine took every prompt.
  bool refreshed = false;
  for (int i = 0; i < 50 && !refreshed; ++i) {
    refreshed = ScrapeUrl(cluster->Find("prefill-0")->metrics_url)
                    .Sum("tandem_worker_prompt_tokens_total") == prompt_tokens;
    if (!refreshed) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(refreshed);
  EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace tandem::e2e
