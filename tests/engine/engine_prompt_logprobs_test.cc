// Prompt logprobs (SamplingParams::prompt_logprobs, vLLM's field) through the engine on the CPU
// backend over a generated checkpoint, against an independent computation: the model's logits of
// every prompt row in one ComputeLogits pass over a fresh pool (no engine, no chunking), then the
// log-softmax in double here. Covered: chunked prefill (prompts longer than the step budget, and
// positions split across steps), a batch with other requests that ask for none, a prompt after a
// cached copy of itself (the cache is skipped), preemption (each position kept once), siblings
// (n = 2: both carry them), a prefill-only request (the first token carries them, as it travels to
// the router), and out-of-range values.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

// Per prompt position p < n - 1: the reference log-softmax row of position p.
std::vector<std::vector<double>> ReferenceLogSoftmax(const std::string& dir,
                                                     const std::vector<int32_t>& prompt) {
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(dir, Backend::kCpu);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  const int page_size = 16;
  const int n = static_cast<int>(prompt.size());
  const int pages = (n + page_size - 1) / page_size;
  KvLayout layout = (*model)->KvPoolLayout(page_size);
  layout.num_pages = pages;
  std::vector<char> pool(layout.PoolBytes());
  StepInputs in;
  in.num_seqs = 1;
  in.num_tokens = n;
  in.max_pages_per_seq = pages;
  in.query_start = {0, n};
  in.seq_lens = {n};
  for (int p = 0; p < pages; ++p) in.block_tables.push_back(p);
  for (int p = 0; p < n; ++p) {
    in.token_ids.push_back(prompt[p]);
    in.positions.push_back(p);
    in.slot_mapping.push_back(p);
    in.logits_rows.push_back(p);
  }
  const int64_t vocab = (*model)->config().vocab_size;
  std::vector<float> logits(static_cast<size_t>(n) * vocab);
  const absl::Status st = (*model)->ComputeLogits(in, layout, pool.data(), logits.data());
  EXPECT_TRUE(st.ok()) << st;
  std::vector<std::vector<double>> out;
  for (int p = 0; p + 1 < n; ++p) {
    const float* row = logits.data() + static_cast<size_t>(p) * vocab;
    const double m = *std::max_element(row, row + vocab);
    double s = 0;
    for (int64_t i = 0; i < vocab; ++i) s += std::exp(double{row[i]} - m);
    std::vector<double> lp(vocab);
    for (int64_t i = 0; i < vocab; ++i) lp[i] = double{row[i]} - m - std::log(s);
    out.push_back(std::move(lp));
  }
  return out;
}

class PromptLogprobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/engine_prompt_logprobs";
    MakeModelOptions make;
    make.preset = "tiny";
    make.out_dir = dir_;
    make.seed = 11;
    absl::StatusOr<ModelConfig> config = MakeModel(make);
    ASSERT_TRUE(config.ok()) << config.status();
    vocab_ = config->vocab_size;
  }

  std::unique_ptr<Engine> Make(int num_pages, int budget, bool prefix_caching = true,
                               int max_seqs = 256, int tp = 1, int pp = 1) {
    EngineOptions o;
    o.tensor_parallel = tp;
    o.pipeline_parallel = pp;
    o.max_num_seqs = max_seqs;
    o.model_dir = dir_;
    o.page_size = 4;
    o.num_pages = num_pages;
    o.max_num_batched_tokens = budget;
    o.enable_prefix_caching = prefix_caching;
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }

  // Steps to completion; every output kept.
  std::map<std::string, std::vector<RequestOutput>> Run(Engine& engine) {
    std::map<std::string, std::vector<RequestOutput>> out;
    for (int i = 0; i < 10000 && engine.HasWork(); ++i) {
      absl::StatusOr<std::vector<RequestOutput>> step = engine.Step();
      EXPECT_TRUE(step.ok()) << step.status();
      if (!step.ok()) break;
      for (RequestOutput& o : *step) out[o.id].push_back(std::move(o));
    }
    return out;
  }

  // The prompt logprobs of `outputs` (exactly one output carries them: the first token's) equal
  // the reference: the target's logprob and the top `top` tokens in order.
  void ExpectMatches(const std::vector<RequestOutput>& outputs, const std::vector<int32_t>& prompt,
                     int top, const std::string& what) {
    SCOPED_TRACE(what);
    const std::vector<std::vector<double>> want = ReferenceLogSoftmax(dir_, prompt);
    int carriers = 0;
    for (const RequestOutput& o : outputs) {
      if (o.prompt_logprobs.empty()) continue;
      ++carriers;
      EXPECT_FALSE(o.new_tokens.empty());  // with the first token
      ASSERT_EQ(o.prompt_logprobs.size(), prompt.size() - 1);
      for (size_t p = 0; p + 1 < prompt.size(); ++p) {
        const TokenLogprobs& got = o.prompt_logprobs[p];
        EXPECT_NEAR(got.logprob, want[p][prompt[p + 1]], 1e-4) << "position " << p;
        ASSERT_EQ(got.top.size(), static_cast<size_t>(top)) << p;
        std::vector<int32_t> order(vocab_);
        for (int i = 0; i < vocab_; ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(),
                         [&](int32_t a, int32_t b) { return want[p][a] > want[p][b]; });
        for (int k = 0; k < top; ++k) {
          // A near tie may order two ids either way; the value must match in any case.
          EXPECT_NEAR(got.top[k].second, want[p][order[k]], 1e-4) << p << " top " << k;
          EXPECT_NEAR(got.top[k].second, want[p][got.top[k].first], 1e-4) << p << " top " << k;
        }
      }
    }
    EXPECT_EQ(carriers, prompt.size() > 1 ? 1 : 0);
  }

  std::string dir_;
  int vocab_ = 0;
};

