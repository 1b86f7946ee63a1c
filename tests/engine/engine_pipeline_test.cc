// Pipeline micro-batches in flight (engine/model/parallel_model.h, engine/engine_impl.h) on the
// CPU backend, tiny make-model presets of three architectures:
//   * PP 2 and TP 2 x PP 2 with two micro-batches in flight give PP 1's tokens (greedy and
//     seeded sampling) and prompt logprobs for a continuous batch of 24 chunked requests, with
//     the prefix cache on, an abort mid-way, and with KV pages short enough to preempt;
//   * the stages overlap: stage 1 holds micro-batch 0 until stage 0 has started micro-batch 1
//     (a test hook, not a timing assertion); with micro_batches = 1 they never do;
//   * a fault injected into a stage's receive or its TP group while two micro-batches are in
//     flight breaks the engine cleanly: Internal naming the fault, every request ended, every
//     page free, nothing in flight, new work refused.
// The scheduler's side (an in-flight sequence is never scheduled nor preempted) is
// tests/engine/sched/scheduler_test.cc; the engine CHECKs it on every launch too.
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/check.h"
#include "base/clock.h"
#include "comm/group/thread_communicator.h"
#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "engine/model/parallel_model.h"
#include "engine/model/rank_threads.h"
#include "gtest/gtest.h"
#include "tests/engine/engine_test_util.h"

namespace tandem::testing {
namespace {

std::string MakeTiny(const std::string& preset) {
  const std::string dir = ::testing::TempDir() + "/pp_" + preset;
  MakeModelOptions make;
  make.preset = preset;
  make.out_dir = dir;
  make.seed = 13;
  CHECK_OK(MakeModel(make).status());
  return dir;
}

struct Layout {
  int tp = 1;
  int pp = 1;
  std::string Name() const { return "TP " + std::to_string(tp) + " x PP " + std::to_string(pp); }
};

EngineOptions Options(const std::string& dir, Layout layout, int num_pages = 512) {
  EngineOptions o;
  o.model_dir = dir;
  o.page_size = 4;
  o.num_pages = num_pages;
  o.max_num_batched_tokens = 32;
  o.tensor_parallel = layout.tp;
  o.pipeline_parallel = layout.pp;
  return o;
}

// 24 requests, prompts of 1..90 tokens, 10 new tokens; every fifth sampled with its own seed,
// every seventh with prompt logprobs (no prefix cache for those), a few sharing a prefix.
std::vector<EngineRequest> Requests(int vocab) {
  std::vector<EngineRequest> out;
  const std::vector<int32_t> shared = RandomPrompt(24, vocab, 99);
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> prompt = RandomPrompt(1 + (i * 29) % 90, vocab, i);
    if (i % 6 == 1) prompt.insert(prompt.begin(), shared.begin(), shared.end());
    EngineRequest r = Request("r" + std::to_string(i), prompt, 10, i % 5 == 4 ? 1.0f : 0.0f);
    r.sampling.top_k = i % 5 == 4 ? 50 : -1;
    r.sampling.seed = 500 + i;
    r.sampling.ignore_eos = true;
    if (i % 7 == 3) r.sampling.prompt_logprobs = 2;
    out.push_back(std::move(r));
  }
  return out;
}

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> prompt_logprobs;
  FinishReason reason = FinishReason::kNone;
  int terminal = 0;
};

struct RunResult {
  std::map<std::string, Result> results;
  EngineStats stats;
};

// Adds `requests`, aborts "r5" after the third step, steps to completion.
RunResult RunAll(Engine& engine, const std::vector<EngineRequest>& requests) {
  for (const EngineRequest& r : requests) EXPECT_TRUE(engine.AddRequest(r).ok());
  RunResult run;
  int steps = 0;
  while (engine.HasWork() && steps < 10000) {
    if (++steps == 3) {
      EXPECT_TRUE(engine.Abort("r5").ok());
    }
    absl::StatusOr<std::vector<RequestOutput>> outputs = engine.Step();
    EXPECT_TRUE(outputs.ok()) << outputs.status();
    if (!outputs.ok()) break;
    for (const RequestOutput& o : *outputs) {
      Result& r = run.results[o.id];
      EXPECT_EQ(r.terminal, 0) << o.id << ": output after its end";
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      for (const TokenLogprobs& lp : o.prompt_logprobs) r.prompt_logprobs.push_back(lp.logprob);
      if (o.finish_reason != FinishReason::kNone) {
        r.reason = o.finish_reason;
        ++r.terminal;
      }
    }
  }
  run.stats = engine.Stats();
  ExpectIdle(engine);
  return run;
}

