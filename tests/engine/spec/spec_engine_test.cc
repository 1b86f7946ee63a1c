// Speculative decoding in the engine over the FakeModel (tests/engine/fake_model.h, whose logits
// depend on every token it reads back from the paged KV, so a wrong rollback changes the tokens
// or fails the step): greedy output identical with and without speculation for 64 mixed
// requests and both proposers (stop tokens, EOS, max_tokens, min_tokens, penalties, logit bias,
// logprobs, chunked prefill beside verify steps, preemption), seeded sampled requests with n-gram
// proposals identical too, abort mid-speculation, bad settings. Every test ends with every page
// of both pools free.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

constexpr int kVocab = 101;
constexpr int kEos = 3;

struct Result {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  FinishReason reason = FinishReason::kNone;
  int terminal_events = 0;
};

EngineOptions Options(SpecMethod method, int k = 4) {
  EngineOptions o;
  o.page_size = 4;
  o.num_pages = 2048;
  o.max_num_seqs = 32;
  o.max_num_batched_tokens = 64;
  o.speculative.method = method;
  o.speculative.num_speculative_tokens = method == SpecMethod::kNone ? 0 : k;
  o.speculative.prompt_lookup_min = 1;
  o.speculative.prompt_lookup_max = 3;
  if (method == SpecMethod::kDraft) o.speculative.draft_model = "given";  // handed over, not read
  return o;
}

FakeModel::Options Model(FakeModel::Mode mode, uint64_t salt = 0) {
  FakeModel::Options m;
  m.mode = mode;
  m.vocab_size = kVocab;
  m.eos_token_ids = {kEos};
  m.salt = salt;
  return m;
}

// A prompt that repeats a short pattern (n-gram lookup finds matches), or one ascending run
// (what kCount's argmax continues), or random tokens.
std::vector<int32_t> Prompt(int i) {
  const int len = 1 + (i * 37) % 120;
  std::vector<int32_t> p;
  if (i % 3 == 0) {
    for (int j = 0; j < len; ++j) p.push_back(10 + (j % (2 + i % 5)) * 7);
  } else if (i % 3 == 1) {
    for (int j = 0; j < len; ++j) p.push_back((20 + i + j) % kVocab);
  } else {
    p = RandomPrompt(len, kVocab, 1000 + i);
  }
  for (int32_t& t : p) {
    if (t == kEos) t = kEos + 1;  // the prompt itself is free to hold EOS; keep outputs long
  }
  return p;
}

