// Async scheduling (EngineOptions::async_scheduling, engine/engine.h): Step() launches the next
// step before it returns the outputs of the last one. Over the FakeModel with Options::async the
// launched step runs only when it is collected, so a sequence or page the engine touched in
// between would fail the model's position and layer checks or change the tokens. Every request
// must get exactly the tokens of the synchronous engine, and nothing may leak.
#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

constexpr int kVocab = 101;

EngineOptions Options(bool async, int num_pages = 512) {
  EngineOptions o;
  o.page_size = 4;
  o.num_pages = num_pages;
  o.max_num_batched_tokens = 48;
  o.max_num_seqs = 6;
  o.async_scheduling = async;
  return o;
}

FakeModel::Options ModelOptions(bool async) {
  FakeModel::Options m;
  m.async = async;
  m.eos_token_ids = {7};
  return m;
}

// One scripted event of a workload: before Step() call `at`, add `request` or abort `id`.
struct Event {
  int at = 0;
  bool abort = false;
  EngineRequest request;
  std::string id;
};

// A random workload: prompts sharing prefixes (the prefix cache hits), greedy and seeded
// sampled requests, stop tokens, EOS, and (when `aborts`) aborts of running requests.
std::vector<Event> Workload(uint32_t seed, bool aborts) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::vector<int32_t> shared = RandomPrompt(13, kVocab, seed);
  std::vector<Event> events;
  for (int i = 0; i < 24; ++i) {
    Event e;
    e.at = uniform(0, 40);
    std::vector<int32_t> prompt = RandomPrompt(uniform(1, 30), kVocab, seed * 100 + i);
    if (uniform(0, 1) == 1) prompt.insert(prompt.begin(), shared.begin(), shared.end());
    e.request = Request(absl::StrCat("r", i), prompt, uniform(1, 30));
    if (uniform(0, 2) == 0) {
      e.request.sampling.temperature = 0.8f;
      e.request.sampling.seed = seed + i;
    }
    if (uniform(0, 3) == 0) e.request.sampling.stop_token_ids = {uniform(0, kVocab - 1)};
    e.request.sampling.ignore_eos = uniform(0, 1) == 1;
    events.push_back(e);
    // Drawn either way, so that the workload with aborts is the one without plus the aborts.
    const bool abort = uniform(0, 3) == 0;
    const int abort_after = uniform(0, 12);
    if (aborts && abort) {
      Event a;
      a.at = e.at + abort_after;
      a.abort = true;
      a.id = e.request.id;
      events.push_back(a);
    }
  }
  return events;
}

struct WorkloadRun {
  std::map<std::string, Finished> results;
  EngineStats stats;
  int64_t launches = 0;
};

WorkloadRun RunWorkload(const std::vector<Event>& events, bool async, int num_pages) {
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine =
      MakeEngine(Options(async, num_pages), ModelOptions(async), &model);
  WorkloadRun run;
  for (int call = 0; call < 100000; ++call) {
    bool pending = false;
    for (const Event& e : events) {
      if (e.at > call) {
        pending = true;
        continue;
      }
      if (e.at != call) continue;
      if (e.abort) {
        // NotFound once the request has finished.
        engine->Abort(e.id).IgnoreError();
      } else {
        EXPECT_TRUE(engine->AddRequest(e.request).ok()) << e.request.id;
      }
    }
    if (!pending && !engine->HasWork()) break;
    if (!engine->HasWork()) continue;
    absl::StatusOr<std::vector<RequestOutput>> outputs = engine->Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) break;
    Collect(*outputs, &run.results);
  }
  EXPECT_FALSE(engine->HasWork());
  for (const auto& [id, f] : run.results) EXPECT_EQ(f.num_terminal_events, 1) << id;
  run.stats = engine->Stats();
  run.launches = model->num_launches();
  ExpectIdle(*engine);
  return run;
}

bool IsPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