void ExpectSameResults(const RunResult& want, const RunResult& got) {
  ASSERT_EQ(got.results.size(), want.results.size());
  for (const auto& [id, w] : want.results) {
    const Result& g = got.results.at(id);
    EXPECT_EQ(g.reason, w.reason) << id;
    EXPECT_EQ(g.terminal, 1) << id;
    if (id == "r5") continue;  // aborted: how far it got depends on the batches
    EXPECT_EQ(g.reason, FinishReason::kLength) << id;
    EXPECT_EQ(g.tokens, w.tokens) << id;
    ASSERT_EQ(g.prompt_logprobs.size(), w.prompt_logprobs.size()) << id;
    for (size_t i = 0; i < w.prompt_logprobs.size(); ++i) {
      EXPECT_NEAR(g.prompt_logprobs[i], w.prompt_logprobs[i],
                  1e-4 * std::max(1.0f, std::fabs(w.prompt_logprobs[i])))
          << id << " prompt position " << i + 1;
    }
  }
}

TEST(PipelineTest, MicroBatchesGivePp1Tokens) {
  for (const char* preset : {"tiny-llama3", "tiny-qwen3", "tiny-mistral"}) {
    const std::string dir = MakeTiny(preset);
    // 512 pages: no pressure; 40 pages (160 tokens): preemption by recompute.
    for (int pages : {512, 40}) {
      SCOPED_TRACE(std::string(preset) + ", " + std::to_string(pages) + " pages");
      absl::StatusOr<std::unique_ptr<Engine>> pp1 = Engine::Create(Options(dir, {}, pages));
      ASSERT_TRUE(pp1.ok()) << pp1.status();
      const std::vector<EngineRequest> requests = Requests((*pp1)->model_config().vocab_size);
      const RunResult want = RunAll(**pp1, requests);
      EXPECT_EQ(want.stats.max_batches_in_flight, 0);  // CPU, one rank: synchronous steps
      for (const Layout& layout : {Layout{1, 2}, Layout{2, 2}}) {
        SCOPED_TRACE(layout.Name());
        absl::StatusOr<std::unique_ptr<Engine>> engine =
            Engine::Create(Options(dir, layout, pages));
        ASSERT_TRUE(engine.ok()) << engine.status();
        const RunResult got = RunAll(**engine, requests);
        ExpectSameResults(want, got);
        EXPECT_EQ(got.stats.max_batches_in_flight, 2);
        EXPECT_EQ(got.stats.num_batches_in_flight, 0);
        EXPECT_GT(got.stats.num_async_steps_total, 0);
        if (pages == 40) {
          EXPECT_GT(got.stats.num_preemptions_total, 0);
        }
        EXPECT_GT(got.stats.prefix_cache_hits_total, 0);
      }
    }
  }
}

// One sequence's prefill of 3 tokens into page `page` (page size 4), sampled greedily.
StepInputs OnePage(int32_t page) {
  StepInputs in;
  in.num_seqs = 1;
  in.num_tokens = 3;
  in.token_ids = {1, 2, 3};
  in.positions = {0, 1, 2};
  in.slot_mapping = {page * 4, page * 4 + 1, page * 4 + 2};
  in.query_start = {0, 3};
  in.seq_lens = {3};
  in.max_pages_per_seq = 1;
  in.block_tables = {page};
  in.logits_rows = {2};
  SamplingRow greedy;
  greedy.temperature = 0.0f;
  in.sampling = {greedy};
  in.history_start = {0, 0};
  in.num_prompt_history = {0};
  in.bias_start = {0, 0};
  return in;
}

