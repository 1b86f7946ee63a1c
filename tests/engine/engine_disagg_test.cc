// The disaggregation hooks: a prefill engine computes prompts (prefill_only) and keeps their
// pages; the test copies those pages of every layer, host to host, into pages a decode engine
// reserved; the decode engine continues. The result must equal one engine doing both.
#include <map>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

constexpr int kVocab = 101;

EngineOptions Options(int num_pages) {
  EngineOptions o;
  o.page_size = 4;
  o.num_pages = num_pages;
  o.max_num_batched_tokens = 32;
  return o;
}

TEST(EngineDisaggTest, PrefillThenDecodeEqualsOneEngine) {
  const FakeModel::Options model;
  std::map<std::string, EngineRequest> requests;
  for (int i = 0; i < 12; ++i) {
    const std::string id = "d" + std::to_string(i);
    requests[id] = Request(id, RandomPrompt(1 + 9 * i, kVocab, 5 + i), 12, i % 3 ? 0.0f : 0.9f);
  }
  std::unique_ptr<Engine> single = MakeEngine(Options(512), model);
  for (const auto& [id, r] : requests) ASSERT_TRUE(single->AddRequest(r).ok());
  std::map<std::string, Finished> want = RunToCompletion(*single);

  std::unique_ptr<Engine> prefill = MakeEngine(Options(300), model);
  std::unique_ptr<Engine> decode = MakeEngine(Options(400), model);
  // Shift the decode side's page ids so a copy to the same ids would be caught.
  ASSERT_TRUE(decode->ReservePages("pad", 37).ok());
  for (const auto& [id, r] : requests) {
    EngineRequest p = r;
    p.prefill_only = true;
    ASSERT_TRUE(prefill->AddRequest(std::move(p)).ok());
  }
  std::map<std::string, Finished> first = RunToCompletion(*prefill);
  for (const auto& [id, r] : requests) {
    ASSERT_EQ(first[id].reason, FinishReason::kPrefillDone) << id;
    ASSERT_EQ(first[id].tokens.size(), 1u);
    absl::StatusOr<std::vector<int32_t>> dst =
        decode->ReservePages(id, static_cast<int>(r.prompt_tokens.size()));
    ASSERT_TRUE(dst.ok()) << dst.status();
    absl::StatusOr<std::vector<int32_t>> src = prefill->KvPages(id);
    ASSERT_TRUE(src.ok()) << src.status();
    CopyPages(*prefill, *src, *decode, *dst);
    ASSERT_TRUE(prefill->ReleaseRequest(id).ok());
    ASSERT_TRUE(decode->AddPrefilledRequest(r, first[id].tokens[0]).ok());
  }
  ExpectIdle(*prefill);
  std::map<std::string, Finished> rest = RunToCompletion(*decode);
  for (const auto& [id, r] : requests) {
    std::vector<int32_t> got = first[id].tokens;
    got.insert(got.end(), rest[id].tokens.begin(), rest[id].tokens.end());
    EXPECT_EQ(got, want[id].tokens) << id;
    EXPECT_EQ(rest[id].reason, FinishReason::kLength) << id << " " << rest[id].error;
  }
  ASSERT_TRUE(decode->ReleaseRequest("pad").ok());
  ExpectIdle(*decode);
}