TEST(EngineAsyncTest, RandomWorkloadsGiveTheTokensOfSynchronousSteps) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    // 40 pages of 4 tokens for up to 6 sequences of up to 73 tokens: preemption happens.
    for (int num_pages : {512, 40}) {
      SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << num_pages << " pages");
      const std::vector<Event> events = Workload(seed, /*aborts=*/false);
      const WorkloadRun sync = RunWorkload(events, false, num_pages);
      const WorkloadRun async = RunWorkload(events, true, num_pages);
      ASSERT_EQ(sync.results.size(), 24u);
      for (const auto& [id, f] : sync.results) {
        const Finished& a = async.results.at(id);
        EXPECT_EQ(a.tokens, f.tokens) << id;
        EXPECT_EQ(a.reason, f.reason) << id;
      }
      EXPECT_EQ(sync.launches, 0);
      EXPECT_EQ(sync.stats.num_async_steps_total, 0);
      EXPECT_GT(async.launches, 0);
      EXPECT_EQ(async.stats.num_async_steps_total, async.stats.num_steps_total);
      EXPECT_EQ(async.stats.num_generated_tokens_total, sync.stats.num_generated_tokens_total);
    }
  }
}

TEST(EngineAsyncTest, AbortsEndRequestsWithAPrefixOfTheirTokens) {
  for (uint32_t seed : {5u, 6u, 7u}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const WorkloadRun reference = RunWorkload(Workload(seed, /*aborts=*/false), false, 512);
    const WorkloadRun async = RunWorkload(Workload(seed, /*aborts=*/true), true, 512);
    int aborted = 0;
    for (const auto& [id, f] : async.results) {
      const Finished& ref = reference.results.at(id);
      if (f.reason == FinishReason::kAbort) {
        ++aborted;
        EXPECT_TRUE(IsPrefix(f.tokens, ref.tokens)) << id;
      } else {
        EXPECT_EQ(f.tokens, ref.tokens) << id;
        EXPECT_EQ(f.reason, ref.reason) << id;
      }
    }
    EXPECT_GT(aborted, 0) << "the workload aborted nothing";
  }
}

TEST(EngineAsyncTest, StepReturnsTheLaunchedStepsTokensAtTheNextCall) {
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine = MakeEngine(Options(true), ModelOptions(true), &model);
  ASSERT_TRUE(engine->AddRequest(Request("a", RandomPrompt(5, kVocab, 1), 3)).ok());
  // Call 1 launches the prefill and returns nothing; the step runs when call 2 collects it.
  absl::StatusOr<std::vector<RequestOutput>> first = engine->Step();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->empty());
  EXPECT_EQ(model->num_launches(), 1);
  EXPECT_EQ(model->num_forward_calls(), 0);
  EXPECT_TRUE(engine->HasWork());
  // An abort between the calls takes effect after the launched step is collected: its token
  // is returned, then the abort.
  ASSERT_TRUE(engine->Abort("a").ok());
  absl::StatusOr<std::vector<RequestOutput>> second = engine->Step();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(model->num_forward_calls(), 1);
  std::map<std::string, Finished> results;
  Collect(*second, &results);
  EXPECT_EQ(results["a"].tokens.size(), 1u);
  EXPECT_EQ(results["a"].reason, FinishReason::kAbort);
  EXPECT_FALSE(engine->HasWork());
  ExpectIdle(*engine);
}