// The model's own guard: a launch whose pages a step in flight reads or writes is refused
// (InvalidArgument, nothing queued), at most MaxStepsInFlight are in flight, and Collect returns
// them oldest first, each what Step gives.
TEST(PipelineTest, ParallelModelRefusesStepsInFlightThatSharePages) {
  const std::string dir = MakeTiny("tiny-llama3");
  absl::StatusOr<std::unique_ptr<Model>> model =
      LoadModel(dir, Backend::kCpu, ParallelConfig{.pipeline_parallel = 2});
  ASSERT_TRUE(model.ok()) << model.status();
  Model& m = **model;
  ASSERT_TRUE(m.SupportsAsyncSteps());
  ASSERT_EQ(m.MaxStepsInFlight(), 2);
  KvLayout layout = m.KvPoolLayout(4);
  layout.num_pages = 8;
  std::vector<float> pool(static_cast<size_t>(layout.PoolBytes()) / sizeof(float) + 1);
  absl::StatusOr<StepOutput> want2 = m.Step(OnePage(2), layout, pool.data());
  ASSERT_TRUE(want2.ok()) << want2.status();
  EXPECT_EQ(m.Collect().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(m.Launch(OnePage(2), layout, pool.data()).ok());
  const absl::Status shared = m.Launch(OnePage(2), layout, pool.data());
  EXPECT_EQ(shared.code(), absl::StatusCode::kInvalidArgument) << shared;
  EXPECT_NE(shared.message().find("disjoint"), std::string::npos) << shared;
  ASSERT_TRUE(m.Launch(OnePage(3), layout, pool.data()).ok());
  EXPECT_EQ(m.Launch(OnePage(5), layout, pool.data()).code(),
            absl::StatusCode::kFailedPrecondition);  // two in flight already
  absl::StatusOr<StepOutput> a = m.Collect();
  absl::StatusOr<StepOutput> b = m.Collect();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->tokens, want2->tokens);
  EXPECT_EQ(b->tokens, want2->tokens);  // the same prompt in another page
  // Once collected, the page is free to use again.
  ASSERT_TRUE(m.Launch(OnePage(2), layout, pool.data()).ok());
  absl::StatusOr<StepOutput> c = m.Collect();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tokens, want2->tokens);
}

// PP 2 over groups whose stage hook holds stage 1 at the start of micro-batch 0 until stage 0
// has started micro-batch 1 (or `wait` passed). Returns the most stages seen busy at once.
int BusyStages(const std::string& dir, int micro_batches, absl::Duration wait, bool* overlapped) {
  const ParallelConfig parallel{.pipeline_parallel = 2, .micro_batches = micro_batches};
  absl::StatusOr<ParallelGroups> groups = ParallelGroups::Create(parallel);
  CHECK_OK(groups.status());
  absl::StatusOr<std::unique_ptr<Model>> model =
      LoadParallelModel(dir, parallel, *std::move(groups));
  CHECK_OK(model.status());
  auto* pm = static_cast<ParallelModel*>(model->get());
  EXPECT_EQ(pm->MaxStepsInFlight(), micro_batches);
  absl::Mutex mu;
  int64_t stage0_started = -1;  // guarded by mu
  pm->SetStageStartHookForTesting([&](int stage, int64_t mb) {
    absl::MutexLock lock(&mu);
    if (stage == 0) stage0_started = mb;
    if (stage == 1 && mb == 0) {
      auto started = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stage0_started >= 1; };
      *overlapped = Clock::Real()->AwaitWithTimeout(&mu, absl::Condition(&started), wait);
    }
  });
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::CreateWithModel(Options(dir, {1, 2}), *std::move(model));
  CHECK_OK(engine.status());
  std::vector<EngineRequest> requests = Requests((*engine)->model_config().vocab_size);
  requests.resize(8);
  for (const EngineRequest& r : requests) EXPECT_TRUE((*engine)->AddRequest(r).ok());
  std::map<std::string, Finished> done = RunToCompletion(**engine);
  EXPECT_EQ(done.size(), requests.size());
  const int busy = pm->MaxBusyStages();
  ExpectIdle(**engine);
  return busy;
}

TEST(PipelineTest, StagesOverlapWithTwoMicroBatches) {
  const std::string dir = MakeTiny("tiny-llama3");
  bool overlapped = false;
  // Two in flight: stage 0 starts micro-batch 1 while stage 1 holds micro-batch 0. Without the
  // overlap this would wait the whole minute and fail.
  EXPECT_EQ(BusyStages(dir, 2, absl::Seconds(60), &overlapped), 2);
  EXPECT_TRUE(overlapped);
  // One at a time: micro-batch 1 is launched only after micro-batch 0 came back, so the wait
  // runs out and no two stages are ever busy together (the check above can fail).
  overlapped = true;
  EXPECT_EQ(BusyStages(dir, 1, absl::Milliseconds(300), &overlapped), 1);
  EXPECT_FALSE(overlapped);
}

