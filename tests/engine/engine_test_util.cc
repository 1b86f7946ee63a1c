#include "tests/engine/engine_test_util.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "gtest/gtest.h"

namespace tandem::testing {

std::unique_ptr<Engine> MakeEngine(const EngineOptions& options,
                                   const FakeModel::Options& model_options, FakeModel** model) {
  auto fake = std::make_unique<FakeModel>(model_options);
  if (model != nullptr) *model = fake.get();
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::CreateWithModel(options, std::move(fake));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

void Collect(const std::vector<RequestOutput>& outputs, std::map<std::string, Finished>* results) {
  for (const RequestOutput& out : outputs) {
    Finished& f = (*results)[out.id];
    EXPECT_EQ(f.num_terminal_events, 0) << out.id << " produced output after finishing";
    f.tokens.insert(f.tokens.end(), out.new_tokens.begin(), out.new_tokens.end());
    if (out.finish_reason != FinishReason::kNone) {
      f.reason = out.finish_reason;
      f.error = out.error;
      ++f.num_terminal_events;
    }
  }
}

std::map<std::string, Finished> RunToCompletion(Engine& engine, int max_steps) {
  std::map<std::string, Finished> results;
  for (int step = 0; step < max_steps && engine.HasWork(); ++step) {
    absl::StatusOr<std::vector<RequestOutput>> outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) break;
    Collect(*outputs, &results);
  }
  EXPECT_FALSE(engine.HasWork()) << "engine still busy after " << max_steps << " steps";
  for (const auto& [id, f] : results) {
    EXPECT_EQ(f.num_terminal_events, 1) << id;
  }
  return results;
}

void ExpectIdle(Engine& engine) {
  const EngineStats stats = engine.Stats();
  // Cached pages are evictable, not leaked: every page is free or cached, and clearing the
  // cache frees them all.
  EXPECT_EQ(stats.num_pages_free + stats.num_pages_cached, stats.num_pages_total)
      << "KV pages leaked";
  EXPECT_EQ(engine.ResetPrefixCache(), stats.num_pages_cached);
  EXPECT_EQ(engine.Stats().num_pages_free, stats.num_pages_total) << "KV pages leaked";
  EXPECT_EQ(stats.num_pages_owned, 0);
  EXPECT_EQ(stats.num_pages_reserved, 0);
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.num_waiting, 0);
}

EngineRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                      float temperature) {
  EngineRequest r;
  r.id = id;
  r.prompt_tokens = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  return r;
}

std::vector<int32_t> RandomPrompt(int len, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> prompt(len);
  for (int32_t& t : prompt) t = dist(rng);
  return prompt;
}

void CopyPages(Engine& from, const std::vector<int32_t>& src, Engine& to,
               const std::vector<int32_t>& dst) {
  ASSERT_LE(src.size(), dst.size());
  const KvLayout& src_layout = from.kv_layout();
  const KvLayout& dst_layout = to.kv_layout();
  ASSERT_EQ(src_layout.PageBytes(), dst_layout.PageBytes());
  const int64_t elem = DTypeSize(src_layout.dtype);
  for (int layer = 0; layer < src_layout.num_layers; ++layer) {
    for (size_t i = 0; i < src.size(); ++i) {
      std::memcpy(
          static_cast<char*>(to.kv_pool()) + dst_layout.PageOffset(layer, dst[i]) * elem,
          static_cast<const char*>(from.kv_pool()) + src_layout.PageOffset(layer, src[i]) * elem,
          src_layout.PageBytes());
    }
  }
}

StepsUntilFailure StepUntilFailure(Engine& engine, int max_steps) {
  StepsUntilFailure r;
  while (engine.HasWork() && r.steps < max_steps) {
    r.max_in_flight = std::max(r.max_in_flight, engine.Stats().num_batches_in_flight);
    absl::StatusOr<std::vector<RequestOutput>> step = engine.Step();
    ++r.steps;
    if (!step.ok()) {
      r.status = step.status();
      break;
    }
  }
  return r;
}

void ExpectFailedByInjectedFault(Engine& engine, const absl::Status& failure) {
  ASSERT_FALSE(failure.ok()) << "the fault never surfaced";
  EXPECT_EQ(failure.code(), absl::StatusCode::kInternal) << failure;
  EXPECT_NE(failure.message().find("lost its device (injected)"), std::string::npos) << failure;
  EXPECT_EQ(engine.Stats().num_batches_in_flight, 0);
  ExpectIdle(engine);
  EXPECT_FALSE(engine.HasWork());
  EXPECT_EQ(engine.Step().status(), failure);
  EXPECT_EQ(engine.AddRequest(Request("new", {1, 2}, 3)).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace tandem::testing