// 64 greedy requests with every per-request feature that changes what the next token is or when
// a request stops.
std::vector<EngineRequest> Requests(float temperature = 0.0f) {
  std::vector<EngineRequest> out;
  for (int i = 0; i < 64; ++i) {
    EngineRequest r = Request("r" + std::to_string(i), Prompt(i), 1 + (i * 13) % 40, temperature);
    SamplingParams& s = r.sampling;
    s.seed = 500 + i;
    switch (i % 8) {
      case 1:
        s.stop_token_ids = {static_cast<int32_t>((i * 7) % kVocab), 50};
        break;
      case 2:
        s.min_tokens = std::min(s.max_tokens, 6);
        break;
      case 3:
        s.frequency_penalty = 0.3f;
        s.repetition_penalty = 1.3f;
        break;
      case 4:
        s.presence_penalty = 0.5f;
        s.logit_bias = {{static_cast<int32_t>(i % kVocab), 0.4f}};
        break;
      case 5:
        s.logprobs = 3;
        break;
      case 6:
        s.ignore_eos = true;
        break;
      default:
        break;
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::map<std::string, Result> RunAll(Engine& engine, const std::vector<EngineRequest>& requests) {
  for (const EngineRequest& r : requests) EXPECT_TRUE(engine.AddRequest(r).ok()) << r.id;
  std::map<std::string, Result> results;
  for (int step = 0; step < 100000 && engine.HasWork(); ++step) {
    absl::StatusOr<std::vector<RequestOutput>> outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) break;
    for (const RequestOutput& o : *outputs) {
      Result& r = results[o.id];
      EXPECT_EQ(r.terminal_events, 0) << o.id << " has output after finishing";
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      r.logprobs.insert(r.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      if (o.finish_reason != FinishReason::kNone) {
        r.reason = o.finish_reason;
        ++r.terminal_events;
      }
    }
  }
  EXPECT_FALSE(engine.HasWork());
  return results;
}

// Every page of the target's pool and of the draft's is free.
void ExpectAllFree(Engine& engine) {
  ExpectIdle(engine);
  const EngineStats s = engine.Stats();
  EXPECT_EQ(s.num_draft_pages_free, s.num_draft_pages_total) << "draft KV pages leaked";
}

void ExpectSame(const std::map<std::string, Result>& got,
                const std::map<std::string, Result>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, w] : want) {
    ASSERT_TRUE(got.contains(id)) << id;
    const Result& g = got.at(id);
    EXPECT_EQ(g.tokens, w.tokens) << id;
    EXPECT_EQ(g.reason, w.reason) << id;
    EXPECT_EQ(g.terminal_events, 1) << id;
    ASSERT_EQ(g.logprobs.size(), w.logprobs.size()) << id;
    for (size_t i = 0; i < w.logprobs.size(); ++i) {
      EXPECT_EQ(g.logprobs[i].logprob, w.logprobs[i].logprob) << id << " token " << i;
      EXPECT_EQ(g.logprobs[i].top, w.logprobs[i].top) << id << " token " << i;
    }
  }
}

std::unique_ptr<Engine> MakeSpecEngine(const EngineOptions& options,
                                       const FakeModel::Options& target,
                                       const FakeModel::Options& draft) {
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::CreateWithModel(
      options, std::make_unique<FakeModel>(target),
      options.speculative.method == SpecMethod::kDraft ? std::make_unique<FakeModel>(draft)
                                                       : nullptr);
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

std::map<std::string, Result> Baseline(const EngineOptions& options,
                                       const FakeModel::Options& model,
                                       const std::vector<EngineRequest>& requests) {
  EngineOptions off = options;
  off.speculative = SpeculativeConfig();
  std::unique_ptr<Engine> engine = MakeEngine(off, model);
  std::map<std::string, Result> results = RunAll(*engine, requests);
  ExpectAllFree(*engine);
  return results;
}

struct GreedyCase {
  const char* name;
  SpecMethod method;
  FakeModel::Mode mode;
  uint64_t draft_salt;  // the draft's: 0 is the target itself
  // The draft's FakeModel count_skip_period. A kCount draft that differs only by its salt
  // disagrees with the target only where an EOS ban or a penalty lowers the count token (one
  // position of these requests), which a schedule may never propose at: with the prefix cache
  // on, prompts finish sooner, the draft catches up later and that position was decoded before
  // the first proposal, so every proposal was accepted and the rejection path went untested.
  int draft_skip_period = 0;
};

class SpecGreedyTest : public ::testing::TestWithParam<GreedyCase> {};

TEST_P(SpecGreedyTest, SameTokensAsWithoutSpeculation) {
  const GreedyCase& c = GetParam();
  // Prefix caching is on (the default): shared-pattern prompts hit each other's pages.
  const EngineOptions options = Options(c.method);
  ASSERT_TRUE(options.enable_prefix_caching);
  const std::vector<EngineRequest> requests = Requests();
  const std::map<std::string, Result> want = Baseline(options, Model(c.mode), requests);

  FakeModel::Options draft = Model(c.mode, c.draft_salt);
  draft.count_skip_period = c.draft_skip_period;
  std::unique_ptr<Engine> engine = MakeSpecEngine(options, Model(c.mode), draft);
  ExpectSame(RunAll(*engine, requests), want);
  const EngineStats s = engine->Stats();
  // It really speculated, and accepted some of it; the counters add up.
  EXPECT_GT(s.spec_decode_num_drafts, 0);
  EXPECT_GT(s.spec_decode_num_accepted_tokens, 0);
  EXPECT_LE(s.spec_decode_num_accepted_tokens, s.spec_decode_num_draft_tokens);
  EXPECT_LE(s.spec_decode_num_emitted_tokens,
            s.spec_decode_num_accepted_tokens + s.spec_decode_num_drafts);
  EXPECT_LT(s.num_steps_total, 1000);
  if (c.method == SpecMethod::kDraft && c.draft_salt == 0) {
    // The target as its own draft: every greedy proposal is the target's argmax.
    EXPECT_EQ(s.spec_decode_num_accepted_tokens, s.spec_decode_num_draft_tokens);
  }
  if (c.draft_salt != 0) {
    EXPECT_LT(s.spec_decode_num_accepted_tokens, s.spec_decode_num_draft_tokens);
  }
  ExpectAllFree(*engine);
}

INSTANTIATE_TEST_SUITE_P(
    Proposers, SpecGreedyTest,
    ::testing::Values(GreedyCase{"ngram_count", SpecMethod::kNgram, FakeModel::Mode::kCount, 0},
                      GreedyCase{"ngram_hash", SpecMethod::kNgram, FakeModel::Mode::kHash, 0},
                      GreedyCase{"draft_self", SpecMethod::kDraft, FakeModel::Mode::kHash, 0},
                      GreedyCase{"draft_other", SpecMethod::kDraft, FakeModel::Mode::kCount, 99,
                                 5}),
    [](const ::testing::TestParamInfo<GreedyCase>& info) { return info.param.name; });

TEST(SpecEngineTest, PreemptionWithSpeculationGivesTheSameTokens) {
  for (SpecMethod method : {SpecMethod::kNgram, SpecMethod::kDraft}) {
    EngineOptions options = Options(method, 3);
    options.num_pages = 60;  // 240 token slots; the requests need far more together
    std::vector<EngineRequest> requests;
    for (int i = 0; i < 16; ++i) {
      EngineRequest r = Request("p" + std::to_string(i), Prompt(3 * i + 1), 30);
      r.sampling.ignore_eos = true;
      requests.push_back(std::move(r));
    }
    const std::map<std::string, Result> want =
        Baseline(options, Model(FakeModel::Mode::kCount), requests);
    std::unique_ptr<Engine> engine =
        MakeSpecEngine(options, Model(FakeModel::Mode::kCount), Model(FakeModel::Mode::kCount));
    ExpectSame(RunAll(*engine, requests), want);
    EXPECT_GT(engine->Stats().num_preemptions_total, 0) << SpecMethodName(method);
    EXPECT_GT(engine->Stats().spec_decode_num_accepted_tokens, 0) << SpecMethodName(method);
    ExpectAllFree(*engine);
  }
}

// n-gram proposals are point masses: a sampled row accepts iff the target's own sample (same
// seed, same step) equals the proposal, so a seeded request emits exactly what it would without
// speculation.
TEST(SpecEngineTest, SeededSampledRequestsWithNgramAreUnchanged) {
  const EngineOptions options = Options(SpecMethod::kNgram);
  std::vector<EngineRequest> requests = Requests(/*temperature=*/0.3f);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i % 2 == 0) requests[i].sampling.top_k = 5;
    if (i % 3 == 0) requests[i].sampling.top_p = 0.8f;
  }
  const std::map<std::string, Result> want =
      Baseline(options, Model(FakeModel::Mode::kCount), requests);
  std::unique_ptr<Engine> engine =
      MakeSpecEngine(options, Model(FakeModel::Mode::kCount), FakeModel::Options());
  ExpectSame(RunAll(*engine, requests), want);
  EXPECT_GT(engine->Stats().spec_decode_num_accepted_tokens, 0);
  ExpectAllFree(*engine);
}