// max_num_seqs 3: the backend's logits buffers hold 3 rows, so a step's up to 24 prompt rows
// go through them 3 at a time.
TEST_F(PromptLogprobsTest, ChunkedPrefillInABatchMatchesTheModelsLogSoftmax) {
  for (int max_seqs : {256, 3}) {
    SCOPED_TRACE(max_seqs);
    std::unique_ptr<Engine> engine = Make(1024, /*budget=*/24, true, max_seqs);
    // 61 and 37 tokens against a budget of 24: three and two chunks, scheduled together with a
    // request that asks for none.
    const std::vector<int32_t> a = RandomPrompt(61, vocab_, 1), b = RandomPrompt(37, vocab_, 2);
    EngineRequest ra = Request("a", a, 3), rb = Request("b", b, 2),
                  rc = Request("c", RandomPrompt(30, vocab_, 3), 4);
    ra.sampling.prompt_logprobs = 5;
    rb.sampling.prompt_logprobs = 0;
    rb.sampling.logprobs = 2;  // sampled-token logprobs alongside
    ASSERT_TRUE(engine->AddRequest(ra).ok());
    ASSERT_TRUE(engine->AddRequest(rb).ok());
    ASSERT_TRUE(engine->AddRequest(rc).ok());
    auto out = Run(*engine);
    ExpectMatches(out["a"], a, 5, "a");
    ExpectMatches(out["b"], b, 0, "b");
    for (const RequestOutput& o : out["c"]) EXPECT_TRUE(o.prompt_logprobs.empty());
    ExpectIdle(*engine);
  }
}

// A group of ranks (TP 2, and TP 2 x PP 2): only the sampling rank scores the prompt rows.
TEST_F(PromptLogprobsTest, ParallelGroupsMatchTheModelsLogSoftmax) {
  for (auto [tp, pp] : {std::pair{2, 1}, std::pair{2, 2}}) {
    SCOPED_TRACE(::testing::Message() << "TP " << tp << " PP " << pp);
    std::unique_ptr<Engine> engine = Make(256, /*budget=*/16, true, 256, tp, pp);
    ASSERT_NE(engine, nullptr);
    const std::vector<int32_t> prompt = RandomPrompt(41, vocab_, 8);
    EngineRequest r = Request("tp", prompt, 2);
    r.sampling.prompt_logprobs = 3;
    ASSERT_TRUE(engine->AddRequest(r).ok());
    auto out = Run(*engine);
    ExpectMatches(out["tp"], prompt, 3, "parallel");
    ExpectIdle(*engine);
  }
}

// Draft-model speculation at temperature 1 draws its proposals, so their verify steps are
// sampled on the host (ModelRunner::Run): a prompt chunk in such a step is scored there too.
TEST_F(PromptLogprobsTest, NextToADrawnVerifyStep) {
  EngineOptions o;
  o.model_dir = dir_;
  o.page_size = 4;
  o.num_pages = 512;
  o.max_num_batched_tokens = 16;
  o.speculative.method = SpecMethod::kDraft;
  o.speculative.num_speculative_tokens = 3;
  o.speculative.draft_model = dir_;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EngineRequest decoding = Request("decoding", RandomPrompt(9, vocab_, 30), 60, 1.0f);
  decoding.sampling.ignore_eos = true;
  ASSERT_TRUE((*engine)->AddRequest(decoding).ok());
  std::map<std::string, std::vector<RequestOutput>> out;
  for (int i = 0; i < 4; ++i) {  // it decodes (and speculates) before the next one arrives
    absl::StatusOr<std::vector<RequestOutput>> step = (*engine)->Step();
    ASSERT_TRUE(step.ok()) << step.status();
    for (RequestOutput& r : *step) out[r.id].push_back(std::move(r));
  }
  ASSERT_FALSE(out["decoding"].empty());
  const int64_t drafts = (*engine)->Stats().spec_decode_num_drafts;
  EXPECT_GT(drafts, 0);
  const std::vector<int32_t> prompt = RandomPrompt(37, vocab_, 31);
  EngineRequest r = Request("plp", prompt, 2);
  r.sampling.prompt_logprobs = 2;
  ASSERT_TRUE((*engine)->AddRequest(r).ok());
  for (auto& [id, outputs] : Run(**engine)) {
    for (RequestOutput& x : outputs) out[id].push_back(std::move(x));
  }
  EXPECT_GT((*engine)->Stats().spec_decode_num_drafts, drafts) << "no verify beside the prompt";
  ExpectMatches(out["plp"], prompt, 2, "beside a drawn verify step");
}

