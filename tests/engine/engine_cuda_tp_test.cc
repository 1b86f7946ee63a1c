// Tensor parallelism on the CUDA backend (engine/model/parallel_model.h, LoadCudaParallelModel)
// with every rank on GPU 0 (allow_device_sharing; the ranks' all-reduces through the in-process
// peer communicator, comm/group/peer_communicator.h), against TP = 1 on CUDA (label gpu; skips
// without a device):
//   * the model: four prompts (1, 13, 45 and 300 tokens) as one continuous batch (64-token
//     chunks, page size 16, scrambled pages, bf16 KV): last-prompt-position logits within the
//     bf16 bound of the CUDA-vs-CPU tests (engine_cuda_test) and the same 40 greedy tokens up to
//     a near tie, on Llama (TP 2, and TP 4 over 2 KV heads: each replicated on 2 ranks), Qwen3
//     (QK-norm, TP 2) and Qwen2 (qkv bias, 14 query heads: TP 2 gives 7 per rank and one KV head);
//   * the engine: a TP 2 group sizes its pool from the GPU's memory, captures its graphs (each
//     rank its own) and serves batched requests with TP = 1's tokens; every page free
//     afterwards; the split KV pool of ranks on several GPUs (here both slices on GPU 0) gives
//     the same tokens;
//   * CUDA graphs of a TP 2 group: 40 greedy tokens of 8 requests with graphs equal the same
//     group's eager steps and TP 1's up to a near tie, the sampled tokens' logprobs within the
//     near-tie bound of TP 1's, and the decode steps really replay (the group's and the engine's
//     graph-step counts);
//   * an injected communicator fault in rank 1 fails the step with Internal naming it, within a
//     few seconds (no hang), ends every request and refuses later work — in an eager step, and
//     in a graph step (the fault due among a graph's collectives: rank 1 does not replay, rank
//     0's replay spins in its device barrier until the group's abort word releases it), and an
//     abort of the group while graph steps run;
//   * placements refused without allow_device_sharing.
// bf16 numerics: TP = 2 sums the o_proj / down_proj partials in another order than TP = 1's
// GEMM (each partial rounded to bf16 before the all-reduce), so logits differ by rounding and a
// greedy token may differ where the reference's top-2 margin is within that rounding.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "base/check.h"
#include "engine/cuda/cuda_device.h"
#include "engine/cuda/cuda_group.h"
#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "engine/model/parallel_model.h"
#include "gtest/gtest.h"
#include "tests/engine/cuda_skip.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/model/model_test_util.h"

namespace tandem::testing {
namespace {

using testing_util::CachedCheckpoint;
using testing_util::ExpectSameGreedyGenerations;
using testing_util::ExpectSameUpToNearTie;

// engine_cuda_test's CUDA-vs-CPU bound (max |Δ logit| <= 0.05 · max(1, max |logit|)); TP on one
// backend differs from TP = 1 by less (the same bf16 kernels, only the partial sums' order).
constexpr double kLogitTolerance = 0.05;
constexpr int kNewTokens = 40;

// Each preset's checkpoint is written once per run (the tests share them: they only read).
std::string Make(const std::string& preset) { return CachedCheckpoint(preset, 5); }

// Every rank on GPU 0 (the peer communicator), however many GPUs are visible: these tests are
// about ranks sharing a GPU; TensorParallelOnTwoGpusOverNccl puts them on GPUs of their own.
ParallelConfig SharedGpu(int tp) {
  return ParallelConfig{
      .tensor_parallel = tp, .devices = std::vector<int>(tp, 0), .allow_device_sharing = true};
}

TEST(EngineCudaTpTest, TensorParallelOnOneGpuMatchesTp1) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* preset;
    int tp;
  };
  for (const Case& c : {Case{"small-llama3", 2}, Case{"small-llama3", 4}, Case{"small-qwen3", 2},
                        Case{"small-qwen2", 2}}) {
    const std::string name = std::string(c.preset) + " TP " + std::to_string(c.tp);
    SCOPED_TRACE(name);
    const std::string dir = Make(c.preset);
    absl::StatusOr<std::unique_ptr<Model>> tp1 = LoadModel(dir, Backend::kCuda);
    ASSERT_TRUE(tp1.ok()) << tp1.status();
    absl::StatusOr<std::unique_ptr<Model>> tpn = LoadModel(dir, Backend::kCuda, SharedGpu(c.tp));
    ASSERT_TRUE(tpn.ok()) << tpn.status();
    EXPECT_EQ((*tpn)->backend(), Backend::kCuda);
    ExpectSameGreedyGenerations(**tp1, **tpn, kNewTokens, kLogitTolerance, 21, name);
  }
}

