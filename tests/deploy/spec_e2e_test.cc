// Speculative decoding end to end on loopback with real processes: router -> prefill -> KV
// transfer -> decode, the decode worker speculating (n-gram lookup, or the tiny model as its own
// draft, whose prompt KV the decode worker computes itself from the prompt tokens it receives).
// Greedy output equals the single-engine reference without speculation token for token, the
// decode worker's /metrics show accepted proposals, and every page is back afterwards.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "deploy/launcher/http_get.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

constexpr char k1P1D[] = R"(
engine: {page_size: 16, num_pages: 2048}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
)";

// The value of the first sample of `name` in a Prometheus text page (-1 if absent).
double Metric(const std::string& page, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (!absl::StartsWith(line, name + "{")) continue;
    double v = -1;
    const size_t space = line.rfind(' ');
    if (space != absl::string_view::npos && absl::SimpleAtod(line.substr(space + 1), &v)) return v;
  }
  return -1;
}

void ExpectSameAsWithoutSpeculation(const std::string& method) {
  std::unique_ptr<launcher::Cluster> cluster =
      StartCluster(k1P1D, [&](launcher::Layout& l, launcher::ClusterOptions&) {
        l.engine.speculative_method = method;
        l.engine.num_speculative_tokens = 3;
        if (method == "draft") l.engine.speculative_draft_model = TinyModelDir();
      });
  ASSERT_NE(cluster, nullptr);
  for (int n : {1, 15, 17, 40, 100}) {
    GenerateArgs args;
    // A phrase said three times: n-gram lookup finds what follows it.
    const std::vector<int32_t> phrase = Prompt(n, static_cast<uint32_t>(n));
    for (int r = 0; r < 3; ++r) args.prompt.insert(args.prompt.end(), phrase.begin(), phrase.end());
    args.max_tokens = 20;
    const std::vector<int32_t> want = ReferenceGreedy(TinyModelDir(), args);
    ASSERT_EQ(want.size(), 20u);
    StreamResult got = Generate(cluster->router().grpc_address, args);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.tokens, want) << method << ", prompt length " << args.prompt.size();
    EXPECT_EQ(got.finish, tandem::v1::FINISH_REASON_LENGTH);
  }
  std::string why;
  EXPECT_TRUE(WaitForIdle(*cluster, absl::Seconds(2), &why)) << why;
  int decode_workers = 0;
  for (launcher::Process* w : cluster->workers()) {
    if (w->role != "decode") continue;
    ++decode_workers;
    const std::string host_port =
        w->metrics_url.substr(7, w->metrics_url.find('/', 7) - 7);  // http://host:port/metrics
    absl::StatusOr<launcher::HttpResponse> page =
        launcher::HttpGet(host_port, "/metrics", absl::Seconds(5));
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_GT(Metric(page->body, "tandem:spec_decode_num_accepted_tokens_total"), 0) << method;
    EXPECT_GT(Metric(page->body, "tandem_worker_spec_decode_mean_accepted_length"), 1.0) << method;
    // The prefill worker was given the same flags and does not speculate.
  }
  EXPECT_EQ(decode_workers, 1);
  EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
}

TEST(SpecE2E, NgramOnTheDecodeWorkerKeepsGreedyOutput) { ExpectSameAsWithoutSpeculation("ngram"); }

TEST(SpecE2E, DraftOnTheDecodeWorkerKeepsGreedyOutput) { ExpectSameAsWithoutSpeculation("draft"); }

}  // namespace
}  // namespace tandem::e2e