// tiny-llama3 (2 layers). PP 2: one transfer per micro-batch, the fault at stage 1's receive
// (world rank 1) of micro-batch 2 or 5; TP 2 x PP 2: stage 1's TP group, 2 all-reduces per
// micro-batch, the fault at the fourth (micro-batch 1). Each surfaces with two micro-batches in
// flight.
TEST(PipelineTest, FaultWithTwoMicroBatchesInFlightBreaksTheEngineCleanly) {
  const std::string dir = MakeTiny("tiny-llama3");
  struct Case {
    Layout layout;
    int stage;  // whose TP group faults; -1: the group-wide communicator
    int rank;
    int64_t calls;
  };
  for (const Case& c : {Case{{1, 2}, -1, 1, 2}, Case{{1, 2}, -1, 1, 5}, Case{{2, 2}, 1, 1, 3}}) {
    SCOPED_TRACE(c.layout.Name() + ", fault at call " + std::to_string(c.calls));
    const ParallelConfig parallel{.tensor_parallel = c.layout.tp, .pipeline_parallel = c.layout.pp};
    absl::StatusOr<ParallelGroups> groups = ParallelGroups::Create(parallel);
    ASSERT_TRUE(groups.ok());
    ThreadCommGroup& faulty = c.stage < 0 ? *groups->world : *groups->stages[c.stage];
    faulty.InjectFault(c.rank, c.calls, absl::InternalError("stage 1 lost its device (injected)"));
    absl::StatusOr<std::unique_ptr<Model>> model =
        LoadParallelModel(dir, parallel, *std::move(groups));
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::CreateWithModel(Options(dir, c.layout), *std::move(model));
    ASSERT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    for (const EngineRequest& r : Requests(e.model_config().vocab_size)) {
      ASSERT_TRUE(e.AddRequest(r).ok());
    }
    absl::StatusOr<std::vector<RequestOutput>> step;
    int in_flight_before = 0;
    int steps = 0;
    while (e.HasWork() && steps < 1000) {
      in_flight_before = e.Stats().num_batches_in_flight;
      step = e.Step();
      ++steps;
      if (!step.ok()) break;
      for (const RequestOutput& o : *step) EXPECT_NE(o.finish_reason, FinishReason::kError);
    }
    ASSERT_FALSE(step.ok()) << "the fault never surfaced";
    EXPECT_EQ(step.status().code(), absl::StatusCode::kInternal);
    EXPECT_NE(step.status().message().find("lost its device (injected)"), std::string::npos)
        << step.status();
    // The failing step went in with two micro-batches in flight (the faulty one and the next).
    EXPECT_EQ(in_flight_before, 2);
    EXPECT_EQ(e.Stats().num_batches_in_flight, 0);
    ExpectIdle(e);
    EXPECT_FALSE(e.HasWork());
    EXPECT_EQ(e.Step().status(), step.status());
    EXPECT_EQ(e.AddRequest(Request("new", {1, 2}, 3)).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

// RankThreads runs each rank's jobs in submission order, each rank at its own pace (rank 1 runs
// job 1 while rank 0 still holds job 0), returns each rank's status per job, and runs every job
// queued before it goes.
TEST(PipelineTest, RankThreadsQueueJobsPerRank) {
  absl::Mutex mu;
  std::vector<std::vector<int>> order(3);  // guarded by mu: [rank] the jobs it ran
  bool rank1_on_job1 = false;              // guarded by mu
  bool held = false;
  int ran_after = 0;  // guarded by mu
  {
    RankThreads threads(3);
    auto job = [&](int id) {
      return [&, id](int rank) -> absl::Status {
        absl::MutexLock lock(&mu);
        order[rank].push_back(id);
        if (rank == 1 && id == 1) rank1_on_job1 = true;
        if (rank == 0 && id == 0) {
          auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return rank1_on_job1; };
          held = Clock::Real()->AwaitWithTimeout(&mu, absl::Condition(&ready), absl::Seconds(60));
        }
        if (id == 3) ++ran_after;
        return rank == 2 && id == 1 ? absl::InternalError("rank 2 failed job 1") : absl::OkStatus();
      };
    };
    const int64_t t0 = threads.Submit(job(0));
    const int64_t t1 = threads.Submit(job(1));
    const int64_t t2 = threads.Submit(job(2));
    const std::vector<absl::Status> r1 = threads.Wait(t1);  // out of order is fine
    EXPECT_TRUE(r1[0].ok());
    EXPECT_TRUE(r1[1].ok());
    EXPECT_EQ(r1[2].message(), "rank 2 failed job 1");
    for (int64_t t : {t0, t2}) {
      for (const absl::Status& s : threads.Wait(t)) EXPECT_TRUE(s.ok());
    }
    EXPECT_TRUE(held);
    for (const absl::Status& s : threads.Run(job(4))) EXPECT_TRUE(s.ok());
    threads.Submit(job(3));  // never waited for
  }
  EXPECT_EQ(ran_after, 3);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(order[r], (std::vector<int>{0, 1, 2, 4, 3})) << r;
}

}  // namespace
}  // namespace tandem::testing