EngineOptions CudaOptions(const std::string& dir, int tp) {
  EngineOptions o;
  o.model_dir = dir;
  o.backend = Backend::kCuda;
  o.tensor_parallel = tp;
  o.devices = std::vector<int>(tp, 0);  // as SharedGpu
  o.allow_device_sharing = true;
  // The pool from the GPU's memory (CombineRankMemory), a small share of it: the GPU may be
  // shared with other tests.
  o.gpu_memory_utilization = 0.2;
  o.max_num_seqs = 32;
  o.max_num_batched_tokens = 256;
  o.cuda_graph_sizes = {1, 2, 4, 8};  // every rank of a TP group captures its own
  return o;
}

std::vector<EngineRequest> Requests(int vocab) {
  std::vector<EngineRequest> out;
  for (int i = 0; i < 12; ++i) {
    EngineRequest r =
        Request("r" + std::to_string(i), RandomPrompt(1 + (i * 53) % 400, vocab, i), 24, 0.0f);
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 2;  // the top-2 margin of each token, for the near-tie rule
    out.push_back(std::move(r));
  }
  return out;
}

// engine_cuda_test's near-tie bound for engine runs (logprob units): bf16 rounding differences.
constexpr double kNearTie = 0.25;

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<float> margins;  // top-2 logprob gap at each token
};

// Runs every request to completion together; every page free afterwards.
std::map<std::string, Generated> RunAll(Engine& engine,
                                        const std::vector<EngineRequest>& requests) {
  for (const EngineRequest& r : requests) CHECK_OK(engine.AddRequest(r));
  std::map<std::string, Generated> out;
  while (engine.HasWork()) {
    absl::StatusOr<std::vector<RequestOutput>> step = engine.Step();
    CHECK_OK(step.status());
    for (const RequestOutput& o : *step) {
      EXPECT_NE(o.finish_reason, FinishReason::kError) << o.id << ": " << o.error;
      Generated& g = out[o.id];
      for (size_t i = 0; i < o.new_tokens.size(); ++i) {
        g.tokens.push_back(o.new_tokens[i]);
        const bool two = i < o.logprobs.size() && o.logprobs[i].top.size() >= 2;
        g.margins.push_back(two ? o.logprobs[i].top[0].second - o.logprobs[i].top[1].second
                                : INFINITY);
      }
    }
  }
  ExpectIdle(engine);
  return out;
}

