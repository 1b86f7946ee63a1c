// Step failures (engine/engine.h, Step()): a model error confined to the batch fails only that
// batch's requests; one that makes the backend unusable (Internal: a sticky device error) breaks
// the engine: Step() returns it with every request ended and every page free, and the engine
// refuses new work from then on.
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

constexpr int kVocab = 101;

EngineOptions Options() {
  EngineOptions o;
  o.page_size = 4;
  o.num_pages = 512;
  o.max_num_batched_tokens = 64;
  o.max_num_seqs = 2;
  return o;
}

TEST(EngineFailureTest, BatchErrorFailsThatBatchOnly) {
  FakeModel* model = nullptr;
  std::unique_ptr<Engine> engine = MakeEngine(Options(), FakeModel::Options(), &model);
  // a and b run (max_num_seqs 2); c waits, outside the batch that fails.
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_TRUE(engine->AddRequest(Request(id, RandomPrompt(9, kVocab, id[0]), 20)).ok());
  }
  std::map<std::string, Finished> results;
  for (int i = 0; i < 3; ++i) Collect(*engine->Step(), &results);
  model->InjectFault(absl::InvalidArgumentError("slot 12345 outside the pool (injected)"),
                     /*at_call=*/-1, /*sticky=*/false);
  absl::StatusOr<std::vector<RequestOutput>> failed = engine->Step();
  ASSERT_TRUE(failed.ok()) << failed.status();
  Collect(*failed, &results);
  for (const char* id : {"a", "b"}) {
    EXPECT_EQ(results[id].reason, FinishReason::kError) << id;
    EXPECT_NE(results[id].error.find("injected"), std::string::npos) << results[id].error;
  }
  EXPECT_FALSE(results.contains("c"));
  // The engine keeps serving: c and a new request run to the end.
  ASSERT_TRUE(engine->AddRequest(Request("d", RandomPrompt(5, kVocab, 4), 6)).ok());
  std::map<std::string, Finished> rest = RunToCompletion(*engine);
  EXPECT_EQ(rest["c"].reason, FinishReason::kLength);
  EXPECT_EQ(rest["c"].tokens.size(), 20u);
  EXPECT_EQ(rest["d"].reason, FinishReason::kLength);
  ExpectIdle(*engine);
}

// A fatal error at step N, with requests in every state: running, waiting, prefilled (pages
// held for a transfer) and reserved (pages an incoming transfer writes).
TEST(EngineFailureTest, UnusableBackendBreaksTheEngineAndFreesEveryPage) {
  for (int fail_at : {0, 1, 4}) {
    SCOPED_TRACE(::testing::Message() << "fails at forward call " << fail_at);
    FakeModel* model = nullptr;
    std::unique_ptr<Engine> engine = MakeEngine(Options(), FakeModel::Options(), &model);
    EngineRequest prefilled = Request("prefilled", RandomPrompt(7, kVocab, 1), 5);
    prefilled.prefill_only = true;
    ASSERT_TRUE(engine->AddRequest(prefilled).ok());
    std::map<std::string, Finished> results = RunToCompletion(*engine);
    ASSERT_EQ(results["prefilled"].reason, FinishReason::kPrefillDone);
    ASSERT_TRUE(engine->ReservePages("reserved", 30).ok());
    for (const char* id : {"a", "b", "waiting"}) {
      ASSERT_TRUE(engine->AddRequest(Request(id, RandomPrompt(40, kVocab, id[0]), 50)).ok());
    }
    model->InjectFault(absl::InternalError("illegal memory access (injected)"),
                       model->num_forward_calls() + fail_at);
    absl::StatusOr<std::vector<RequestOutput>> step;
    for (int i = 0; i <= fail_at; ++i) {
      step = engine->Step();
      if (i < fail_at) {
        ASSERT_TRUE(step.ok()) << step.status();
      }
    }
    ASSERT_EQ(step.status().code(), absl::StatusCode::kInternal);
    EXPECT_NE(step.status().message().find("illegal memory access"), std::string::npos);
    // Every request is gone and every page free; nothing is left to step.
    ExpectIdle(*engine);
    EXPECT_FALSE(engine->HasWork());
    for (const char* id : {"a", "b", "waiting", "prefilled", "reserved"}) {
      EXPECT_EQ(engine->Abort(id).code(), absl::StatusCode::kNotFound) << id;
      EXPECT_EQ(engine->KvPages(id).status().code(), absl::StatusCode::kNotFound) << id;
    }
    // Broken for good: the same error again, new work refused.
    EXPECT_EQ(engine->Step().status(), step.status());
    const auto kRefused = absl::StatusCode::kFailedPrecondition;
    EXPECT_EQ(engine->AddRequest(Request("new", {1, 2}, 3)).code(), kRefused);
    EXPECT_EQ(engine->ReservePages("new", 8).status().code(), kRefused);
    EXPECT_EQ(
        engine->AddPrefilledRequest(Request("reserved", RandomPrompt(30, kVocab, 2), 4), 1).code(),
        kRefused);
    ExpectIdle(*engine);
  }
}

}  // namespace
}  // namespace tandem::testing
