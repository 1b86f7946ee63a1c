// Siblings of one request (EngineRequest::siblings: OpenAI n / best_of) over the FakeModel, whose
// every logits row reads its whole history back from the pages (a wrong, freed or overwritten
// shared page changes the output or fails the step) and, as WriteCheckingModel, fails a step
// that writes a page another block table holds. Checked: seeded sampled outputs and logprobs
// with sharing equal those of independent requests with the same ids and seeds (prompts ending
// mid-page and on a page boundary, one-token prompts, chunked prefill, page pressure with
// preemption, prefix caching on and off); the prompt is computed once plus each sibling's last
// page (the counter); after every step the owned pages are exactly the union of the live
// sequences' block tables, so a shared page goes back when its last holder ends and not before;
// aborts before and after the fork; the prefill-only path; bad sibling lists.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "engine/engine.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/write_checking_model.h"

namespace tandem::testing {
namespace {

constexpr int kVocab = 101;
constexpr int kPageSize = 4;

EngineOptions Options(int num_pages, bool cache, int budget = 64, bool async = false) {
  EngineOptions o;
  o.async_scheduling = async;
  o.page_size = kPageSize;
  o.num_pages = num_pages;
  o.max_num_batched_tokens = budget;
  o.max_num_seqs = 64;
  o.enable_prefix_caching = cache;
  return o;
}

std::unique_ptr<Engine> Make(const EngineOptions& options) {
  FakeModel::Options m;
  // With async scheduling the model runs a launched step only when it is collected.
  m.async = options.async_scheduling;
  // Ten EOS ids: sampled sequences end at different steps.
  for (int t = 0; t < 10; ++t) m.eos_token_ids.push_back(t * 10);
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::CreateWithModel(options, std::make_unique<WriteCheckingModel>(m));
  CHECK_OK(engine.status());
  return *std::move(engine);
}

// A request of `n` sequences: "<id>" with `seed` and siblings "<id>/j" with seed + j.
EngineRequest Parent(const std::string& id, std::vector<int32_t> prompt, int n, uint64_t seed,
                     int max_tokens = 12) {
  EngineRequest r = Request(id, std::move(prompt), max_tokens, /*temperature=*/1.0f);
  r.sampling.seed = seed;
  r.sampling.logprobs = 2;
  for (int j = 1; j < n; ++j) r.siblings.push_back({id + "/" + std::to_string(j), seed + j});
  return r;
}

// The same sequences as independent requests.
std::vector<EngineRequest> Independent(const EngineRequest& parent) {
  std::vector<EngineRequest> out;
  EngineRequest first = parent;
  first.siblings.clear();
  out.push_back(first);
  for (const SiblingRequest& s : parent.siblings) {
    EngineRequest one = first;
    one.id = s.id;
    one.sampling.seed = s.seed;
    out.push_back(one);
  }
  return out;
}

struct Outcome {
  std::map<std::string, Finished> finished;
  std::map<std::string, std::vector<float>> logprobs;  // sampled token's, then the top ones
  EngineStats stats;
};

// Distinct pages of the live sequences' block tables.
size_t PagesHeld(const Engine& engine, const std::set<std::string>& live) {
  std::set<int32_t> pages;
  for (const std::string& id : live) {
    absl::StatusOr<std::vector<int32_t>> held = engine.KvPages(id);
    CHECK_OK(held.status());
    pages.insert(held->begin(), held->end());
  }
  return pages.size();
}

// Adds arrivals[i] before step i (a step with nothing to add adds nothing), steps until idle and
// checks after every step that the owned pages are exactly those the live sequences hold.
Outcome RunArrivals(Engine& engine, const std::vector<std::vector<EngineRequest>>& arrivals) {
  Outcome o;
  std::set<std::string> live;
  for (size_t step = 0; step < 100000; ++step) {
    if (step < arrivals.size()) {
      for (const EngineRequest& r : arrivals[step]) {
        EXPECT_TRUE(engine.AddRequest(r).ok());
        live.insert(r.id);
        for (const SiblingRequest& s : r.siblings) live.insert(s.id);
      }
    }
    if (step >= arrivals.size() && !engine.HasWork()) break;
    absl::StatusOr<std::vector<RequestOutput>> outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) break;
    Collect(*outputs, &o.finished);
    for (const RequestOutput& out : *outputs) {
      for (const TokenLogprobs& lp : out.logprobs) {
        o.logprobs[out.id].push_back(lp.logprob);
        for (const auto& [t, v] : lp.top) o.logprobs[out.id].push_back(v);
      }
      if (out.finish_reason != FinishReason::kNone) live.erase(out.id);
    }
    EXPECT_EQ(engine.Stats().num_pages_owned, static_cast<int>(PagesHeld(engine, live)))
        << "after step " << step;
  }
  for (const auto& [id, f] : o.finished) EXPECT_EQ(f.num_terminal_events, 1) << id;
  o.stats = engine.Stats();
  return o;
}

void ExpectSame(const Outcome& want, const Outcome& got) {
  ASSERT_EQ(want.finished.size(), got.finished.size());
  for (const auto& [id, w] : want.finished) {
    ASSERT_TRUE(got.finished.contains(id)) << id;
    const Finished& g = got.finished.at(id);
    EXPECT_EQ(g.tokens, w.tokens) << id;
    EXPECT_EQ(g.reason, w.reason) << id;
    const std::vector<float>& wl = want.logprobs.at(id);
    const std::vector<float>& gl = got.logprobs.at(id);
    ASSERT_EQ(wl.size(), gl.size()) << id;
    for (size_t i = 0; i < wl.size(); ++i) EXPECT_NEAR(gl[i], wl[i], 1e-6) << id << " " << i;
  }
}

// Prompt lengths around page boundaries (page size 4), n from 2 to 6, arriving over 4 steps.
std::vector<EngineRequest> Workload() {
  std::vector<EngineRequest> out;
  const std::vector<int> lengths = {1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 30};
  for (size_t i = 0; i < lengths.size(); ++i) {
    out.push_back(Parent("r" + std::to_string(i), RandomPrompt(lengths[i], kVocab, 100 + i),
                         2 + static_cast<int>(i % 5), 1000 * (i + 1)));
  }
  return out;
}

std::vector<std::vector<EngineRequest>> Spread(const std::vector<EngineRequest>& requests,
                                               bool independent) {
  std::vector<std::vector<EngineRequest>> arrivals(4);
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<EngineRequest>& at = arrivals[i % arrivals.size()];
    if (independent) {
      for (EngineRequest& r : Independent(requests[i])) at.push_back(std::move(r));
    } else {
      at.push_back(requests[i]);
    }
  }
  return arrivals;
}

