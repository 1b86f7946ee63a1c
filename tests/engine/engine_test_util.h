// Helpers for engine tests: build an Engine over the FakeModel, drive it to completion, and
// check that every request got exactly one terminal event and no KV page leaked.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "tests/engine/fake_model.h"

namespace tandem::testing {

struct Finished {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  std::string error;
  int num_terminal_events = 0;
};

// Engine over a FakeModel; *model (optional) gets the model's address for its counters.
std::unique_ptr<Engine> MakeEngine(const EngineOptions& options,
                                   const FakeModel::Options& model_options,
                                   FakeModel** model = nullptr);

// Steps until the engine has no work (at most max_steps), collecting each request's outputs.
// A kPrefillDone output counts as its terminal event.
std::map<std::string, Finished> RunToCompletion(Engine& engine, int max_steps = 100000);

// Adds `outputs` to `results` (for tests that step by hand).
void Collect(const std::vector<RequestOutput>& outputs, std::map<std::string, Finished>* results);

// Nothing runs or waits and every page is free or cached (evictable); then clears the prefix
// cache and checks that every page is free.
void ExpectIdle(Engine& engine);

// Copies `from`'s pages `src` into `to`'s pages `dst`, every layer (what the KV transfer does).
// The two pools may differ in num_pages, so a page's offset differs too: each side uses its own
// layout.
void CopyPages(Engine& from, const std::vector<int32_t>& src, Engine& to,
               const std::vector<int32_t>& dst);

EngineRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                      float temperature = 0.0f);

// Steps `engine` while it has work (at most max_steps) until a step fails: that step's status
// (OK when none failed), the steps taken, and the most batches in flight before a step.
struct StepsUntilFailure {
  absl::Status status;
  int steps = 0;
  int max_in_flight = 0;
};
StepsUntilFailure StepUntilFailure(Engine& engine, int max_steps);

// After a step failed from a rank fault a test injected (its message has "lost its device
// (injected)"): the failure is Internal and names it, nothing is in flight and every page is
// free (ExpectIdle), the engine has no work, a later step returns the same failure, and a new
// request is refused.
void ExpectFailedByInjectedFault(Engine& engine, const absl::Status& failure);

// Deterministic pseudo-random prompt of `len` tokens in [0, vocab).
std::vector<int32_t> RandomPrompt(int len, int vocab, uint32_t seed);

}  // namespace tandem::testing
