// n / best_of through the router end to end (real processes on loopback, CPU backend, the tiny
// model), disaggregated (1P1D) and mixed: one request per prompt reaches the workers with the
// other samples as siblings, the prompt is prefilled once (the workers' prompt-token counters move
// by one prompt, not n), and the choices equal, text for text and logprob for logprob, what one
// Engine in this process generates for the same request with engine-level siblings (sample j with
// seed + j). best_of returns the sample with the highest cumulative logprob. max_tokens 1 (every
// sample ends at its first token, sequence 0 on the prefill worker) and a client that goes away
// mid-stream leave no page held on any worker.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/check.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"
#include "tests/http/http_connection.h"
#include "tokenizer/tokenizer.h"

namespace tandem::e2e {
namespace {

using nlohmann::json;

// Generous heartbeats: these tests are about outputs and pages, not failure detection, and
// must not fail because a loaded machine delays a heartbeat.
constexpr char k1P1D[] = R"(
router: {args: [--missed-heartbeats, "60"]}
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
)";
constexpr char kMixed[] = R"(
router: {args: [--missed-heartbeats, "60"]}
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: mixed, count: 1}
)";

constexpr uint64_t kSeed = 4242;

// One sample of the engine-level reference: its tokens, their logprobs and its text.
struct Sample {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::string text;
  double cumulative = 0;
};

// What one Engine generates for `prompt` with `n` samples as siblings of one request (sample j:
// seed kSeed + j), with each token's logprob.
std::vector<Sample> EngineSiblings(const std::vector<int32_t>& prompt, int n, int max_tokens) {
  EngineOptions options;
  options.model_dir = TinyModelDir();
  options.num_pages = 256;
  options.page_size = 16;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  CHECK_OK(engine.status());
  EngineRequest req;
  req.id = "s0";
  req.prompt_tokens = prompt;
  req.sampling.temperature = 0.9f;
  req.sampling.top_p = 0.95f;
  req.sampling.seed = kSeed;
  req.sampling.max_tokens = max_tokens;
  req.sampling.ignore_eos = true;
  req.sampling.logprobs = 0;
  for (int j = 1; j < n; ++j) req.siblings.push_back({absl::StrCat("s", j), kSeed + j});
  CHECK_OK((*engine)->AddRequest(req));
  std::map<std::string, Sample> by_id;
  while ((*engine)->HasWork()) {
    absl::StatusOr<std::vector<RequestOutput>> outs = (*engine)->Step();
    CHECK_OK(outs.status());
    for (const RequestOutput& o : *outs) {
      Sample& s = by_id[o.id];
      s.tokens.insert(s.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      for (const TokenLogprobs& lp : o.logprobs) {
        s.logprobs.push_back(lp.logprob);
        s.cumulative += lp.logprob;
      }
    }
  }
  EXPECT_EQ((*engine)->Stats().num_forked_sequences_total, n - 1);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(TinyModelDir());
  CHECK_OK(tokenizer.status());
  std::vector<Sample> samples;
  for (int j = 0; j < n; ++j) {
    Sample s = by_id[absl::StrCat("s", j)];
    s.text = (*tokenizer)->Decode(s.tokens, /*skip_special_tokens=*/true);
    samples.push_back(std::move(s));
  }
  return samples;
}

int HttpPort(const launcher::Cluster& cluster) {
  // http://host:port/metrics: the router serves the API and /metrics on one port.
  const std::string& url = cluster.router().metrics_url;
  const size_t colon = url.rfind(':');
  int port = 0;
  CHECK(absl::SimpleAtoi(url.substr(colon + 1, url.find('/', colon) - colon - 1), &port)) << url;
  return port;
}

std::string Body(const std::vector<int32_t>& prompt, const std::string& more) {
  return absl::StrCat(R"({"model": "tiny", "prompt": [)", absl::StrJoin(prompt, ","),
                      R"(], "temperature": 0.9, "top_p": 0.95, "ignore_eos": true, "seed": )",
                      kSeed, ", ", more, "}");
}

testing::HttpResult Post(int port, const std::string& body) {
  testing::HttpConnection conn;
  CHECK(conn.Connect(port));
  CHECK(conn.Send(testing::KeepAliveRequest("POST", "/v1/completions", body)));
  std::optional<testing::HttpResult> r = conn.Read(false, absl::Seconds(60));
  CHECK(r.has_value()) << "no answer to " << body;
  return *r;
}

// Every SSE data payload of a streamed body, [DONE] included.
std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    out.push_back(body.substr(at + 6, end - at - 6));
    at = end;
  }
  return out;
}