// Prompt tokens computed with forking: the whole prompt once, then per sibling the tokens from
// the page holding the last prompt token on.
int64_t ForkedPromptWork(const std::vector<EngineRequest>& requests) {
  int64_t total = 0;
  for (const EngineRequest& r : requests) {
    const int p = static_cast<int>(r.prompt_tokens.size());
    total += p + static_cast<int64_t>(r.siblings.size()) * (p - (p - 1) / kPageSize * kPageSize);
  }
  return total;
}

// (prefix cache, async scheduling)
class EngineForkTest : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(EngineForkTest, SiblingsEqualIndependentRequestsAndThePromptIsComputedOnce) {
  const auto [cache, async] = GetParam();
  const std::vector<EngineRequest> requests = Workload();
  auto shared = Make(Options(512, cache, 64, async));
  const Outcome forked = RunArrivals(*shared, Spread(requests, /*independent=*/false));
  ExpectIdle(*shared);
  auto alone = Make(Options(512, /*cache=*/false));
  const Outcome independent = RunArrivals(*alone, Spread(requests, /*independent=*/true));
  ExpectIdle(*alone);
  ExpectSame(independent, forked);

  int64_t siblings = 0;
  int64_t prompt_work = 0;
  for (const EngineRequest& r : requests) {
    siblings += static_cast<int64_t>(r.siblings.size());
    prompt_work += static_cast<int64_t>(r.prompt_tokens.size()) * (1 + r.siblings.size());
  }
  EXPECT_EQ(forked.stats.num_forked_sequences_total, siblings);
  EXPECT_EQ(independent.stats.num_forked_sequences_total, 0);
  EXPECT_EQ(independent.stats.num_prompt_tokens_computed_total, prompt_work);
  EXPECT_EQ(forked.stats.num_preemptions_total, 0);
  EXPECT_EQ(forked.stats.num_async_steps_total > 0, async);
  if (!cache) {
    // With the cache on, a later request may also hit an earlier one's pages: at most this.
    EXPECT_EQ(forked.stats.num_prompt_tokens_computed_total, ForkedPromptWork(requests));
  } else {
    EXPECT_LE(forked.stats.num_prompt_tokens_computed_total, ForkedPromptWork(requests));
  }
  // The seeds are applied: the sequences of one request differ.
  int differing = 0;
  for (const EngineRequest& r : requests) {
    for (const SiblingRequest& s : r.siblings) {
      differing += forked.finished.at(s.id).tokens != forked.finished.at(r.id).tokens;
    }
  }
  EXPECT_GT(differing, siblings / 2);
}