TEST(EngineAsyncTest, PrefilledPagesAreReleasedWhileAnotherStepIsLaunched) {
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine = MakeEngine(Options(true), ModelOptions(true), &model);
  EngineRequest p = Request("p", RandomPrompt(9, kVocab, 2), 5);
  p.prefill_only = true;
  ASSERT_TRUE(engine->AddRequest(p).ok());
  ASSERT_TRUE(engine->AddRequest(Request("a", RandomPrompt(6, kVocab, 3), 20)).ok());
  std::map<std::string, Finished> results;
  while (results["p"].reason != FinishReason::kPrefillDone) {
    absl::StatusOr<std::vector<RequestOutput>> out = engine->Step();
    ASSERT_TRUE(out.ok()) << out.status();
    Collect(*out, &results);
  }
  // "a" decodes in a launched step while the transfer reads p's pages and releases them.
  ASSERT_TRUE(engine->HasWork());
  absl::StatusOr<std::vector<int32_t>> pages = engine->KvPages("p");
  ASSERT_TRUE(pages.ok()) << pages.status();
  EXPECT_EQ(pages->size(), 3u);
  ASSERT_TRUE(engine->ReleaseRequest("p").ok());
  std::map<std::string, Finished> rest = RunToCompletion(*engine);
  EXPECT_EQ(results["a"].tokens.size() + rest["a"].tokens.size(), 20u);
  EXPECT_EQ(rest["a"].reason, FinishReason::kLength);
  ExpectIdle(*engine);
}

TEST(EngineAsyncTest, FaultAtCollectionFailsTheBatchOrBreaksTheEngine) {
  {
    FakeModel* model = nullptr;
    std::unique_ptr<Engine> engine = MakeEngine(Options(true), ModelOptions(true), &model);
    ASSERT_TRUE(engine->AddRequest(Request("a", RandomPrompt(5, kVocab, 4), 10)).ok());
    ASSERT_TRUE(engine->Step().ok());  // launched
    model->InjectFault(absl::InvalidArgumentError("bad slot (injected)"), -1, /*sticky=*/false);
    absl::StatusOr<std::vector<RequestOutput>> out = engine->Step();
    ASSERT_TRUE(out.ok()) << out.status();
    std::map<std::string, Finished> results;
    Collect(*out, &results);
    EXPECT_EQ(results["a"].reason, FinishReason::kError);
    // The engine keeps serving.
    ASSERT_TRUE(engine->AddRequest(Request("b", RandomPrompt(5, kVocab, 5), 4)).ok());
    std::map<std::string, Finished> rest = RunToCompletion(*engine);
    EXPECT_EQ(rest["b"].reason, FinishReason::kLength);
    ExpectIdle(*engine);
  }
  {
    FakeModel* model = nullptr;
    std::unique_ptr<Engine> engine = MakeEngine(Options(true), ModelOptions(true), &model);
    ASSERT_TRUE(engine->AddRequest(Request("a", RandomPrompt(5, kVocab, 4), 10)).ok());
    ASSERT_TRUE(engine->AddRequest(Request("w", RandomPrompt(50, kVocab, 6), 10)).ok());
    ASSERT_TRUE(engine->Step().ok());  // launched
    model->InjectFault(absl::InternalError("illegal memory access (injected)"));
    absl::StatusOr<std::vector<RequestOutput>> out = engine->Step();
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal);
    EXPECT_FALSE(engine->HasWork());
    EXPECT_EQ(engine->AddRequest(Request("c", {1}, 1)).code(),
              absl::StatusCode::kFailedPrecondition);
    const EngineStats s = engine->Stats();
    EXPECT_EQ(s.num_pages_free, s.num_pages_total);
  }
}

TEST(EngineAsyncTest, OffWhenTheBackendIsSynchronousOrTheFlagIsOff) {
  for (bool model_async : {false, true}) {
    FakeModel* model = nullptr;
    std::unique_ptr<Engine> engine =
        MakeEngine(Options(/*async=*/!model_async), ModelOptions(model_async), &model);
    ASSERT_TRUE(engine->AddRequest(Request("a", RandomPrompt(5, kVocab, 8), 3)).ok());
    absl::StatusOr<std::vector<RequestOutput>> out = engine->Step();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->size(), 1u) << "a synchronous step returns its own token";
    RunToCompletion(*engine);
    EXPECT_EQ(engine->Stats().num_async_steps_total, 0);
  }
}

}  // namespace
}  // namespace tandem::testing