TEST(EngineCudaTpTest, EngineServesTp2OnOneGpuWithTp1Tokens) {
  SKIP_WITHOUT_GPU();
  const std::string dir = Make("small-llama3");
  absl::StatusOr<std::unique_ptr<Engine>> tp1 = Engine::Create(CudaOptions(dir, 1));
  ASSERT_TRUE(tp1.ok()) << tp1.status();
  const std::vector<EngineRequest> requests = Requests((*tp1)->model_config().vocab_size);
  const std::map<std::string, Generated> want = RunAll(**tp1, requests);
  tp1->reset();
  absl::StatusOr<std::unique_ptr<Engine>> tp2 = Engine::Create(CudaOptions(dir, 2));
  ASSERT_TRUE(tp2.ok()) << tp2.status();
  Engine& e = **tp2;
  EXPECT_TRUE(e.kv_pool_on_device());
  EXPECT_GT(e.kv_layout().num_pages, 100);
  EXPECT_EQ(e.kv_layout().num_layers, 2 * e.model_config().num_layers);
  const std::map<std::string, Generated> got = RunAll(e, requests);
  ASSERT_EQ(got.size(), want.size());
  int agreed = 0, total = 0;
  for (const auto& [id, w] : want) {
    ASSERT_EQ(got.at(id).tokens.size(), size_t{24}) << id;
    agreed += ExpectSameUpToNearTie(w.tokens, w.margins, got.at(id).tokens, kNearTie, id);
    total += static_cast<int>(w.tokens.size());
  }
  std::cout << "engine TP 2 on one GPU: " << agreed << " of " << total
            << " greedy tokens identical to TP 1\n";
  tp2->reset();

  // The split pool (what ranks on several GPUs get: one address range, each rank's slice mapped
  // on its GPU), here with both slices on GPU 0: the same computation over other memory, so
  // bitwise TP 2's tokens.
  absl::StatusOr<std::unique_ptr<Model>> split =
      LoadCudaParallelModel(dir, SharedGpu(2), CudaGroupOptions{.split_kv_pool = true});
  ASSERT_TRUE(split.ok()) << split.status();
  absl::StatusOr<std::unique_ptr<Engine>> on_split =
      Engine::CreateWithModel(CudaOptions(dir, 2), *std::move(split));
  ASSERT_TRUE(on_split.ok()) << on_split.status();
  const std::map<std::string, Generated> split_got = RunAll(**on_split, requests);
  for (const auto& [id, g] : got) EXPECT_EQ(split_got.at(id).tokens, g.tokens) << id;
}

TEST(EngineCudaTpTest, AnInjectedCommunicatorFaultFailsTheStepWithoutHanging) {
  SKIP_WITHOUT_GPU();
  const std::string dir = Make("small-llama3");
  // Rank 1's 11th all-reduce (two per layer, 4 layers: in the second step) fails the group.
  absl::StatusOr<std::unique_ptr<Model>> model = LoadCudaParallelModel(
      dir, SharedGpu(2), CudaGroupOptions{.on_peer_group = [](PeerCommGroup& g) {
        g.InjectFault(1, 10, absl::InternalError("rank 1 lost its device (injected)"));
      }});
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions o = CudaOptions(dir, 2);
  o.kv_memory_bytes = int64_t{256} << 20;
  // Eager steps (graph steps: AFaultDuringGraphStepsFailsTheGroupWithoutHanging): capturing
  // graphs makes all-reduces too, which the fault's count would include.
  o.enforce_eager = true;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::CreateWithModel(o, *std::move(model));
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  for (const EngineRequest& r : Requests(e.model_config().vocab_size)) {
    ASSERT_TRUE(e.AddRequest(r).ok());
  }
  const absl::Time start = absl::Now();
  const StepsUntilFailure run = StepUntilFailure(e, 100);
  EXPECT_EQ(run.steps, 2);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ExpectFailedByInjectedFault(e, run.status);
}

// Requests long enough for 32+ decode steps, few enough for one graph size (8).
std::vector<EngineRequest> GraphRequests(int vocab) {
  std::vector<EngineRequest> out;
  for (int i = 0; i < 8; ++i) {
    EngineRequest r =
        Request("g" + std::to_string(i), RandomPrompt(3 + i * 17, vocab, 40 + i), kNewTokens, 0.0f);
    r.sampling.ignore_eos = true;
    r.sampling.logprobs = 2;
    out.push_back(std::move(r));
  }
  return out;
}

struct GraphRun {
  std::map<std::string, Generated> tokens;
  std::map<std::string, std::vector<float>> logprobs;  // the sampled tokens'
  int64_t engine_graph_steps = 0;
  int64_t group_graph_steps = -1;  // ParallelModel::GraphSteps (-1: not a parallel group)
};