TEST_F(PromptLogprobsTest, OneTokenPromptHasNone) {
  std::unique_ptr<Engine> engine = Make(64, 32);
  EngineRequest r = Request("one", {5}, 2);
  r.sampling.prompt_logprobs = 3;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  auto out = Run(*engine);
  for (const RequestOutput& o : out["one"]) EXPECT_TRUE(o.prompt_logprobs.empty());
  EXPECT_EQ(out["one"].back().finish_reason, FinishReason::kLength);
}

// The second run of a prompt would hit the prefix cache; one that asks for prompt logprobs
// computes every page instead (and reports no cached tokens).
TEST_F(PromptLogprobsTest, PrefixCacheIsSkipped) {
  std::unique_ptr<Engine> engine = Make(256, 64);
  const std::vector<int32_t> prompt = RandomPrompt(40, vocab_, 4);
  ASSERT_TRUE(engine->AddRequest(Request("warm", prompt, 1)).ok());
  Run(*engine);
  EngineRequest cached = Request("cached", prompt, 1);
  ASSERT_TRUE(engine->AddRequest(cached).ok());
  auto hit = Run(*engine);
  ASSERT_FALSE(hit["cached"].empty());
  EXPECT_GT(hit["cached"].front().num_cached_tokens, 0);  // the cache works
  EngineRequest r = Request("lp", prompt, 1);
  r.sampling.prompt_logprobs = 2;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  auto out = Run(*engine);
  ASSERT_FALSE(out["lp"].empty());
  EXPECT_EQ(out["lp"].front().num_cached_tokens, 0);
  ExpectMatches(out["lp"], prompt, 2, "after a cached copy");
  ExpectIdle(*engine);
}

// Few pages: prompts are preempted and recomputed; each position is reported once and right.
TEST_F(PromptLogprobsTest, PreemptedPromptsReportEachPositionOnce) {
  std::unique_ptr<Engine> engine = Make(/*num_pages=*/30, /*budget=*/16, false);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(RandomPrompt(33 + 7 * i, vocab_, 20 + i));
    EngineRequest r = Request("p" + std::to_string(i), prompts.back(), 20);
    r.sampling.prompt_logprobs = 1;
    r.sampling.ignore_eos = true;
    ASSERT_TRUE(engine->AddRequest(r).ok());
  }
  auto out = Run(*engine);
  EXPECT_GT(engine->Stats().num_preemptions_total, 0) << "the test needs preemption";
  for (int i = 0; i < 4; ++i) {
    ExpectMatches(out["p" + std::to_string(i)], prompts[i], 1, "p" + std::to_string(i));
  }
  ExpectIdle(*engine);
}

TEST_F(PromptLogprobsTest, SiblingsAndPrefillOnlyRequestsCarryThem) {
  std::unique_ptr<Engine> engine = Make(512, 20);
  const std::vector<int32_t> prompt = RandomPrompt(45, vocab_, 5);
  EngineRequest r = Request("n", prompt, 3, 1.0f);
  r.sampling.prompt_logprobs = 4;
  r.siblings.push_back(SiblingRequest{"n.1", 99});
  ASSERT_TRUE(engine->AddRequest(r).ok());
  EngineRequest p = Request("prefill", prompt, 8);
  p.sampling.prompt_logprobs = 4;
  p.prefill_only = true;
  ASSERT_TRUE(engine->AddRequest(p).ok());
  auto out = Run(*engine);
  ExpectMatches(out["n"], prompt, 4, "parent");
  ExpectMatches(out["n.1"], prompt, 4, "sibling");
  ASSERT_EQ(out["prefill"].size(), 1u);
  EXPECT_EQ(out["prefill"][0].finish_reason, FinishReason::kPrefillDone);
  ExpectMatches(out["prefill"], prompt, 4, "prefill only");
  ASSERT_TRUE(engine->ReleaseRequest("prefill").ok());
  ExpectIdle(*engine);
}

TEST_F(PromptLogprobsTest, OutOfRangeIsRefused) {
  std::unique_ptr<Engine> engine = Make(64, 32);
  for (int bad : {-2, kMaxTopLogprobs + 1}) {
    EngineRequest r = Request("bad" + std::to_string(bad), {1, 2, 3}, 1);
    r.sampling.prompt_logprobs = bad;
    const absl::Status st = engine->AddRequest(r);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("prompt_logprobs must be in [0, 20]"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace tandem::testing
