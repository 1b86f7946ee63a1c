// Automatic prefix caching in the engine, over the FakeModel (whose every logits row reads its
// whole history back from the pages and checks each position's token tag, so a wrong or
// overwritten shared page changes the output or fails the step): outputs with the cache equal
// outputs without it, token for token, for randomized workloads of shared prefixes (prefixes
// ending mid-page and on a page boundary, exact repeats, eviction under pressure with
// preemption), a request aborted while another shares its pages, the prefill-only path; no step
// writes a page another sequence of the step holds; every run ends with each page free or
// cached, and clearing the cache frees them all.
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/check.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/write_checking_model.h"

namespace tandem::testing {
namespace {

constexpr int kVocab = 101;
constexpr int kPageSize = 4;

EngineOptions Options(int num_pages, bool cache) {
  EngineOptions o;
  o.page_size = kPageSize;
  o.num_pages = num_pages;
  o.max_num_batched_tokens = 48;
  o.max_num_seqs = 16;
  o.enable_prefix_caching = cache;
  return o;
}

std::unique_ptr<Engine> Make(const EngineOptions& options, WriteCheckingModel** model = nullptr) {
  auto m = std::make_unique<WriteCheckingModel>(FakeModel::Options());
  if (model != nullptr) *model = m.get();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::CreateWithModel(options, std::move(m));
  CHECK_OK(engine.status());
  return *std::move(engine);
}

struct Arrival {
  int step;  // added before this step
  EngineRequest request;
};

// Shared system prompts of 10, 17, 16 and 33 tokens (mid-page and page-aligned with 4-token
// pages), each followed by a random suffix of 0..20 tokens (0: the prompt is the system prompt
// itself, so at most all but its last page can hit), some exact repeats of earlier prompts, and
// multi-turn conversations whose next turn resends the previous prompt plus new tokens.
// Arrivals spread over steps so that later requests hit pages of running ones.
std::vector<Arrival> Workload(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  const std::vector<std::vector<int32_t>> systems = {
      RandomPrompt(10, kVocab, seed + 1), RandomPrompt(17, kVocab, seed + 2),
      RandomPrompt(16, kVocab, seed + 3), RandomPrompt(33, kVocab, seed + 4)};
  std::vector<Arrival> out;
  std::vector<std::vector<int32_t>> sent;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt;
    const int kind = static_cast<int>(rng() % 6);
    if (kind == 0 && !sent.empty()) {
      prompt = sent[rng() % sent.size()];  // an exact repeat
    } else if (kind == 1 && !sent.empty()) {
      prompt = sent[rng() % sent.size()];  // the next turn of a conversation
      const std::vector<int32_t> more = RandomPrompt(1 + rng() % 9, kVocab, seed * 31 + i);
      prompt.insert(prompt.end(), more.begin(), more.end());
    } else {
      prompt = systems[rng() % systems.size()];
      const int suffix = static_cast<int>(rng() % 21);
      const std::vector<int32_t> more = RandomPrompt(suffix, kVocab, seed * 17 + i);
      prompt.insert(prompt.end(), more.begin(), more.end());
    }
    if (prompt.size() > 90) prompt.resize(90);
    sent.push_back(prompt);
    const int max_tokens = 1 + static_cast<int>(rng() % 12);
    const float temperature = rng() % 3 == 0 ? 0.8f : 0.0f;
    out.push_back({static_cast<int>(i / 3) * static_cast<int>(1 + rng() % 3),
                   Request("r" + std::to_string(i), prompt, max_tokens, temperature)});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Arrival& a, const Arrival& b) { return a.step < b.step; });
  return out;
}

std::map<std::string, Finished> RunArrivals(Engine& engine, const std::vector<Arrival>& arrivals) {
  std::map<std::string, Finished> results;
  size_t next = 0;
  for (int step = 0; step < 100000; ++step) {
    while (next < arrivals.size() && arrivals[next].step <= step) {
      EXPECT_TRUE(engine.AddRequest(arrivals[next].request).ok());
      ++next;
    }
    if (next == arrivals.size() && !engine.HasWork()) break;
    absl::StatusOr<std::vector<RequestOutput>> outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) break;
    Collect(*outputs, &results);
  }
  for (const auto& [id, f] : results) EXPECT_EQ(f.num_terminal_events, 1) << id;
  return results;
}

void ExpectSameOutputs(const std::map<std::string, Finished>& want,
                       const std::map<std::string, Finished>& got) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [id, w] : want) {
    const Finished& g = got.at(id);
    EXPECT_EQ(g.tokens, w.tokens) << id;
    EXPECT_EQ(g.reason, w.reason) << id << " " << g.error;
  }
}