GraphRun RunGraphs(const std::string& dir, int tp, bool eager) {
  EngineOptions o = CudaOptions(dir, tp);
  o.enforce_eager = eager;
  o.kv_memory_bytes = int64_t{256} << 20;
  GraphRun run;
  std::unique_ptr<Engine> engine;
  ParallelModel* group = nullptr;
  if (tp > 1) {
    absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(dir, Backend::kCuda, SharedGpu(tp));
    CHECK_OK(model.status());
    group = dynamic_cast<ParallelModel*>(model->get());
    CHECK(group != nullptr);
    EXPECT_TRUE(group->SupportsCudaGraphs()) << "a TP group on one GPU (peer communicator)";
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::CreateWithModel(o, *std::move(model));
    CHECK_OK(e.status());
    engine = *std::move(e);
  } else {
    absl::StatusOr<std::unique_ptr<Engine>> e = Engine::Create(o);
    CHECK_OK(e.status());
    engine = *std::move(e);
  }
  const std::vector<EngineRequest> requests = GraphRequests(engine->model_config().vocab_size);
  for (const EngineRequest& r : requests) CHECK_OK(engine->AddRequest(r));
  while (engine->HasWork()) {
    absl::StatusOr<std::vector<RequestOutput>> step = engine->Step();
    CHECK_OK(step.status());
    for (const RequestOutput& out : *step) {
      EXPECT_NE(out.finish_reason, FinishReason::kError) << out.id << ": " << out.error;
      Generated& g = run.tokens[out.id];
      for (size_t i = 0; i < out.new_tokens.size(); ++i) {
        g.tokens.push_back(out.new_tokens[i]);
        const bool two = i < out.logprobs.size() && out.logprobs[i].top.size() >= 2;
        g.margins.push_back(two ? out.logprobs[i].top[0].second - out.logprobs[i].top[1].second
                                : INFINITY);
        run.logprobs[out.id].push_back(i < out.logprobs.size() ? out.logprobs[i].logprob : NAN);
      }
    }
  }
  ExpectIdle(*engine);
  run.engine_graph_steps = engine->Stats().num_graph_steps_total;
  if (group != nullptr) run.group_graph_steps = group->GraphSteps();
  return run;
}

TEST(EngineCudaTpTest, Tp2GraphsOnOneGpuMatchEagerAndTp1) {
  SKIP_WITHOUT_GPU();
  const std::string dir = Make("small-llama3");
  const GraphRun tp1 = RunGraphs(dir, 1, /*eager=*/false);
  const GraphRun eager = RunGraphs(dir, 2, /*eager=*/true);
  const GraphRun graphs = RunGraphs(dir, 2, /*eager=*/false);
  // The decode steps replayed: 8 sequences decode 39 steps each after their prefill steps.
  EXPECT_EQ(eager.engine_graph_steps, 0);
  EXPECT_EQ(eager.group_graph_steps, 0);
  EXPECT_GE(graphs.engine_graph_steps, kNewTokens - 8) << "the TP 2 group's steps ran eagerly";
  EXPECT_EQ(graphs.group_graph_steps, graphs.engine_graph_steps)
      << "every rank replays its graph in the same steps";
  int same_as_eager = 0, same_as_tp1 = 0, total = 0;
  double max_logprob_diff = 0.0;
  for (const auto& [id, e] : eager.tokens) {
    SCOPED_TRACE(id);
    const Generated& g = graphs.tokens.at(id);
    ASSERT_EQ(g.tokens.size(), size_t{kNewTokens});
    same_as_eager += ExpectSameUpToNearTie(e.tokens, e.margins, g.tokens, kNearTie, id + " eager");
    const Generated& t = tp1.tokens.at(id);
    same_as_tp1 += ExpectSameUpToNearTie(t.tokens, t.margins, g.tokens, kNearTie, id + " TP 1");
    total += kNewTokens;
    // While the sequence is TP 1's, each sampled token's logprob is within the near-tie bound.
    for (int i = 0; i < kNewTokens && g.tokens[i] == t.tokens[i]; ++i) {
      const double d = std::fabs(graphs.logprobs.at(id)[i] - tp1.logprobs.at(id)[i]);
      EXPECT_LE(d, kNearTie) << "token " << i;
      max_logprob_diff = std::max(max_logprob_diff, d);
    }
  }
  std::cout << "TP 2 graphs on one GPU: " << graphs.engine_graph_steps << " graph steps; "
            << same_as_eager << " of " << total << " greedy tokens identical to eager TP 2, "
            << same_as_tp1 << " to TP 1; max |Δ logprob| vs TP 1 " << max_logprob_diff << "\n";
}

