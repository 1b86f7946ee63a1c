// Sampling options end to end on loopback with real processes (router -> prefill -> KV transfer
// -> decode): each option reaches both workers (the prefill worker samples the first token, the
// decode worker the rest, with the penalty history of prompt + first token) and the stream
// equals, token for token and logprob for logprob, what one Engine in this process generates
// with the same parameters (`tandem generate`'s path). Also: logit_bias +100 forces a token,
// min_tokens suppresses a stop token (on the prefill worker's first token too), stop_reason
// names the stop token or string, include_stop_str_in_output keeps the stop string.
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem::e2e {
namespace {

constexpr char k1P1D[] = R"(
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
)";

class SamplingE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = StartCluster(k1P1D).release();
    ASSERT_NE(cluster_, nullptr);
  }
  static void TearDownTestSuite() {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Shutdown(absl::Seconds(20)).ok());
    }
    delete cluster_;
    cluster_ = nullptr;
  }
  void TearDown() override {
    std::string why;
    EXPECT_TRUE(WaitForIdle(*cluster_, absl::Seconds(2), &why)) << why;
  }

  static StreamResult Run(const GenerateArgs& args) {
    StreamResult r = Generate(cluster_->router().grpc_address, args);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return r;
  }

  // Served (disaggregated) output equals the single engine's for the same parameters; returns
  // the served result.
  static StreamResult ExpectSameAsEngine(const std::vector<int32_t>& prompt, int max_tokens,
                                         const SamplingParams& ref,
                                         const std::function<void(v1::SamplingOptions&)>& set) {
    GenerateArgs args;
    args.prompt = prompt;
    args.max_tokens = max_tokens;
    args.ignore_eos = ref.ignore_eos;
    args.sampling = set;
    StreamResult got = Run(args);
    SamplingParams params = ref;
    params.max_tokens = max_tokens;
    const ReferenceResult want = Reference(TinyModelDir(), prompt, params);
    EXPECT_EQ(got.tokens, want.tokens);
    if (params.logprobs >= 0) {
      EXPECT_EQ(got.logprobs.size(), want.tokens.size());
      for (size_t i = 0; i < std::min(got.logprobs.size(), want.logprobs.size()); ++i) {
        EXPECT_NEAR(got.logprobs[i].logprob(), want.logprobs[i].logprob, 1e-5) << "token " << i;
        EXPECT_EQ(got.logprobs[i].top_size(), static_cast<int>(want.logprobs[i].top.size()));
        const int n =
            std::min(got.logprobs[i].top_size(), static_cast<int>(want.logprobs[i].top.size()));
        for (int k = 0; k < n; ++k) {
          EXPECT_EQ(got.logprobs[i].top(k).token_id(), want.logprobs[i].top[k].first);
          EXPECT_NEAR(got.logprobs[i].top(k).logprob(), want.logprobs[i].top[k].second, 1e-5);
        }
      }
    } else {
      EXPECT_TRUE(got.logprobs.empty());
    }
    return got;
  }

  static launcher::Cluster* cluster_;
};

launcher::Cluster* SamplingE2E::cluster_ = nullptr;

TEST_F(SamplingE2E, SeededSamplingWithTopKTopPMinPMatchesTheEngine) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.02f;
  p.seed = 1234;
  p.ignore_eos = true;
  const StreamResult got = ExpectSameAsEngine(Prompt(30, 1), 16, p, [](v1::SamplingOptions& o) {
    o.set_temperature(0.9f);
    o.set_top_k(40);
    o.set_top_p(0.9f);
    o.set_min_p(0.02f);
    o.set_seed(1234);
  });
  // Another seed samples something else (the seed reaches the workers).
  SamplingParams other = p;
  other.seed = 99;
  other.max_tokens = 16;
  EXPECT_NE(Reference(TinyModelDir(), Prompt(30, 1), other).tokens, got.tokens);
}