TEST(EnginePrefixCacheTest, RandomSharedPrefixesGiveTheSameTokensWithAndWithoutTheCache) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    const std::vector<Arrival> arrivals = Workload(seed, 40);
    std::unique_ptr<Engine> off = Make(Options(2048, false));
    const std::map<std::string, Finished> want = RunArrivals(*off, arrivals);
    EXPECT_EQ(off->Stats().prefix_cache_queries_total, 0);
    EXPECT_EQ(off->Stats().num_pages_cached, 0);
    ExpectIdle(*off);

    WriteCheckingModel* model = nullptr;
    std::unique_ptr<Engine> on = Make(Options(2048, true), &model);
    const std::map<std::string, Finished> got = RunArrivals(*on, arrivals);
    ExpectSameOutputs(want, got);
    const EngineStats stats = on->Stats();
    EXPECT_GT(stats.prefix_cache_hits_total, 0);
    EXPECT_LT(stats.prefix_cache_hits_total, stats.prefix_cache_queries_total);
    EXPECT_GT(stats.num_pages_cached, 0);
    EXPECT_EQ(model->violations(), 0);
    ExpectIdle(*on);
  }
}

TEST(EnginePrefixCacheTest, EvictionUnderPressureGivesTheSameTokens) {
  // 40 pages of 4 tokens for up to 16 sequences of up to 102 tokens: the cache is evicted all
  // the time and running sequences are preempted (and recompute, through the cache).
  for (uint32_t seed : {7u, 8u}) {
    SCOPED_TRACE(seed);
    const std::vector<Arrival> arrivals = Workload(seed, 40);
    std::unique_ptr<Engine> off = Make(Options(2048, false));
    const std::map<std::string, Finished> want = RunArrivals(*off, arrivals);
    ExpectIdle(*off);

    WriteCheckingModel* model = nullptr;
    std::unique_ptr<Engine> on = Make(Options(40, true), &model);
    const std::map<std::string, Finished> got = RunArrivals(*on, arrivals);
    ExpectSameOutputs(want, got);
    const EngineStats stats = on->Stats();
    EXPECT_GT(stats.num_preemptions_total, 0);
    EXPECT_GT(stats.prefix_cache_hits_total, 0);
    EXPECT_EQ(model->violations(), 0);
    ExpectIdle(*on);
  }
}

// The first token's output reports the cached prompt tokens; the hit is whole pages only and
// leaves at least one token to compute.
TEST(EnginePrefixCacheTest, HitIsFullPagesAndLeavesTheLastTokenToCompute) {
  std::unique_ptr<Engine> engine = Make(Options(64, true));
  const std::vector<int32_t> system = RandomPrompt(10, kVocab, 42);  // 2 full pages + 2 tokens
  ASSERT_TRUE(engine->AddRequest(Request("a", system, 3)).ok());
  RunToCompletion(*engine);
  // a's pages: 2 full prompt pages hashed; its third page (tokens 8..12 with output) too.
  EXPECT_EQ(engine->Stats().num_pages_cached, 3);

  std::vector<int32_t> longer = system;
  longer.push_back(7);
  longer.push_back(9);
  ASSERT_TRUE(engine->AddRequest(Request("b", longer, 2)).ok());
  ASSERT_TRUE(engine->AddRequest(Request("c", {system.begin(), system.begin() + 8}, 2)).ok());
  std::map<std::string, int> cached;
  for (int i = 0; i < 100 && engine->HasWork(); ++i) {
    absl::StatusOr<std::vector<RequestOutput>> out = engine->Step();
    ASSERT_TRUE(out.ok());
    for (const RequestOutput& o : *out) {
      if (!o.new_tokens.empty() && !cached.contains(o.id)) cached[o.id] = o.num_cached_tokens;
    }
  }
  EXPECT_EQ(cached["b"], 8);  // 12 tokens: pages 0 and 1 hit; page 2 differs (7, 9)
  EXPECT_EQ(cached["c"], 4);  // exactly pages 0 and 1: page 1 is recomputed for its logits
  const EngineStats stats = engine->Stats();
  EXPECT_EQ(stats.prefix_cache_hits_total, 0 + 8 + 4);
  EXPECT_EQ(stats.prefix_cache_queries_total, 10 + 12 + 8);
  ExpectIdle(*engine);
  EXPECT_EQ(engine->Stats().num_pages_cached, 0);
}