// A TP 2 group on one GPU (the peer communicator, a 30 s deadline) serving GraphRequests until
// two steps in a row replayed graphs, so that its next step replays too.
struct GraphGroup {
  std::unique_ptr<Engine> engine;
  ParallelModel* model = nullptr;
  PeerCommGroup* peers = nullptr;
  int64_t graph_steps = 0;
};

GraphGroup StartGraphSteps(const std::string& dir) {
  GraphGroup g;
  absl::StatusOr<std::unique_ptr<Model>> model = LoadCudaParallelModel(
      dir, SharedGpu(2),
      CudaGroupOptions{.timeout = absl::Seconds(30),
                       .on_peer_group = [&](PeerCommGroup& peers) { g.peers = &peers; }});
  CHECK_OK(model.status());
  CHECK(g.peers != nullptr);
  g.model = dynamic_cast<ParallelModel*>(model->get());
  CHECK(g.model != nullptr);
  EngineOptions o = CudaOptions(dir, 2);
  o.kv_memory_bytes = int64_t{256} << 20;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::CreateWithModel(o, *std::move(model));
  CHECK_OK(engine.status());
  g.engine = *std::move(engine);
  for (const EngineRequest& r : GraphRequests(g.engine->model_config().vocab_size)) {
    CHECK_OK(g.engine->AddRequest(r));
  }
  int in_a_row = 0;
  for (int step = 0; step < 60 && in_a_row < 2; ++step) {
    CHECK_OK(g.engine->Step().status());
    in_a_row = g.model->GraphSteps() > g.graph_steps ? in_a_row + 1 : 0;
    g.graph_steps = g.model->GraphSteps();
  }
  CHECK_EQ(in_a_row, 2) << "the group never replayed graphs";
  return g;
}

TEST(EngineCudaTpTest, AFaultDuringGraphStepsFailsTheGroupWithoutHanging) {
  SKIP_WITHOUT_GPU();
  GraphGroup g = StartGraphSteps(Make("small-llama3"));
  // Rank 1's next collective — the first of its next graph — fails the group: rank 1 does not
  // replay, and rank 0's replay (if it started) spins in its barrier until the abort word.
  g.peers->InjectFault(1, 0, absl::InternalError("rank 1 lost its device (injected)"));
  const absl::Time start = absl::Now();
  const StepsUntilFailure run = StepUntilFailure(*g.engine, 10);
  EXPECT_EQ(run.steps, 1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "rank 0's replay waited for its deadline";
  EXPECT_EQ(g.model->GraphSteps(), g.graph_steps);
  ExpectFailedByInjectedFault(*g.engine, run.status);
}

TEST(EngineCudaTpTest, AnAbortWhileGraphStepsRunFailsTheGroupWithoutHanging) {
  SKIP_WITHOUT_GPU();
  GraphGroup g = StartGraphSteps(Make("small-llama3"));
  // The abort lands wherever the steps are by then (inside a replay most of the time: the
  // engine thread does little else); whichever step sees it fails, and every later one.
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(3));
    g.peers->Abort(absl::InternalError("rank 0 lost its device (injected)"));
  });
  const absl::Time start = absl::Now();
  const StepsUntilFailure run = StepUntilFailure(*g.engine, 1000);
  aborter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "a replay waited for its deadline";
  ExpectFailedByInjectedFault(*g.engine, run.status);
}