class SiblingsE2E : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    cluster_ = StartCluster(GetParam());
    ASSERT_NE(cluster_, nullptr);
    port_ = HttpPort(*cluster_);
  }
  void TearDown() override {
    if (cluster_ == nullptr) return;
    std::string why;
    EXPECT_TRUE(WaitForIdle(*cluster_, absl::Seconds(5), &why)) << why;
    EXPECT_TRUE(cluster_->Shutdown(absl::Seconds(20)).ok());
  }
  // Prompt tokens each worker's engine took so far (tandem_worker_prompt_tokens_total).
  std::map<std::string, int64_t> PromptTokens() {
    std::map<std::string, int64_t> out;
    for (launcher::Process* w : cluster_->workers()) {
      out[w->role] = GetLoad(*cluster_, w->grpc_address).num_prompt_tokens_total();
    }
    return out;
  }
  launcher::Process* Worker(const std::string& role) {
    for (launcher::Process* w : cluster_->workers()) {
      if (w->role == role) return w;
    }
    return nullptr;
  }

  std::unique_ptr<launcher::Cluster> cluster_;
  int port_ = 0;
};

TEST_P(SiblingsE2E, NChoicesEqualEngineSiblingsAndThePromptIsPrefilledOnce) {
  // 37 tokens: two full shared pages, the last page (5 tokens) recomputed by each sibling.
  const std::vector<int32_t> prompt = Prompt(37, 5);
  const std::vector<Sample> want = EngineSiblings(prompt, 3, 12);
  EXPECT_FALSE(want[0].tokens == want[1].tokens && want[1].tokens == want[2].tokens)
      << "the samples' seeds changed nothing";
  const std::map<std::string, int64_t> before = PromptTokens();
  testing::HttpResult r = Post(port_, Body(prompt, R"("n": 3, "max_tokens": 12, "logprobs": 0)"));
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.Json();
  ASSERT_EQ(body["choices"].size(), 3u) << r.body;
  for (int j = 0; j < 3; ++j) {
    const json& c = body["choices"][j];
    EXPECT_EQ(c["index"], j);
    EXPECT_EQ(c["text"], want[j].text) << "choice " << j;
    EXPECT_EQ(c["finish_reason"], "length");
    const json& lps = c["logprobs"]["token_logprobs"];
    ASSERT_EQ(lps.size(), want[j].logprobs.size()) << r.body;
    for (size_t i = 0; i < lps.size(); ++i) {
      EXPECT_NEAR(lps[i].get<double>(), want[j].logprobs[i], 1e-4) << "choice " << j << " " << i;
    }
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], 37);
  EXPECT_EQ(body["usage"]["completion_tokens"], 36);
  // The prompt was taken once by each engine that ran it, not once per sample.
  const std::map<std::string, int64_t> after = PromptTokens();
  for (const auto& [role, tokens] : after) {
    EXPECT_EQ(tokens - before.at(role), 37) << role << " worker";
  }

  // Streamed: each choice's chunks carry its index, and the text is the same.
  r = Post(port_, Body(prompt, R"("n": 3, "max_tokens": 12, "stream": true)"));
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> events = SseData(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::map<int, std::string> text;
  std::map<int, int> finishes;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json choice = json::parse(events[i])["choices"][0];
    text[choice["index"].get<int>()] += choice.value("text", "");
    if (!choice["finish_reason"].is_null()) finishes[choice["index"].get<int>()]++;
  }
  EXPECT_EQ(text,
            (std::map<int, std::string>{{0, want[0].text}, {1, want[1].text}, {2, want[2].text}}));
  EXPECT_EQ(finishes, (std::map<int, int>{{0, 1}, {1, 1}, {2, 1}}));
}