// Two requests share a prefix while both run; aborting either leaves the other's tokens equal
// to its tokens alone without a cache, and every page comes back.
TEST(EnginePrefixCacheTest, AbortOfOneOfTwoRequestsSharingPages) {
  const std::vector<int32_t> prefix = RandomPrompt(41, kVocab, 9);
  std::vector<int32_t> second = prefix;
  for (int t : {3, 1, 4, 1, 5}) second.push_back(t);
  const EngineRequest a = Request("a", prefix, 30);
  const EngineRequest b = Request("b", second, 30, 0.8f);
  std::map<std::string, Finished> alone;
  for (const EngineRequest& r : {a, b}) {
    std::unique_ptr<Engine> off = Make(Options(256, false));
    ASSERT_TRUE(off->AddRequest(r).ok());
    alone[r.id] = RunToCompletion(*off)[r.id];
  }
  for (const std::string victim : {"a", "b"}) {
    SCOPED_TRACE(victim);
    WriteCheckingModel* model = nullptr;
    std::unique_ptr<Engine> engine = Make(Options(256, true), &model);
    std::map<std::string, Finished> results;
    ASSERT_TRUE(engine->AddRequest(a).ok());
    // a's prompt (41 tokens) takes one step with a budget of 48; then b arrives and shares its
    // 10 full pages.
    while (results["a"].tokens.empty()) Collect(*engine->Step(), &results);
    ASSERT_TRUE(engine->AddRequest(b).ok());
    int b_cached = -1;
    for (int i = 0; i < 4; ++i) {
      absl::StatusOr<std::vector<RequestOutput>> out = engine->Step();
      ASSERT_TRUE(out.ok());
      for (const RequestOutput& o : *out) {
        if (o.id == "b" && b_cached < 0 && !o.new_tokens.empty()) b_cached = o.num_cached_tokens;
      }
      Collect(*out, &results);
    }
    EXPECT_EQ(b_cached, 40);
    const EngineStats shared = engine->Stats();
    EXPECT_EQ(shared.num_pages_cached, 0);
    ASSERT_TRUE(engine->Abort(victim).ok());
    std::map<std::string, Finished> rest = RunToCompletion(*engine);
    const std::string survivor = victim == "a" ? "b" : "a";
    std::vector<int32_t> got = results[survivor].tokens;
    got.insert(got.end(), rest[survivor].tokens.begin(), rest[survivor].tokens.end());
    EXPECT_EQ(got, alone[survivor].tokens);
    EXPECT_EQ(rest[victim].reason, FinishReason::kAbort);
    EXPECT_EQ(model->violations(), 0);
    ExpectIdle(*engine);
  }
}

// Prefill-only requests sharing a prefix hold the shared pages at once (the transfer reads them
// while the other request runs); after both are released the pages stay cached.
TEST(EnginePrefixCacheTest, PrefillOnlyRequestsShareAndReleasePages) {
  std::unique_ptr<Engine> engine = Make(Options(64, true));
  const std::vector<int32_t> prefix = RandomPrompt(20, kVocab, 11);
  EngineRequest a = Request("a", prefix, 8);
  a.prefill_only = true;
  ASSERT_TRUE(engine->AddRequest(a).ok());
  EXPECT_EQ(RunToCompletion(*engine)["a"].reason, FinishReason::kPrefillDone);
  std::vector<int32_t> longer = prefix;
  longer.push_back(5);
  EngineRequest b = Request("b", longer, 8);
  b.prefill_only = true;
  ASSERT_TRUE(engine->AddRequest(b).ok());
  EXPECT_EQ(RunToCompletion(*engine)["b"].reason, FinishReason::kPrefillDone);
  const std::vector<int32_t> pa = *engine->KvPages("a");
  const std::vector<int32_t> pb = *engine->KvPages("b");
  ASSERT_EQ(pb.size(), 6u);
  // b's 20 cached tokens are a's five full pages; its sixth page is its own.
  EXPECT_EQ(std::vector<int32_t>(pb.begin(), pb.begin() + 5),
            std::vector<int32_t>(pa.begin(), pa.begin() + 5));
  EXPECT_EQ(std::set<int32_t>(pa.begin(), pa.end()).count(pb[5]), 0u);
  ASSERT_TRUE(engine->ReleaseRequest("a").ok());
  EXPECT_EQ(engine->Stats().num_pages_owned, 6);  // b still holds the shared pages
  ASSERT_TRUE(engine->ReleaseRequest("b").ok());
  EXPECT_GT(engine->Stats().num_pages_cached, 0);
  ExpectIdle(*engine);
}

// What a worker publishes: the hashes held, and a version that moves when they change.
TEST(EnginePrefixCacheTest, PublishedHashesFollowTheCache) {
  std::unique_ptr<Engine> engine = Make(Options(64, true));
  const uint64_t v0 = engine->prefix_cache_version();
  EXPECT_TRUE(engine->PrefixCacheHashes().empty());
  ASSERT_TRUE(engine->AddRequest(Request("a", RandomPrompt(9, kVocab, 1), 2)).ok());
  RunToCompletion(*engine);
  const uint64_t v1 = engine->prefix_cache_version();
  EXPECT_NE(v1, v0);
  EXPECT_EQ(engine->PrefixCacheHashes().size(), 2u);  // tokens 0..8 + 1 output: 2 full pages
  EXPECT_EQ(engine->ResetPrefixCache(), 2);
  EXPECT_NE(engine->prefix_cache_version(), v1);
  EXPECT_TRUE(engine->PrefixCacheHashes().empty());
  ExpectIdle(*engine);
}

}  // namespace
}  // namespace tandem::testing