TEST_F(SamplingE2E, PenaltiesMatchTheEngineAndChangeTheOutput) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.presence_penalty = 1.5f;
  p.frequency_penalty = 1.0f;
  p.repetition_penalty = 1.3f;
  const std::vector<int32_t> prompt = Prompt(12, 7);
  const StreamResult got = ExpectSameAsEngine(prompt, 24, p, [](v1::SamplingOptions& o) {
    o.set_presence_penalty(1.5f);
    o.set_frequency_penalty(1.0f);
    o.set_repetition_penalty(1.3f);
  });
  GenerateArgs plain;
  plain.prompt = prompt;
  plain.max_tokens = 24;
  EXPECT_NE(Run(plain).tokens, got.tokens) << "the penalties changed nothing";
  // Each penalty alone, too (each one has its own path through the proto).
  for (int which = 0; which < 3; ++which) {
    SamplingParams one;
    one.temperature = 0.0f;
    one.ignore_eos = true;
    (which == 0   ? one.presence_penalty
     : which == 1 ? one.frequency_penalty
                  : one.repetition_penalty) = 1.8f;
    ExpectSameAsEngine(prompt, 24, one, [which](v1::SamplingOptions& o) {
      if (which == 0) o.set_presence_penalty(1.8f);
      if (which == 1) o.set_frequency_penalty(1.8f);
      if (which == 2) o.set_repetition_penalty(1.8f);
    });
  }
}

TEST_F(SamplingE2E, LogitBiasForcesAToken) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.logit_bias = {{123, 100.0f}};
  const StreamResult got = ExpectSameAsEngine(
      Prompt(20, 3), 6, p, [](v1::SamplingOptions& o) { (*o.mutable_logit_bias())[123] = 100.0f; });
  EXPECT_EQ(got.tokens, std::vector<int32_t>(6, 123));  // the first one from the prefill worker
  // -100 bans the token greedy decoding would pick first.
  GenerateArgs plain;
  plain.prompt = Prompt(20, 3);
  plain.max_tokens = 1;
  const int32_t first = Run(plain).tokens.at(0);
  SamplingParams ban;
  ban.temperature = 0.0f;
  ban.ignore_eos = true;
  ban.logit_bias = {{first, -100.0f}};
  const StreamResult banned = ExpectSameAsEngine(
      Prompt(20, 3), 4, ban,
      [first](v1::SamplingOptions& o) { (*o.mutable_logit_bias())[first] = -100.0f; });
  EXPECT_NE(banned.tokens.at(0), first);
}

TEST_F(SamplingE2E, MinTokensSuppressesAStopTokenOnBothWorkers) {
  GenerateArgs plain;
  plain.prompt = Prompt(25, 11);
  plain.max_tokens = 8;
  const std::vector<int32_t> free_running = Run(plain).tokens;
  ASSERT_EQ(free_running.size(), 8u);
  // The first token as a stop token: the request ends on the prefill worker...
  const int32_t stop = free_running[0];
  plain.sampling = [stop](v1::SamplingOptions& o) { o.add_stop_token_ids(stop); };
  StreamResult stopped = Run(plain);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>{stop});
  EXPECT_EQ(stopped.finish, v1::FINISH_REASON_STOP);
  EXPECT_EQ(stopped.last.stop_token_id(), stop);
  // ...unless min_tokens bans it: for the first token (prefill) and the next ones (decode).
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.stop_token_ids = {stop};
  p.min_tokens = 5;
  const StreamResult got = ExpectSameAsEngine(plain.prompt, 8, p, [stop](v1::SamplingOptions& o) {
    o.add_stop_token_ids(stop);
    o.set_min_tokens(5);
  });
  ASSERT_GE(got.tokens.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_NE(got.tokens[i], stop) << i;
}

TEST_F(SamplingE2E, LogprobsMatchTheEngine) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.ignore_eos = true;
  p.logprobs = 5;
  const StreamResult got =
      ExpectSameAsEngine(Prompt(40, 5), 10, p, [](v1::SamplingOptions& o) { o.set_logprobs(5); });
  ASSERT_EQ(got.logprobs.size(), 10u);
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    // Greedy: the sampled token is the most likely one.
    EXPECT_EQ(got.logprobs[i].top(0).token_id(), got.tokens[i]);
    EXPECT_FLOAT_EQ(got.logprobs[i].top(0).logprob(), got.logprobs[i].logprob());
    EXPECT_LE(got.logprobs[i].logprob(), 0.0f);
  }
  // Sampled (seeded, temperature 0.7) with penalties: still the engine's values.
  SamplingParams s = p;
  s.temperature = 0.7f;
  s.seed = 5;
  s.frequency_penalty = 0.5f;
  s.logprobs = 3;
  ExpectSameAsEngine(Prompt(40, 5), 10, s, [](v1::SamplingOptions& o) {
    o.set_temperature(0.7f);
    o.set_seed(5);
    o.set_frequency_penalty(0.5f);
    o.set_logprobs(3);
  });
}