// TP 2 with a GPU per rank: the NCCL communicator (all-reduces on the ranks' streams, captured
// into each rank's graphs). Needs two visible GPUs ([multi-gpu]'s machine); skips otherwise.
// The logits of greedy generation within the TP 1 bound, then the engine with graphs: tokens as
// TP 1's up to near ties, and the decode steps replayed on both ranks.
TEST(EngineCudaTpTest, TensorParallelOnTwoGpusOverNcclMatchesTp1) {
  SKIP_WITHOUT_GPU();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs two GPUs (" << CudaDeviceCount() << " visible)";
  const ParallelConfig two{.tensor_parallel = 2, .devices = {0, 1}};
  for (const char* preset : {"small-llama3", "small-qwen3"}) {
    SCOPED_TRACE(preset);
    const std::string dir = Make(preset);
    absl::StatusOr<std::unique_ptr<Model>> tp1 = LoadModel(dir, Backend::kCuda);
    ASSERT_TRUE(tp1.ok()) << tp1.status();
    absl::StatusOr<std::unique_ptr<Model>> tp2 = LoadModel(dir, Backend::kCuda, two);
    ASSERT_TRUE(tp2.ok()) << tp2.status();
    ExpectSameGreedyGenerations(**tp1, **tp2, kNewTokens, kLogitTolerance, 22,
                                std::string(preset) + " TP 2 on GPUs 0, 1");
  }
  const std::string dir = Make("small-llama3");
  const GraphRun tp1 = RunGraphs(dir, 1, /*eager=*/false);
  EngineOptions o = CudaOptions(dir, 2);
  o.devices = {0, 1};
  o.allow_device_sharing = false;
  o.kv_memory_bytes = int64_t{256} << 20;
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(dir, Backend::kCuda, two);
  ASSERT_TRUE(model.ok()) << model.status();
  auto* group = dynamic_cast<ParallelModel*>(model->get());
  ASSERT_NE(group, nullptr);
  EXPECT_TRUE(group->SupportsCudaGraphs()) << "NCCL collectives are capturable";
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::CreateWithModel(o, *std::move(model));
  ASSERT_TRUE(engine.ok()) << engine.status();
  const std::vector<EngineRequest> requests = GraphRequests((*engine)->model_config().vocab_size);
  const std::map<std::string, Generated> got = RunAll(**engine, requests);
  EXPECT_GE(group->GraphSteps(), kNewTokens - 8) << "the TP 2 group's steps ran eagerly";
  int agreed = 0, total = 0;
  for (const auto& [id, t] : tp1.tokens) {
    ASSERT_EQ(got.at(id).tokens.size(), t.tokens.size()) << id;
    agreed += ExpectSameUpToNearTie(t.tokens, t.margins, got.at(id).tokens, kNearTie, id);
    total += static_cast<int>(t.tokens.size());
  }
  std::cout << "engine TP 2 on GPUs 0, 1 (NCCL, graphs): " << group->GraphSteps()
            << " graph steps; " << agreed << " of " << total
            << " greedy tokens identical to TP 1\n";
}

TEST(EngineCudaTpTest, PlacementIsRefusedWithoutSharing) {
  SKIP_WITHOUT_GPU();
  const std::string dir = Make("small-qwen3");
  const int visible = CudaDeviceCount();
  // More ranks than GPUs, without sharing: refused before anything is loaded.
  const absl::Status crowded =
      LoadModel(dir, Backend::kCuda, ParallelConfig{.tensor_parallel = 2 * visible}).status();
  EXPECT_EQ(crowded.code(), absl::StatusCode::kInvalidArgument) << crowded;
  EXPECT_NE(crowded.message().find("allow_device_sharing"), std::string::npos) << crowded;
  const absl::Status named_twice =
      LoadModel(dir, Backend::kCuda, ParallelConfig{.tensor_parallel = 2, .devices = {0, 0}})
          .status();
  EXPECT_EQ(named_twice.code(), absl::StatusCode::kInvalidArgument) << named_twice;
  // Pipeline stages count their ranks the same way (engine_cuda_pp_test runs them).
  const absl::Status stages =
      LoadModel(dir, Backend::kCuda,
                ParallelConfig{.tensor_parallel = 2 * visible, .pipeline_parallel = 2})
          .status();
  EXPECT_EQ(stages.code(), absl::StatusCode::kInvalidArgument) << stages;
  EXPECT_NE(stages.message().find("allow_device_sharing"), std::string::npos) << stages;
}

}  // namespace
}  // namespace tandem::testing