TEST_P(EngineForkTest, PagePressureAndChunkedPrefillPreemptSiblings) {
  // 14 pages for requests that need up to 11 each, a budget of 6 tokens per step: prompts are
  // chunked and siblings are preempted (losing their reference to the shared pages) and
  // recompute their prompt.
  const auto [cache, async] = GetParam();
  const std::vector<EngineRequest> requests = Workload();
  auto shared = Make(Options(14, cache, /*budget=*/6, async));
  const Outcome forked = RunArrivals(*shared, Spread(requests, /*independent=*/false));
  ExpectIdle(*shared);
  auto alone = Make(Options(512, /*cache=*/false));
  const Outcome independent = RunArrivals(*alone, Spread(requests, /*independent=*/true));
  ExpectSame(independent, forked);
  EXPECT_GT(forked.stats.num_preemptions_total, 0);
  EXPECT_EQ(forked.stats.num_async_steps_total > 0, async);
}

INSTANTIATE_TEST_SUITE_P(CacheAsync, EngineForkTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& p) {
                           return std::string(std::get<0>(p.param) ? "cache_on" : "cache_off") +
                                  (std::get<1>(p.param) ? "_async" : "_sync");
                         });

TEST(EngineForkUnitTest, SharedPagesGoBackWithTheirLastHolder) {
  // Prompt of 10 tokens (pages 0, 1 full; page 2 holds the last 2): the siblings share pages
  // 0 and 1 and compute tokens 8, 9 into pages of their own.
  auto engine = Make(Options(64, /*cache=*/false));
  EngineRequest r = Parent("p", RandomPrompt(10, kVocab, 7), 3, 5, /*max_tokens=*/20);
  r.sampling.ignore_eos = true;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  ASSERT_TRUE(engine->Step().ok());  // the parent's prompt and first token; the fork
  EXPECT_EQ(engine->Stats().num_prompt_tokens_computed_total, 10);
  const std::vector<int32_t> parent = *engine->KvPages("p");
  ASSERT_EQ(parent.size(), 3u);
  EXPECT_EQ(*engine->KvPages("p/1"), std::vector<int32_t>(parent.begin(), parent.begin() + 2));
  ASSERT_TRUE(engine->Step().ok());  // the siblings' last prompt page; the parent decodes
  EXPECT_EQ(engine->Stats().num_prompt_tokens_computed_total, 14);
  for (const char* id : {"p/1", "p/2"}) {
    const std::vector<int32_t> pages = *engine->KvPages(id);
    ASSERT_EQ(pages.size(), 3u) << id;
    EXPECT_EQ(pages[0], parent[0]);
    EXPECT_EQ(pages[1], parent[1]);
    EXPECT_NE(pages[2], parent[2]);
  }
  // 3 own last pages + 2 shared.
  EXPECT_EQ(engine->Stats().num_pages_owned, 5);
  ASSERT_TRUE(engine->Abort("p").ok());
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(engine->Stats().num_pages_owned, 4);  // the parent's own page only
  ASSERT_TRUE(engine->Abort("p/1").ok());
  ASSERT_TRUE(engine->Step().ok());
  EXPECT_EQ(engine->Stats().num_pages_owned, 3);  // p/2 still holds the shared pages
  ASSERT_TRUE(engine->Abort("p/2").ok());
  ASSERT_TRUE(engine->Step().ok());
  ExpectIdle(*engine);
}

