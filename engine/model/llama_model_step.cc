// LlamaModel: one step (forward + on-device sampling), the step buffers, and the CUDA graphs.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/model/llama_model.h"
#include "engine/model/step_padding.h"
#include "engine/model/step_validation.h"

namespace tandem {
namespace {

// The context each graph's capture step pretends its sequences have: which decode-attention
// variant a graph keeps follows from the capture step's plan (kernels/paged_attention/
// paged_attention.cu: both variants are correct for every plan; the split variant is the
// faster one for small batches of long contexts).
constexpr int kCaptureContext = 2048;

// A decode step of `batch` sequences of `context` tokens whose new token stores nothing (slot
// -1) and whose pages are all page 0: what a graph is captured over.
// With tokens_per_seq q > 1: a verify step, each sequence q new tokens that all sample.
StepInputs CaptureStep(int batch, int context, int stride, int page_size, int q = 1) {
  StepInputs in;
  in.num_seqs = batch;
  in.num_tokens = int64_t{batch} * q;
  in.max_pages_per_seq = stride;
  const int pages = std::min(stride, (context + page_size - 1) / page_size);
  context = std::max(q, std::min(context, pages * page_size));
  for (int s = 0; s < batch; ++s) {
    in.query_start.push_back(static_cast<int32_t>(in.token_ids.size()));
    for (int i = 0; i < q; ++i) {
      in.logits_rows.push_back(static_cast<int32_t>(in.token_ids.size()));
      in.token_ids.push_back(0);
      in.positions.push_back(context - q + i);
      in.slot_mapping.push_back(-1);
      in.sampling.push_back(SamplingRow{.temperature = 0.0f});
    }
    in.seq_lens.push_back(context);
  }
  in.query_start.push_back(static_cast<int32_t>(in.token_ids.size()));
  in.block_tables.assign(static_cast<size_t>(batch) * stride, 0);
  return in;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceAllocation>> LlamaModel::AllocateKvPool(int64_t bytes) {
  return ops_->Allocate(bytes);
}

absl::Status LlamaModel::ReserveStep(const StepCapacity& capacity) {
  if (capacity.max_tokens < capacity.max_seqs || capacity.max_seqs < 1) {
    return absl::InvalidArgumentError("step capacity: need max_tokens >= max_seqs >= 1");
  }
  ASSIGN_OR_RETURN(Activations unused, GetActivations(capacity.max_tokens, MaxRows(capacity)));
  (void)unused;
  ASSIGN_OR_RETURN(SampledBlock block, GetSampledBlock(MaxRows(capacity)));
  (void)block;
  // Prompt logprobs: at most one row per token of a step (a few hundred KiB).
  ASSIGN_OR_RETURN(PromptBlock prompt, GetPromptBlock(capacity.max_tokens));
  (void)prompt;
  RETURN_IF_ERROR(ops_->ReserveStep(capacity));
  ops_->Freeze();
  capacity_ = capacity;
  return absl::OkStatus();
}

std::vector<int> LlamaModel::graph_sizes() const {
  std::vector<int> sizes;
  for (const Graph& g : graphs_) sizes.push_back(g.batch);
  return sizes;
}

const LlamaModel::Graph* LlamaModel::GraphFor(const StepInputs& in, const KvLayout& layout,
                                              void* kv_pool) const {
  if (graphs_.empty() || kv_pool != graph_pool_ || layout.num_pages != graph_layout_.num_pages ||
      layout.page_size != graph_layout_.page_size) {
    return nullptr;
  }
  if (in.num_tokens != in.num_seqs || in.logits_rows.size() != static_cast<size_t>(in.num_seqs) ||
      in.max_pages_per_seq > capacity_.max_pages_per_seq) {
    return nullptr;  // not all decodes, or a decode without a logits row
  }
  for (const Graph& g : graphs_) {
    if (g.batch >= in.num_seqs) return &g;
  }
  return nullptr;
}

const LlamaModel::Graph* LlamaModel::VerifyGraphFor(const StepInputs& in, const KvLayout& layout,
                                                    void* kv_pool) const {
  if (verify_graphs_.empty() || kv_pool != graph_pool_ ||
      layout.num_pages != graph_layout_.num_pages || layout.page_size != graph_layout_.page_size ||
      !IsVerifyShaped(in, verify_graphs_.front().tokens_per_seq)) {
    return nullptr;
  }
  for (const Graph& g : verify_graphs_) {
    if (g.batch < in.num_seqs) continue;
    // g.seqs > g.batch >= num_seqs and tokens <= batch * q, so the padding has room for a token
    // per dummy sequence; the page-table stride it needs must fit the reserved one.
    if (PaddedPagesPerSeq(in, g.seqs, g.tokens, layout.page_size) > capacity_.max_pages_per_seq) {
      return nullptr;
    }
    return &g;
  }
  return nullptr;
}

absl::StatusOr<StepOutput> LlamaModel::Step(const StepInputs& in, const KvLayout& layout,
                                            void* kv_pool) {
  RETURN_IF_ERROR(Launch(in, layout, kv_pool));
  return Collect();
}

absl::Status LlamaModel::Launch(const StepInputs& in, const KvLayout& layout, void* kv_pool) {
  if (launched_.has_value())
    return absl::FailedPreconditionError("a launched step is not collected");
  RETURN_IF_ERROR(ValidateStep(in, config_, layout));
  RETURN_IF_ERROR(ValidateSampling(in, config_));
  if (in.num_tokens == 0) {
    launched_ = Launched{};
    return absl::OkStatus();
  }
  // A step with prompt logprob rows runs eagerly: the graphs compute the sampled rows only.
  const bool prompt_rows = !in.prompt_logprob_rows.empty();
  const Graph* graph = prompt_rows ? nullptr : GraphFor(in, layout, kv_pool);
  const StepInputs* step = &in;
  if (graph == nullptr && !prompt_rows) {
    graph = VerifyGraphFor(in, layout, kv_pool);
    if (graph != nullptr) {
      padded_ = PadWithDummySequences(in, graph->seqs, graph->tokens, layout.page_size);
      step = &padded_;
    }
  }
  ASSIGN_OR_RETURN(const DeviceStep d,
                   ops_->BeginStep(*step, layout, graph && !graph->verify ? graph->batch : 0));
  if (ops_->WantsEagerStep()) graph = nullptr;  // padded or not, the step runs the same ops
  ASSIGN_OR_RETURN(const SampledBlock out, GetSampledBlock(d.num_rows));
  ASSIGN_OR_RETURN(const PromptBlock prompt, UploadPromptRows(in));
  if (graph != nullptr) {
    RETURN_IF_ERROR(ReplayGraph(*graph));
    if (!tp_.samples) {  // a rank of a parallel group that does not sample: nothing to collect
      launched_ = Launched{};
      launched_->graph_replayed = true;
      return absl::OkStatus();
    }
  } else {
    ASSIGN_OR_RETURN(float* logits, Forward(d, layout, kv_pool));
    if (!tp_.samples) {  // a rank of a parallel group that does not sample: nothing to collect
      launched_ = Launched{};
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(RunSampler(*ops_, d, logits, config_.vocab_size, out, /*every_stage=*/false));
    RETURN_IF_ERROR(PromptLogprobs(d, prompt));
  }
  launched_ = Launched{out, static_cast<int64_t>(in.logits_rows.size()), in.AnyLogprobs(),
                       graph != nullptr, prompt};
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> LlamaModel::Collect() {
  if (!launched_.has_value()) return absl::FailedPreconditionError("no launched step to collect");
  const Launched l = *launched_;
  launched_.reset();
  if (l.rows == 0 && l.prompt.rows == 0) {
    StepOutput empty;
    empty.graph_replayed = l.graph_replayed;
    return empty;
  }
  const absl::Time wait_start = Clock::Real()->Now();
  ASSIGN_OR_RETURN(StepOutput result, ReadSampled(*ops_, l.out, l.rows, l.logprobs));
  RETURN_IF_ERROR(ReadPromptLogprobs(l.prompt, &result));
  if (backend_ == Backend::kCuda) {
    result.device_wait_ns = absl::ToInt64Nanoseconds(Clock::Real()->Now() - wait_start);
  }
  result.graph_replayed = l.graph_replayed;
  return result;
}

absl::StatusOr<StepOutput> LlamaModel::StepWithLayerHook(const StepInputs& in,
                                                         const KvLayout& layout, void* kv_pool,
                                                         const LayerStoredHook& hook) {
  RETURN_IF_ERROR(ValidateStep(in, config_, layout));
  RETURN_IF_ERROR(ValidateSampling(in, config_));
  if (in.num_tokens == 0) {
    for (int l = 0; l < layout.num_layers; ++l) hook(l, nullptr);
    return StepOutput{};
  }
  ASSIGN_OR_RETURN(const DeviceStep d, ops_->BeginStep(in, layout, 0));
  ASSIGN_OR_RETURN(const SampledBlock out, GetSampledBlock(d.num_rows));
  ASSIGN_OR_RETURN(const PromptBlock prompt, UploadPromptRows(in));
  layer_hook_ = &hook;
  absl::StatusOr<float*> logits = Forward(d, layout, kv_pool);
  layer_hook_ = nullptr;
  RETURN_IF_ERROR(logits.status());
  if (!tp_.samples) return StepOutput{};
  RETURN_IF_ERROR(RunSampler(*ops_, d, *logits, config_.vocab_size, out, /*every_stage=*/false));
  RETURN_IF_ERROR(PromptLogprobs(d, prompt));
  const absl::Time wait_start = Clock::Real()->Now();
  ASSIGN_OR_RETURN(
      StepOutput result,
      ReadSampled(*ops_, out, static_cast<int64_t>(in.logits_rows.size()), in.AnyLogprobs()));
  RETURN_IF_ERROR(ReadPromptLogprobs(prompt, &result));
  if (backend_ == Backend::kCuda) {
    result.device_wait_ns = absl::ToInt64Nanoseconds(Clock::Real()->Now() - wait_start);
  }
  return result;
}

absl::Status LlamaModel::ComputeLogits(const StepInputs& in, const KvLayout& layout, void* kv_pool,
                                       float* logits) {
  RETURN_IF_ERROR(ValidateStep(in, config_, layout));
  if (in.num_tokens == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const DeviceStep d, ops_->BeginStep(in, layout, 0));
  ASSIGN_OR_RETURN(float* device_logits, Forward(d, layout, kv_pool));
  if (!tp_.samples) return absl::OkStatus();
  return ops_->CopyToHost(logits, device_logits,
                          d.num_rows * int64_t{config_.vocab_size} * int64_t{sizeof(float)});
}

absl::Status LlamaModel::CaptureGraph(int batch, const KvLayout& layout, void* kv_pool) {
  const StepInputs in =
      CaptureStep(batch, kCaptureContext, capacity_.max_pages_per_seq, layout.page_size);
  ASSIGN_OR_RETURN(const DeviceStep d, ops_->BeginStep(in, layout, batch));
  Graph g{.batch = batch};
  RETURN_IF_ERROR(Capture(d, layout, kv_pool, &g));
  graphs_.push_back(g);
  return absl::OkStatus();
}

absl::Status LlamaModel::Capture(const DeviceStep& d, const KvLayout& layout, void* kv_pool,
                                 Graph* graph) {
  ASSIGN_OR_RETURN(const SampledBlock out, GetSampledBlock(d.num_rows));
  // A rank that does not sample ends its graph after its last layer (Forward computes no logits
  // there).
  auto run = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(float* logits, Forward(d, layout, kv_pool));
    if (!tp_.samples) return absl::OkStatus();
    return RunSampler(*ops_, d, logits, config_.vocab_size, out, /*every_stage=*/true);
  };
  // One eager run first: lazy initialisation (cuBLASLt plans, kernel attributes, module loads)
  // must not happen under capture.
  RETURN_IF_ERROR(run());
  if (tp_.samples) RETURN_IF_ERROR(ReadSampled(*ops_, out, d.num_rows, false).status());
  RETURN_IF_ERROR(ops_->BeginCapture());
  // The collectives of a tensor-parallel rank are captured through EnqueueAllReduceSum (their
  // host rendezvous, where the peer group exchanges the buffers' addresses, happens now, once).
  capturing_ = true;
  const int64_t collectives_before = collectives_;
  const absl::Status recorded = run();
  capturing_ = false;
  // The capture ends either way: a stream left capturing would refuse every later launch.
  absl::StatusOr<int> handle = ops_->EndCapture();
  RETURN_IF_ERROR(recorded);
  RETURN_IF_ERROR(handle.status());
  graph->handle = *handle;
  graph->collectives = collectives_ - collectives_before;
  return absl::OkStatus();
}

absl::Status LlamaModel::ReplayGraph(const Graph& graph) {
  if (tp_.tp_comm == nullptr) {
    RETURN_IF_ERROR(ops_->Replay(graph.handle));
    ++graph_replays_;
    return absl::OkStatus();
  }
  // A failed group (or an injected fault due among the graph's collectives) replays nothing:
  // the peers' replays are released by the group's abort.
  RETURN_IF_ERROR(tp_.tp_comm->BeginGraphReplay(graph.collectives));
  RETURN_IF_ERROR(ops_->Replay(graph.handle));
  ++graph_replays_;
  return tp_.tp_comm->EndGraphReplay();
}

absl::Status LlamaModel::CaptureVerifyGraph(int batch, int q, const KvLayout& layout,
                                            void* kv_pool) {
  const Graph shape{.batch = batch,
                    .verify = true,
                    .tokens_per_seq = q,
                    .seqs = batch + 1,
                    .tokens = int64_t{batch} * q + 1};
  const StepInputs in = PadWithDummySequences(
      CaptureStep(batch, kCaptureContext, capacity_.max_pages_per_seq, layout.page_size, q),
      shape.seqs, shape.tokens, layout.page_size);
  ASSIGN_OR_RETURN(const DeviceStep d, ops_->BeginStep(in, layout, 0));
  Graph g = shape;
  RETURN_IF_ERROR(Capture(d, layout, kv_pool, &g));
  verify_graphs_.push_back(g);
  return absl::OkStatus();
}

absl::Status LlamaModel::Prepare(const ModelPrepareOptions& options, const KvLayout& layout,
                                 void* kv_pool) {
  if (options.cuda_graph_sizes.empty()) return absl::OkStatus();
  if (!ops_->SupportsGraphs()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", BackendName(backend_), " backend has no graphs; run it eagerly"));
  }
  if (capacity_.max_seqs == 0) return absl::FailedPreconditionError("Prepare before ReserveStep");
  if (tp_.pp_comm != nullptr) {
    return absl::InvalidArgumentError(
        "a pipeline stage runs eagerly (its Send / Recv cannot be captured)");
  }
  if (tp_.tp_comm != nullptr && !tp_.tp_comm->SupportsGraphCapture()) {
    return absl::InvalidArgumentError(
        "this tensor-parallel rank's communicator cannot be captured into a CUDA graph");
  }
  std::vector<int> sizes = options.cuda_graph_sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  graphs_.clear();
  verify_graphs_.clear();
  graph_pool_ = kv_pool;
  graph_layout_ = layout;
  for (int batch : sizes) {
    if (batch < 1 || batch > capacity_.max_seqs) {
      return absl::InvalidArgumentError(absl::StrCat("cuda graph size ", batch, " outside [1, ",
                                                     "max_num_seqs = ", capacity_.max_seqs, "]"));
    }
    RETURN_IF_ERROR(CaptureGraph(batch, layout, kv_pool));
  }
  const int q = options.verify_tokens_per_seq;
  for (int batch : sizes) {
    if (q < 2) break;
    const int64_t tokens = int64_t{batch} * q + 1;
    if (batch + 1 > capacity_.max_seqs || tokens > capacity_.max_tokens ||
        tokens > MaxRows(capacity_)) {
      break;  // ascending: no larger one fits either
    }
    RETURN_IF_ERROR(CaptureVerifyGraph(batch, q, layout, kv_pool));
  }
  return absl::OkStatus();
}

}  // namespace tandem