TEST(SpecEngineTest, AbortMidSpeculationFreesBothPools) {
  for (SpecMethod method : {SpecMethod::kNgram, SpecMethod::kDraft}) {
    EngineOptions options = Options(method, 4);
    std::unique_ptr<Engine> engine =
        MakeSpecEngine(options, Model(FakeModel::Mode::kCount), Model(FakeModel::Mode::kCount));
    for (int i = 0; i < 8; ++i) {
      EngineRequest r = Request("a" + std::to_string(i), Prompt(3 * i + 1), 200);
      r.sampling.ignore_eos = true;
      r.sampling.temperature = i % 2 == 0 ? 0.0f : 0.7f;
      ASSERT_TRUE(engine->AddRequest(std::move(r)).ok());
    }
    for (int step = 0; step < 6; ++step) ASSERT_TRUE(engine->Step().ok());
    const EngineStats mid = engine->Stats();
    ASSERT_GT(mid.spec_decode_num_drafts, 0);
    if (method == SpecMethod::kDraft) {
      ASSERT_LT(mid.num_draft_pages_free, mid.num_draft_pages_total);  // the draft holds KV
    }
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(engine->Abort("a" + std::to_string(i)).ok());
    absl::StatusOr<std::vector<RequestOutput>> outputs = engine->Step();
    ASSERT_TRUE(outputs.ok()) << outputs.status();
    int aborted = 0;
    for (const RequestOutput& o : *outputs) aborted += o.finish_reason == FinishReason::kAbort;
    EXPECT_EQ(aborted, 8);
    EXPECT_FALSE(engine->HasWork());
    ExpectAllFree(*engine);
  }
}