TEST(EngineForkUnitTest, AbortsBeforeTheForkLeaveTheOthersAsIfIndependent) {
  // A 30-token prompt at 8 tokens per step takes 4 steps. A sibling aborted while it waits ends
  // with no token; the parent aborted before its prompt is done leaves its waiting siblings to
  // compute the prompt themselves, with the outputs they would have had anyway.
  const EngineRequest r = Parent("p", RandomPrompt(30, kVocab, 9), 4, 77);
  auto engine = Make(Options(128, /*cache=*/false, /*budget=*/8));
  ASSERT_TRUE(engine->AddRequest(r).ok());
  std::map<std::string, Finished> got;
  Collect(*engine->Step(), &got);
  ASSERT_TRUE(engine->Abort("p/2").ok());
  Collect(*engine->Step(), &got);
  EXPECT_EQ(got["p/2"].reason, FinishReason::kAbort);
  EXPECT_TRUE(got["p/2"].tokens.empty());
  ASSERT_TRUE(engine->Abort("p").ok());
  Collect(*engine->Step(), &got);
  EXPECT_EQ(got["p"].reason, FinishReason::kAbort);
  EXPECT_EQ(engine->Stats().num_forked_sequences_total, 0);
  for (const auto& [id, f] : RunToCompletion(*engine)) got[id] = f;
  ExpectIdle(*engine);

  auto alone = Make(Options(128, /*cache=*/false));
  std::vector<EngineRequest> each = Independent(r);
  for (const EngineRequest& one : each) ASSERT_TRUE(alone->AddRequest(one).ok());
  const std::map<std::string, Finished> want = RunToCompletion(*alone);
  for (const char* id : {"p/1", "p/3"}) {
    EXPECT_EQ(got[id].tokens, want.at(id).tokens) << id;
    EXPECT_EQ(got[id].reason, want.at(id).reason) << id;
  }
}

TEST(EngineForkUnitTest, PrefillOnlySiblingsEachHandTheirPagesOver) {
  EngineRequest r = Parent("p", RandomPrompt(13, kVocab, 11), 3, 21);
  r.prefill_only = true;
  r.sampling.ignore_eos = true;
  auto engine = Make(Options(64, /*cache=*/false));
  ASSERT_TRUE(engine->AddRequest(r).ok());
  const std::map<std::string, Finished> got = RunToCompletion(*engine);
  ASSERT_EQ(got.size(), 3u);
  auto alone = Make(Options(64, /*cache=*/false));
  for (const EngineRequest& one : Independent(r)) ASSERT_TRUE(alone->AddRequest(one).ok());
  const std::map<std::string, Finished> want = RunToCompletion(*alone);
  for (const auto& [id, f] : want) {
    EXPECT_EQ(got.at(id).reason, FinishReason::kPrefillDone) << id;
    EXPECT_EQ(got.at(id).tokens, f.tokens) << id;
  }
  // 13 tokens + the first decode slot: 4 pages each, the first 3 shared.
  const std::vector<int32_t> p = *engine->KvPages("p");
  const std::vector<int32_t> p1 = *engine->KvPages("p/1");
  ASSERT_EQ(p1.size(), 4u);
  EXPECT_TRUE(std::equal(p.begin(), p.begin() + 3, p1.begin()));
  EXPECT_EQ(engine->Stats().num_pages_owned, 3 + 3);
  ASSERT_TRUE(engine->ReleaseRequest("p").ok());
  ASSERT_TRUE(engine->ReleaseRequest("p/2").ok());
  EXPECT_EQ(engine->Stats().num_pages_owned, 3 + 1);
  ASSERT_TRUE(engine->ReleaseRequest("p/1").ok());
  ExpectIdle(*engine);
}