// Prefix caching with disaggregation: the prefill engine's cache serves the repeated prefixes
// (later requests reuse earlier ones' pages, while those are still held for their transfer);
// every page of each request still travels, and the decode engine keeps no cache even with the
// flag on. Tokens equal one engine without a cache.
TEST(EngineDisaggTest, PrefillCacheServesRepeatedPrefixesAndDecodeKeepsNone) {
  const FakeModel::Options model;
  const std::vector<int32_t> system = RandomPrompt(18, kVocab, 77);
  std::map<std::string, EngineRequest> requests;
  for (int i = 0; i < 6; ++i) {
    const std::string id = "s" + std::to_string(i);
    std::vector<int32_t> prompt = system;
    const std::vector<int32_t> suffix = RandomPrompt(1 + 3 * i, kVocab, 90 + i);
    prompt.insert(prompt.end(), suffix.begin(), suffix.end());
    requests[id] = Request(id, prompt, 10, i % 2 ? 0.0f : 0.9f);
  }
  EngineOptions no_cache = Options(512);
  no_cache.enable_prefix_caching = false;
  std::unique_ptr<Engine> single = MakeEngine(no_cache, model);
  for (const auto& [id, r] : requests) ASSERT_TRUE(single->AddRequest(r).ok());
  std::map<std::string, Finished> want = RunToCompletion(*single);

  std::unique_ptr<Engine> prefill = MakeEngine(Options(300), model);
  std::unique_ptr<Engine> decode = MakeEngine(Options(400), model);
  std::map<std::string, Finished> first;
  for (const auto& [id, r] : requests) {
    EngineRequest p = r;
    p.prefill_only = true;
    ASSERT_TRUE(prefill->AddRequest(std::move(p)).ok());
    first[id] = RunToCompletion(*prefill)[id];  // one at a time: each later one hits
  }
  // Six requests, 18 shared tokens = 4 full pages: the first computes them, the others reuse.
  EXPECT_EQ(prefill->Stats().prefix_cache_hits_total, 5 * 16);
  for (const auto& [id, r] : requests) {
    ASSERT_EQ(first[id].reason, FinishReason::kPrefillDone) << id;
    absl::StatusOr<std::vector<int32_t>> dst =
        decode->ReservePages(id, static_cast<int>(r.prompt_tokens.size()));
    ASSERT_TRUE(dst.ok()) << dst.status();
    absl::StatusOr<std::vector<int32_t>> src = prefill->KvPages(id);
    ASSERT_TRUE(src.ok()) << src.status();
    CopyPages(*prefill, *src, *decode, *dst);
    ASSERT_TRUE(decode->AddPrefilledRequest(r, first[id].tokens[0]).ok());
  }
  for (const auto& [id, r] : requests) ASSERT_TRUE(prefill->ReleaseRequest(id).ok());
  EXPECT_GT(prefill->Stats().num_pages_cached, 0);
  ExpectIdle(*prefill);
  std::map<std::string, Finished> rest = RunToCompletion(*decode);
  for (const auto& [id, r] : requests) {
    std::vector<int32_t> got = first[id].tokens;
    got.insert(got.end(), rest[id].tokens.begin(), rest[id].tokens.end());
    EXPECT_EQ(got, want[id].tokens) << id;
  }
  EXPECT_EQ(decode->Stats().num_pages_cached, 0);
  EXPECT_EQ(decode->Stats().prefix_cache_queries_total, 0);
  EXPECT_TRUE(decode->PrefixCacheHashes().empty());
  ExpectIdle(*decode);
}

TEST(EngineDisaggTest, HookErrorsAndReleases) {
  std::unique_ptr<Engine> engine = MakeEngine(Options(10), FakeModel::Options());
  EXPECT_EQ(engine->KvPages("x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine->ReleaseRequest("x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine->AddPrefilledRequest(Request("x", {1, 2}, 5), 3).code(),
            absl::StatusCode::kNotFound);
  // 20 prompt tokens + the first decode token: 6 pages of 4.
  absl::StatusOr<std::vector<int32_t>> pages = engine->ReservePages("x", 20);
  ASSERT_TRUE(pages.ok());
  EXPECT_EQ(pages->size(), 6u);
  EXPECT_EQ(engine->Stats().num_pages_reserved, 6);
  EXPECT_EQ(engine->ReservePages("x", 4).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(engine->ReservePages("y", 20).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*engine->KvPages("x"), *pages);
  // A mismatched prompt length is refused and keeps the reservation.
  EXPECT_EQ(engine->AddPrefilledRequest(Request("x", {1, 2}, 5), 3).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Stats().num_pages_reserved, 6);
  ASSERT_TRUE(engine->ReleaseRequest("x").ok());
  ExpectIdle(*engine);

  // Aborting a reservation frees it too, with one kAbort event.
  ASSERT_TRUE(engine->ReservePages("z", 3).ok());
  ASSERT_TRUE(engine->Abort("z").ok());
  std::map<std::string, Finished> out = RunToCompletion(*engine);
  EXPECT_EQ(out["z"].reason, FinishReason::kAbort);
  ExpectIdle(*engine);
}

TEST(EngineDisaggTest, PrefillOnlyRequestThatIsAlreadyDoneFinishesNormally) {
  std::unique_ptr<Engine> engine = MakeEngine(Options(10), FakeModel::Options());
  EngineRequest r = Request("one", {1, 2, 3}, 1);
  r.prefill_only = true;
  ASSERT_TRUE(engine->AddRequest(std::move(r)).ok());
  std::map<std::string, Finished> out = RunToCompletion(*engine);
  EXPECT_EQ(out["one"].reason, FinishReason::kLength);  // nothing left for a decode worker
  EXPECT_EQ(out["one"].tokens.size(), 1u);
  ExpectIdle(*engine);
}

}  // namespace
}  // namespace tandem::testing