TEST_P(SiblingsE2E, BestOfReturnsTheSampleWithTheHighestCumulativeLogprob) {
  // A prompt whose best sample (by the reference) is not sample 0, so that the served answer
  // shows the ranking.
  std::vector<int32_t> prompt;
  std::vector<Sample> want;
  size_t best = 0;
  for (uint32_t p = 9; p < 40 && best == 0; ++p) {
    prompt = Prompt(21, p);
    want = EngineSiblings(prompt, 4, 10);
    for (size_t j = 1; j < want.size(); ++j) {
      if (want[j].cumulative > want[best].cumulative) best = j;
    }
  }
  ASSERT_NE(best, 0u);
  const std::map<std::string, int64_t> before = PromptTokens();
  testing::HttpResult r = Post(port_, Body(prompt, R"("n": 1, "best_of": 4, "max_tokens": 10)"));
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.Json();
  ASSERT_EQ(body["choices"].size(), 1u) << r.body;
  EXPECT_EQ(body["choices"][0]["text"], want[best].text) << "best is sample " << best;
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());  // ranked by them, not asked for
  EXPECT_EQ(body["usage"]["prompt_tokens"], 21);
  const std::map<std::string, int64_t> after = PromptTokens();
  for (const auto& [role, tokens] : after) {
    EXPECT_EQ(tokens - before.at(role), 21) << role << " worker";
  }
  // n = 2 of best_of 4: the two best, best first.
  std::vector<const Sample*> order;
  for (const Sample& s : want) order.push_back(&s);
  std::stable_sort(order.begin(), order.end(),
                   [](const Sample* a, const Sample* b) { return a->cumulative > b->cumulative; });
  r = Post(port_, Body(prompt, R"("n": 2, "best_of": 4, "max_tokens": 10)"));
  ASSERT_EQ(r.status, 200) << r.body;
  body = r.Json();
  ASSERT_EQ(body["choices"].size(), 2u) << r.body;
  EXPECT_EQ(body["choices"][0]["text"], order[0]->text);
  EXPECT_EQ(body["choices"][1]["text"], order[1]->text);
}

TEST_P(SiblingsE2E, EverySampleEndingAtItsFirstTokenStillForksTheOthers) {
  // max_tokens 1: sequence 0 ends on the prefill worker (disaggregated), whose KV still goes to
  // the decode worker for the siblings.
  const std::vector<int32_t> prompt = Prompt(50, 13);
  const std::vector<Sample> want = EngineSiblings(prompt, 3, 1);
  testing::HttpResult r = Post(port_, Body(prompt, R"("n": 3, "max_tokens": 1)"));
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.Json();
  ASSERT_EQ(body["choices"].size(), 3u) << r.body;
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(body["choices"][j]["text"], want[j].text) << j;
    EXPECT_EQ(body["choices"][j]["finish_reason"], "length") << j;
  }
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);
}

TEST_P(SiblingsE2E, AClientGoingAwayReleasesEverySiblingsPages) {
  const std::vector<int32_t> prompt = Prompt(40, 17);
  testing::HttpConnection conn;
  ASSERT_TRUE(conn.Connect(port_));
  ASSERT_TRUE(conn.Send(testing::KeepAliveRequest(
      "POST", "/v1/completions", Body(prompt, R"("n": 3, "max_tokens": 400, "stream": true)"))));
  // All three samples run on the decoding worker, holding pages.
  launcher::Process* decoding = Worker(std::string(GetParam()) == kMixed ? "mixed" : "decode");
  ASSERT_NE(decoding, nullptr);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  tandem::v1::LoadReport load;
  while (absl::Now() < deadline) {
    load = GetLoad(*cluster_, decoding->grpc_address);
    if (load.num_running() == 3) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_EQ(load.num_running(), 3) << conn.ReadFor(absl::Milliseconds(200));
  EXPECT_GT(load.num_pages_owned(), 0);
  conn.Close();
  // TearDown: every worker idle, no page reserved or owned, within 5 s.
}

INSTANTIATE_TEST_SUITE_P(Layouts, SiblingsE2E, ::testing::Values(k1P1D, kMixed),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == k1P1D ? "OneP1D" : "Mixed";
                         });

}  // namespace
}  // namespace tandem::e2e