TEST(EngineForkUnitTest, BadSiblingListsAreRefused) {
  auto engine = Make(Options(64, /*cache=*/false));
  EngineRequest twice = Parent("a", {1, 2, 3}, 1, 0);
  twice.siblings = {{"a/1", 1}, {"a/1", 2}};
  EXPECT_EQ(engine->AddRequest(twice).code(), absl::StatusCode::kInvalidArgument);
  EngineRequest self = Parent("a", {1, 2, 3}, 1, 0);
  self.siblings = {{"a", 1}};
  EXPECT_EQ(engine->AddRequest(self).code(), absl::StatusCode::kInvalidArgument);
  EngineRequest empty = Parent("a", {1, 2, 3}, 1, 0);
  empty.siblings = {{"", 1}};
  EXPECT_EQ(engine->AddRequest(empty).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(engine->HasWork());
  ASSERT_TRUE(engine->AddRequest(Request("live", {4, 5}, 4)).ok());
  EngineRequest clash = Parent("b", {1, 2, 3}, 1, 0);
  clash.siblings = {{"live", 1}};
  EXPECT_EQ(engine->AddRequest(clash).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(engine->KvPages("b").status().code() == absl::StatusCode::kNotFound);

  // A prefilled request's sibling list is checked too; one that ended at its first token needs
  // siblings (nothing else to decode).
  ASSERT_TRUE(engine->ReservePages("d", 3).ok());
  EngineRequest prefilled = Parent("d", {1, 2, 3}, 2, 0);
  prefilled.siblings.push_back(prefilled.siblings[0]);
  EXPECT_EQ(engine->AddPrefilledRequest(prefilled, 7).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      engine->AddPrefilledRequest(Parent("d", {1, 2, 3}, 1, 0), 7, /*first_token_finished=*/true)
          .code(),
      absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(engine->ReleaseRequest("d").ok());
  RunToCompletion(*engine);
  ExpectIdle(*engine);
}

// The disaggregated n / best_of: the prefill engine computes the request alone (its KV kept
// even when its first token ends it), its pages are copied into the decode engine's reservation,
// and there the prefilled request's siblings fork and sample exactly what engine-level siblings
// of one engine sample; with first_token_finished only the siblings run. Every page of both
// engines is free at the end.
TEST(EngineForkUnitTest, PrefilledRequestSiblingsEqualEngineSiblings) {
  for (int max_tokens : {9, 1}) {
    for (int prompt_len : {1, 4, 7, 13}) {
      SCOPED_TRACE(absl::StrCat("prompt ", prompt_len, ", max_tokens ", max_tokens));
      std::vector<int32_t> prompt;
      for (int i = 0; i < prompt_len; ++i) prompt.push_back(11 + (i * 7) % 80);
      const EngineRequest parent = Parent("d", prompt, 3, 77, max_tokens);
      auto reference = Make(Options(64, /*cache=*/false));
      ASSERT_TRUE(reference->AddRequest(parent).ok());
      std::map<std::string, Finished> want = RunToCompletion(*reference);
      ASSERT_EQ(want.size(), 3u);
      const std::vector<int32_t>& first = want["d"].tokens;
      ASSERT_FALSE(first.empty());
      const bool finished = first.size() == 1;

      // The prefill side: the request alone, prefill-only, its KV kept whatever its first token.
      auto prefill = Make(Options(64, /*cache=*/false));
      EngineRequest alone = parent;
      alone.siblings.clear();
      alone.prefill_only = true;
      alone.keep_kv_when_finished = true;
      ASSERT_TRUE(prefill->AddRequest(alone).ok());
      RequestOutput done;
      while (prefill->HasWork()) {
        absl::StatusOr<std::vector<RequestOutput>> outs = prefill->Step();
        ASSERT_TRUE(outs.ok()) << outs.status();
        for (const RequestOutput& o : *outs) done = o;
      }
      ASSERT_EQ(done.finish_reason, FinishReason::kPrefillDone);
      EXPECT_EQ(done.new_tokens, std::vector<int32_t>{first[0]});
      EXPECT_EQ(done.prefill_finish_reason, finished ? want["d"].reason : FinishReason::kNone);

      auto decode = Make(Options(64, /*cache=*/false));
      absl::StatusOr<std::vector<int32_t>> reserved = decode->ReservePages("d", prompt_len);
      ASSERT_TRUE(reserved.ok());
      std::vector<int32_t> src = *prefill->KvPages("d");
      src.resize((prompt_len + kPageSize - 1) / kPageSize);
      CopyPages(*prefill, src, *decode, *reserved);
      ASSERT_TRUE(prefill->ReleaseRequest("d").ok());
      ExpectIdle(*prefill);
      ASSERT_TRUE(decode->AddPrefilledRequest(parent, first[0], finished).ok());
      EXPECT_EQ(decode->Stats().num_forked_sequences_total, 2);
      std::map<std::string, Finished> got = RunToCompletion(*decode);
      EXPECT_EQ(got["d/1"].tokens, want["d/1"].tokens);
      EXPECT_EQ(got["d/2"].tokens, want["d/2"].tokens);
      if (finished) {
        EXPECT_EQ(got.count("d"), 0u) << "the request ended on the prefill side";
      } else {
        std::vector<int32_t> rest(first.begin() + 1, first.end());
        EXPECT_EQ(got["d"].tokens, rest);
      }
      // Siblings recompute only the last prompt page.
      EXPECT_EQ(decode->Stats().num_prompt_tokens_computed_total,
                2 * (prompt_len - (prompt_len - 1) / kPageSize * kPageSize));
      ExpectIdle(*decode);
    }
  }
}

}  // namespace
}  // namespace tandem::testing