// A draft step that fails for its batch costs only that step's proposals; a draft backend that
// is unusable stops the engine like a target failure would, with every page of both pools free.
TEST(SpecEngineTest, DraftFailures) {
  const EngineOptions options = Options(SpecMethod::kDraft, 3);
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 8; ++i) {
    EngineRequest r = Request("f" + std::to_string(i), Prompt(3 * i + 1), 24);
    r.sampling.ignore_eos = true;
    requests.push_back(std::move(r));
  }
  const std::map<std::string, Result> want =
      Baseline(options, Model(FakeModel::Mode::kCount), requests);
  {
    auto draft = std::make_unique<FakeModel>(Model(FakeModel::Mode::kCount));
    FakeModel* d = draft.get();
    absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::CreateWithModel(
        options, std::make_unique<FakeModel>(Model(FakeModel::Mode::kCount)), std::move(draft));
    ASSERT_TRUE(engine.ok()) << engine.status();
    d->InjectFault(absl::InvalidArgumentError("bad draft batch"), /*at_call=*/3, /*sticky=*/false);
    ExpectSame(RunAll(**engine, requests), want);
    EXPECT_GT((*engine)->Stats().spec_decode_num_accepted_tokens, 0);
    ExpectAllFree(**engine);
  }
  auto draft = std::make_unique<FakeModel>(Model(FakeModel::Mode::kCount));
  FakeModel* d = draft.get();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::CreateWithModel(
      options, std::make_unique<FakeModel>(Model(FakeModel::Mode::kCount)), std::move(draft));
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (const EngineRequest& r : requests) ASSERT_TRUE((*engine)->AddRequest(r).ok());
  ASSERT_TRUE((*engine)->Step().ok());
  d->InjectFault(absl::InternalError("draft device lost"));
  absl::Status failed;
  for (int step = 0; step < 10 && failed.ok(); ++step) failed = (*engine)->Step().status();
  EXPECT_EQ(failed.code(), absl::StatusCode::kInternal) << failed;
  EXPECT_FALSE((*engine)->HasWork());
  ExpectAllFree(**engine);
}

TEST(SpecEngineTest, RejectsBadSettings) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  auto create = [](const EngineOptions& o, FakeModel::Options draft) {
    return Engine::CreateWithModel(o, std::make_unique<FakeModel>(Model(FakeModel::Mode::kHash)),
                                   o.speculative.method == SpecMethod::kDraft
                                       ? std::make_unique<FakeModel>(draft)
                                       : nullptr)
        .status();
  };
  EngineOptions o = Options(SpecMethod::kNgram, 0);
  EXPECT_EQ(create(o, {}).code(), kInvalid);
  o.speculative.num_speculative_tokens = kMaxSpeculativeTokens + 1;
  EXPECT_EQ(create(o, {}).code(), kInvalid);
  o.speculative.num_speculative_tokens = 4;
  o.speculative.prompt_lookup_min = 4;
  o.speculative.prompt_lookup_max = 2;
  EXPECT_EQ(create(o, {}).code(), kInvalid);
  o.speculative.prompt_lookup_min = 1;
  EXPECT_TRUE(create(o, {}).ok());

  EngineOptions d = Options(SpecMethod::kDraft, 4);
  EXPECT_TRUE(create(d, Model(FakeModel::Mode::kHash)).ok());
  FakeModel::Options other_vocab = Model(FakeModel::Mode::kHash);
  other_vocab.vocab_size = kVocab + 1;
  EXPECT_EQ(create(d, other_vocab).code(), kInvalid);
  FakeModel::Options short_context = Model(FakeModel::Mode::kHash);
  short_context.max_position_embeddings = 100;
  EXPECT_EQ(create(d, short_context).code(), kInvalid);
  // The draft method without a draft model and without a folder to load one from.
  d.speculative.draft_model.clear();
  EXPECT_EQ(Engine::CreateWithModel(d, std::make_unique<FakeModel>(Model(FakeModel::Mode::kHash)))
                .status()
                .code(),
            kInvalid);
  EXPECT_EQ(ParseSpecMethod("medusa").status().code(), kInvalid);
  EXPECT_EQ(*ParseSpecMethod("ngram"), SpecMethod::kNgram);
  EXPECT_EQ(*ParseSpecMethod("draft"), SpecMethod::kDraft);
  EXPECT_EQ(*ParseSpecMethod(""), SpecMethod::kNone);
}

}  // namespace
}  // namespace tandem::testing