TEST_F(SamplingE2E, StopStringReasonAndIncludeStopStrInOutput) {
  GenerateArgs args;
  args.max_tokens = 16;
  std::string stop, before;
  for (uint32_t seed = 1; seed < 100 && stop.empty(); ++seed) {
    args.prompt = Prompt(10, seed);
    const StreamResult free_running = Run(args);
    const std::vector<std::string_view> chars = utf8::SplitChars(free_running.text);
    if (!utf8::IsValid(free_running.text) || chars.size() < 8) continue;
    // Two characters from the middle whose first occurrence is there.
    size_t at = 0;
    for (size_t i = 0; i < 4; ++i) at += chars[i].size();
    const std::string candidate = std::string(chars[4]) + std::string(chars[5]);
    if (free_running.text.find(candidate) == at) {
      stop = candidate;
      before = free_running.text.substr(0, at);
    }
  }
  ASSERT_FALSE(stop.empty()) << "no prompt gave text to stop in";
  args.stop = {"never-in-the-output-\x01", stop};
  StreamResult cut = Run(args);
  EXPECT_EQ(cut.finish, v1::FINISH_REASON_STOP);
  EXPECT_EQ(cut.text, before);
  EXPECT_EQ(cut.last.stop_string(), stop);
  args.sampling = [](v1::SamplingOptions& o) { o.set_include_stop_str_in_output(true); };
  StreamResult kept = Run(args);
  EXPECT_EQ(kept.finish, v1::FINISH_REASON_STOP);
  EXPECT_EQ(kept.text, before + stop);
  EXPECT_EQ(kept.last.stop_string(), stop);
  EXPECT_EQ(kept.tokens, cut.tokens);
}

// The mixed role (one worker, Generate) takes the same options.
TEST(SamplingE2EMixed, OptionsAndLogprobsMatchTheEngine) {
  std::unique_ptr<launcher::Cluster> cluster = StartCluster(R"(
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: mixed, count: 1}
)");
  ASSERT_NE(cluster, nullptr);
  GenerateArgs args;
  args.prompt = Prompt(30, 9);
  args.max_tokens = 12;
  args.sampling = [](v1::SamplingOptions& o) {
    o.set_temperature(0.8f);
    o.set_seed(77);
    o.set_min_p(0.05f);
    o.set_presence_penalty(1.0f);
    o.set_repetition_penalty(1.2f);
    (*o.mutable_logit_bias())[42] = 3.0f;
    o.set_logprobs(2);
  };
  StreamResult got = Generate(cluster->router().grpc_address, args);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 77;
  p.min_p = 0.05f;
  p.presence_penalty = 1.0f;
  p.repetition_penalty = 1.2f;
  p.logit_bias = {{42, 3.0f}};
  p.logprobs = 2;
  p.ignore_eos = true;
  p.max_tokens = 12;
  const ReferenceResult want = Reference(TinyModelDir(), args.prompt, p);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < want.logprobs.size(); ++i) {
    EXPECT_NEAR(got.logprobs[i].logprob(), want.logprobs[i].logprob, 1e-5) << i;
    ASSERT_EQ(got.logprobs[i].top_size(), 2);
    EXPECT_EQ(got.logprobs[i].top(1).token_id(), want.logprobs[i].top[1].first) << i;
  }
  EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
}

TEST_F(SamplingE2E, OutOfRangeOptionsAreRejected) {
  GenerateArgs args;
  args.prompt = Prompt(5, 1);
  for (const auto& set : std::vector<std::function<void(v1::SamplingOptions&)>>{
           [](v1::SamplingOptions& o) { o.set_min_p(1.5f); },
           [](v1::SamplingOptions& o) { o.set_presence_penalty(3.0f); },
           [](v1::SamplingOptions& o) { o.set_repetition_penalty(0.0f); },
           [](v1::SamplingOptions& o) { o.set_min_tokens(100); },
           [](v1::SamplingOptions& o) { (*o.mutable_logit_bias())[5] = 101.0f; },
           [](v1::SamplingOptions& o) { (*o.mutable_logit_bias())[1 << 30] = 1.0f; },
           [](v1::SamplingOptions& o) { o.set_logprobs(21); },
       }) {
    args.sampling = set;
    StreamResult r = Generate(cluster_->router().grpc_address, args);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << r.status.error_message();
  }
}

}  // namespace
}  // namespace tandem::e2e
