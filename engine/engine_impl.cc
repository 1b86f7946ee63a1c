#include "engine/engine_impl.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/check.h"
#include "base/clock.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "engine/kv_budget.h"
#include "engine/sample/sampler.h"
#include "engine/spec/draft_proposer.h"
#include "engine/spec/ngram_proposer.h"

namespace tandem {
namespace {

// Biases one row may carry: logit_bias plus the EOS and stop ids banned before min_tokens.
constexpr int kMaxBiasPerRow = kMaxLogitBias + 128;

absl::StatusOr<int> ResolveMaxModelLen(const EngineOptions& options, const ModelConfig& config) {
  if (options.max_model_len < 0 || options.max_model_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_model_len %d outside [0, max_position_embeddings = %d]",
                        options.max_model_len, config.max_position_embeddings));
  }
  return options.max_model_len > 0 ? options.max_model_len : config.max_position_embeddings;
}

// The most one step may hold, for the backend's step buffers (reserved once). A verify step
// samples 1 + spec_tokens rows per sequence.
StepCapacity CapacityFor(const EngineOptions& o, const ModelConfig& c, int max_model_len,
                         int spec_tokens) {
  StepCapacity cap;
  cap.max_seqs = o.max_num_seqs;
  cap.max_rows = o.max_num_seqs * (1 + spec_tokens);
  cap.max_tokens = std::max(o.max_num_batched_tokens, o.max_num_seqs);
  cap.max_pages_per_seq = PagesForTokens(max_model_len, o.page_size);
  cap.max_history_tokens = int64_t{cap.max_rows} * max_model_len;
  cap.max_bias_entries = int64_t{cap.max_rows} * kMaxBiasPerRow;
  cap.num_q_heads = c.num_q_heads;
  cap.num_kv_heads = c.num_kv_heads;
  return cap;
}

// A KV pool in a model's device memory.
class DeviceKvMemory final : public KvMemory {
 public:
  explicit DeviceKvMemory(std::unique_ptr<DeviceAllocation> a) : a_(std::move(a)) {}
  void* data() override { return a_->data(); }
  int64_t bytes() const override { return a_->bytes(); }

 private:
  std::unique_ptr<DeviceAllocation> a_;
};

// The draft model can serve this target: same vocabulary and backend, long enough a context.
absl::Status CheckDraft(const Model& draft, const Model& target, int max_model_len) {
  if (draft.config().vocab_size != target.config().vocab_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the draft model's vocabulary (%d) differs from the target's (%d): a draft must share the "
        "target's tokenizer",
        draft.config().vocab_size, target.config().vocab_size));
  }
  if (draft.backend() != target.backend()) {
    return absl::InvalidArgumentError("the draft model runs on another backend than the target");
  }
  if (draft.config().max_position_embeddings < max_model_len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the draft model's context (%d) is shorter than max_model_len (%d)",
                        draft.config().max_position_embeddings, max_model_len));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<EngineImpl>> EngineImpl::Create(const EngineOptions& options,
                                                               std::unique_ptr<Model> model,
                                                               std::vector<int> eos_token_ids,
                                                               std::unique_ptr<Model> draft) {
  if (model == nullptr) return absl::InvalidArgumentError("engine needs a model");
  const SpeculativeConfig& spec = options.speculative;
  RETURN_IF_ERROR(ValidateSpeculativeConfig(spec));
  if (spec.method == SpecMethod::kDraft && draft == nullptr) {
    return absl::InvalidArgumentError("speculative method 'draft' without a draft model");
  }
  if (options.page_size < 1 || options.max_num_seqs < 1 || options.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        "page_size, max_num_seqs and max_num_batched_tokens must be >= 1");
  }
  if (model->backend() != options.backend) {
    return absl::InvalidArgumentError(
        absl::StrFormat("engine options ask for the %s backend; the model runs on %s",
                        BackendName(options.backend), BackendName(model->backend())));
  }
  ASSIGN_OR_RETURN(const std::vector<int> graph_sizes, CudaGraphSizes(options));
  const absl::Time start = Clock::Real()->Now();
  ASSIGN_OR_RETURN(const int max_model_len, ResolveMaxModelLen(options, model->config()));
  KvLayout layout = model->KvPoolLayout(options.page_size);
  ASSIGN_OR_RETURN(layout.dtype, KvCacheDtype(options.kv_cache_dtype, layout.dtype));
  if (!model->SupportsKvDtype(layout.dtype)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kv_cache_dtype %s: this model on the %s backend cannot run a %s KV cache",
        options.kv_cache_dtype, BackendName(model->backend()), KvCacheDtypeName(layout.dtype)));
  }
  const StepCapacity capacity = CapacityFor(options, model->config(), max_model_len,
                                            spec.enabled() ? spec.num_speculative_tokens : 0);
  RETURN_IF_ERROR(model->ReserveStep(capacity));
  ASSIGN_OR_RETURN(DeviceMemoryInfo memory, model->MemoryInfo());
  // The draft's step buffers are reserved before the pools are sized, so the budget counts them.
  StepCapacity draft_capacity;
  KvLayout draft_layout;
  if (draft != nullptr) {
    RETURN_IF_ERROR(CheckDraft(*draft, *model, max_model_len));
    draft_capacity = CapacityFor(options, draft->config(), max_model_len, 0);
    RETURN_IF_ERROR(draft->ReserveStep(draft_capacity));
    ASSIGN_OR_RETURN(const DeviceMemoryInfo draft_memory, draft->MemoryInfo());
    memory.own_bytes += draft_memory.own_bytes;
    draft_layout = draft->KvPoolLayout(options.page_size);
    ASSIGN_OR_RETURN(draft_layout.dtype, KvCacheDtype(options.kv_cache_dtype, draft_layout.dtype));
    if (!draft->SupportsKvDtype(draft_layout.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("kv_cache_dtype %s: the draft model cannot run a %s KV cache",
                          options.kv_cache_dtype, KvCacheDtypeName(draft_layout.dtype)));
    }
  }
  ASSIGN_OR_RETURN(const int64_t kv_bytes, KvPoolBytes(options, memory));
  if (options.num_pages > 0) {
    layout.num_pages = options.num_pages;
  } else if (draft != nullptr) {
    // Both pools get the same number of pages, out of one budget.
    const int64_t bytes_per_page =
        layout.PageBytes() * layout.num_layers + draft_layout.PageBytes() * draft_layout.num_layers;
    layout.num_pages = static_cast<int>(kv_bytes / bytes_per_page);
  } else {
    layout.num_pages = KvCache::NumPagesFor(layout, kv_bytes);
  }
  if (layout.num_pages < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d bytes of KV memory hold no KV page of this model", kv_bytes));
  }
  std::unique_ptr<KvCache> kv_cache;
  if (model->backend() == Backend::kCpu) {
    ASSIGN_OR_RETURN(kv_cache, KvCache::CreateOnHost(layout));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceAllocation> pool,
                     model->AllocateKvPool(layout.PoolBytes()));
    ASSIGN_OR_RETURN(kv_cache,
                     KvCache::Create(layout, std::make_unique<DeviceKvMemory>(std::move(pool))));
  }
  LOG(INFO) << "KV cache: " << layout.num_pages << " pages of " << layout.page_size << " tokens, "
            << KvCacheDtypeName(layout.dtype) << ", " << (layout.PoolBytes() >> 20) << " MiB";
  const absl::Time capture_start = Clock::Real()->Now();
  // A model that runs every step eagerly (pipeline stages) captures nothing; a draft
  // model still gets the sizes.
  std::vector<int> model_graphs = graph_sizes;
  if (!model_graphs.empty() && !model->SupportsCudaGraphs()) {
    LOG(INFO) << "the model runs every step eagerly (pipeline stages): " << model_graphs.size()
              << " CUDA graph sizes not captured";
    model_graphs.clear();
  }
  // With speculation, verify steps (1 + k tokens per sequence) get graphs of their own.
  const ModelPrepareOptions prepare{
      .capacity = capacity,
      .cuda_graph_sizes = model_graphs,
      .verify_tokens_per_seq = spec.enabled() ? 1 + spec.num_speculative_tokens : 0};
  RETURN_IF_ERROR(model->Prepare(prepare, layout, kv_cache->pool()));
  if (!model_graphs.empty()) {
    LOG(INFO) << "captured " << model_graphs.size() << " CUDA graphs (batch "
              << model_graphs.front() << " to " << model_graphs.back() << ")"
              << (spec.enabled() ? " and their speculative verify graphs" : "") << " in "
              << absl::FormatDuration(
                     absl::Trunc(Clock::Real()->Now() - capture_start, absl::Milliseconds(1)));
  }
  std::unique_ptr<Proposer> proposer;
  if (spec.method == SpecMethod::kNgram) {
    proposer = std::make_unique<NgramProposer>(spec.prompt_lookup_min, spec.prompt_lookup_max);
  } else if (spec.method == SpecMethod::kDraft) {
    draft_layout.num_pages = layout.num_pages;
    ASSIGN_OR_RETURN(proposer, DraftProposer::Create(std::move(draft),
                                                     DraftOptions{draft_capacity, draft_layout,
                                                                  graph_sizes, eos_token_ids}));
  }
  if (proposer != nullptr) {
    LOG(INFO) << "speculative decoding: " << SpecMethodName(spec.method) << ", "
              << spec.num_speculative_tokens << " tokens per step";
  }
  LOG(INFO) << "engine ready on the " << BackendName(options.backend) << " backend in "
            << absl::FormatDuration(
                   absl::Trunc(Clock::Real()->Now() - start, absl::Milliseconds(1)))
            << " after the model load";
  return std::unique_ptr<EngineImpl>(new EngineImpl(options, max_model_len, std::move(model),
                                                    std::move(eos_token_ids), std::move(kv_cache),
                                                    std::move(proposer)));
}

absl::StatusOr<std::vector<int>> CudaGraphSizes(const EngineOptions& options) {
  std::vector<int> sizes;
  if (options.backend != Backend::kCuda || options.enforce_eager) return sizes;
  if (!options.cuda_graph_sizes.empty()) {
    for (int s : options.cuda_graph_sizes) {
      if (s < 1 || s > options.max_num_seqs) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "cuda_graph_sizes: %d is outside [1, max_num_seqs = %d]", s, options.max_num_seqs));
      }
      sizes.push_back(s);
    }
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    return sizes;
  }
  // vLLM's default capture list: 1, 2, 4, then every multiple of 8.
  for (int s : {1, 2, 4}) {
    if (s <= options.max_num_seqs) sizes.push_back(s);
  }
  for (int s = 8; s <= options.max_num_seqs; s += 8) sizes.push_back(s);
  if (sizes.empty() || sizes.back() < options.max_num_seqs) sizes.push_back(options.max_num_seqs);
  return sizes;
}

EngineImpl::EngineImpl(const EngineOptions& options, int max_model_len,
                       std::unique_ptr<Model> model, std::vector<int> eos_token_ids,
                       std::unique_ptr<KvCache> kv_cache, std::unique_ptr<Proposer> proposer)
    : options_(options),
      max_model_len_(max_model_len),
      model_(std::move(model)),
      kv_cache_(std::move(kv_cache)),
      scheduler_(SchedulerConfig{options.max_num_seqs, options.max_num_batched_tokens,
                                 options.page_size, options.enable_prefix_caching},
                 &kv_cache_->allocator()),
      eos_token_ids_(eos_token_ids),
      runner_(model_.get(), kv_cache_.get(), eos_token_ids_),
      stop_checker_(std::move(eos_token_ids)),
      proposer_(std::move(proposer)) {
  async_steps_ = options.async_scheduling && model_->SupportsAsyncSteps() && proposer_ == nullptr;
  if (async_steps_) max_in_flight_ = std::max(1, model_->MaxStepsInFlight());
}

EngineImpl::~EngineImpl() {
  // The device may still be running launched steps over the KV pool, which goes first.
  DrainLaunched();
}

void EngineImpl::DrainLaunched() {
  while (!launched_.empty()) {
    for (const ScheduledChunk& chunk : launched_.front().chunks) chunk.seq->in_flight = false;
    launched_.pop_front();
    runner_.Collect().IgnoreError();
  }
}

absl::Status EngineImpl::ValidateRequestBody(const EngineRequest& request) const {
  if (request.prompt_tokens.empty()) return absl::InvalidArgumentError("empty prompt");
  RETURN_IF_ERROR(ValidateSamplingParams(request.sampling));
  const int vocab = model_->config().vocab_size;
  for (int32_t t : request.prompt_tokens) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("prompt token id %d outside the vocabulary [0, %d)", t, vocab));
    }
  }
  for (const auto& [t, bias] : request.sampling.logit_bias) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("logit_bias token id %d outside the vocabulary [0, %d)", t, vocab));
    }
  }
  for (int32_t t : request.sampling.stop_token_ids) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrFormat("stop token id %d outside the vocabulary [0, %d)", t, vocab));
    }
  }
  if (request.sampling.logit_bias.size() + request.sampling.stop_token_ids.size() +
          eos_token_ids_.size() >
      static_cast<size_t>(kMaxBiasPerRow)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "logit_bias and stop_token_ids together hold more than %d tokens", kMaxBiasPerRow));
  }
  const int64_t total =
      static_cast<int64_t>(request.prompt_tokens.size()) + request.sampling.max_tokens;
  if (total > max_model_len_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt (%d tokens) + max_tokens (%d) exceeds the model's context length of %d tokens",
        request.prompt_tokens.size(), request.sampling.max_tokens, max_model_len_));
  }
  const int pages = PagesForTokens(total, options_.page_size);
  if (pages > kv_cache_->layout().num_pages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("request needs %d KV pages; the cache holds only %d", pages,
                        kv_cache_->layout().num_pages));
  }
  return absl::OkStatus();
}

std::unique_ptr<Sequence> EngineImpl::NewSequence(EngineRequest request) {
  auto seq = std::make_unique<Sequence>();
  seq->id = std::move(request.id);
  seq->arrival = next_arrival_++;
  seq->num_prompt_tokens = static_cast<int>(request.prompt_tokens.size());
  seq->tokens = std::move(request.prompt_tokens);
  seq->sampling = std::move(request.sampling);
  seq->prefill_only = request.prefill_only;
  seq->keep_kv_when_finished = request.prefill_only && request.keep_kv_when_finished;
  seq->seed = seq->sampling.seed.value_or(SeedFromRequestId(seq->id));
  return seq;
}

absl::Status EngineImpl::AddRequest(EngineRequest request) {
  if (!broken_.ok()) return BrokenError();
  if (sequences_.contains(request.id)) {
    return absl::AlreadyExistsError(absl::StrFormat("request '%s' already exists", request.id));
  }
  RETURN_IF_ERROR(ValidateRequestBody(request));
  RETURN_IF_ERROR(ValidateSiblings(request));
  const std::vector<SiblingRequest> siblings = std::move(request.siblings);
  std::unique_ptr<Sequence> seq = NewSequence(std::move(request));
  counters_.num_prompt_tokens_total += seq->num_prompt_tokens;
  // Prompt logprobs need every prompt row's logits: no cached prefix (as vLLM).
  seq->cache_prefix = options_.enable_prefix_caching && seq->sampling.prompt_logprobs < 0;
  ExtendPageHashes(seq.get());
  scheduler_.AddWaiting(seq.get());
  Sequence* parent = seq.get();
  sequences_.emplace(seq->id, std::move(seq));
  AddSiblings(parent, siblings);
  return absl::OkStatus();
}

absl::Status EngineImpl::Abort(const std::string& id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) {
    return absl::NotFoundError(absl::StrFormat("no live request '%s'", id));
  }
  if (!it->second->abort_requested) {
    it->second->abort_requested = true;
    ++num_abort_requested_;
  }
  return absl::OkStatus();
}

bool EngineImpl::HasWork() const {
  return scheduler_.num_running() > 0 || scheduler_.num_waiting() > 0 || num_abort_requested_ > 0 ||
         !launched_.empty();
}

void EngineImpl::CountStep(const ModelRunner::StepResult& result) {
  counters_.device_wait_ns_total += result.output.device_wait_ns;
  counters_.num_graph_steps_total += result.output.graph_replayed ? 1 : 0;
}

absl::Status EngineImpl::CollectLaunched(std::vector<RequestOutput>* outputs) {
  const ScheduleDecision decision = std::move(launched_.front());
  launched_.pop_front();
  for (const ScheduledChunk& chunk : decision.chunks) chunk.seq->in_flight = false;
  absl::StatusOr<ModelRunner::StepResult> result = runner_.Collect();
  if (!result.ok()) {
    if (IsBackendUnusable(result.status())) return Break(result.status());
    FailBatch(decision, result.status(), outputs);
    return absl::OkStatus();
  }
  PostProcess(decision, *result, outputs);
  CountStep(*result);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RequestOutput>> EngineImpl::Step() {
  if (!broken_.ok()) return broken_;
  // The engine thread's time in Step() calls that ran or collected a step: with async
  // scheduling that is what the device waits for between steps (the caller's handling of the
  // outputs overlaps the launched step); without, the caller's time adds to it.
  const absl::Time start = Clock::Real()->Now();
  const int64_t steps_before = counters_.num_steps_total;
  const bool collects = !launched_.empty();
  absl::StatusOr<std::vector<RequestOutput>> outputs = StepOnce();
  if (collects || counters_.num_steps_total != steps_before) {
    counters_.step_time_ns_total += absl::ToInt64Nanoseconds(Clock::Real()->Now() - start);
  }
  return outputs;
}

absl::StatusOr<std::vector<RequestOutput>> EngineImpl::StepOnce() {
  std::vector<RequestOutput> outputs;
  // A full pipeline gives back its oldest step first (with one step in flight: the one the
  // previous Step() launched).
  if (static_cast<int>(launched_.size()) >= max_in_flight_) {
    RETURN_IF_ERROR(CollectLaunched(&outputs));
  }
  for (RequestOutput& out : FinishAborted()) outputs.push_back(std::move(out));
  if (proposer_ != nullptr) {
    const absl::Status proposed = Propose();
    if (IsBackendUnusable(proposed)) return Break(proposed);
    // Any other failure costs only this step's proposals: the step decodes without them.
    if (!proposed.ok()) {
      LOG(WARNING) << "no proposals this step: " << proposed;
    }
  }
  ScheduleDecision decision = scheduler_.Schedule();
  if (decision.empty() && !launched_.empty()) {
    // Every runnable sequence is in flight: wait for the oldest step, then schedule again.
    RETURN_IF_ERROR(CollectLaunched(&outputs));
    for (RequestOutput& out : FinishAborted()) outputs.push_back(std::move(out));
    decision = scheduler_.Schedule();
  }
  if (decision.empty()) return outputs;
  ++counters_.num_steps_total;

  // A step that completes prefill-only prompts reports its layers as they are stored
  // (engine/kv_push.h): it runs whole, never launched.
  const bool pushes = AnnouncePushes(decision);
  if (async_steps_ && !pushes && ModelRunner::CanLaunch(decision)) {
    // Returns its predecessors' outputs while the device runs it (engine.h).
    const absl::Status launched = runner_.Launch(decision);
    if (!launched.ok()) {
      if (IsBackendUnusable(launched)) return Break(launched);
      FailBatch(decision, launched, &outputs);
      return outputs;
    }
    for (const ScheduledChunk& chunk : decision.chunks) chunk.seq->in_flight = true;
    launched_.push_back(std::move(decision));
    max_launched_ = std::max(max_launched_, static_cast<int>(launched_.size()));
    ++counters_.num_async_steps_total;
    return outputs;
  }
  // A synchronous step runs after the launched ones (disjoint sequences): those come back
  // first, so that their outputs stay ahead of it.
  while (!launched_.empty()) RETURN_IF_ERROR(CollectLaunched(&outputs));
  LayerStoredHook layer_hook;
  if (pushes) {
    layer_hook = [this](int layer, void* event) { push_listener_->OnLayerStored(layer, event); };
  }
  absl::StatusOr<ModelRunner::StepResult> result =
      runner_.Run(decision, pushes ? &layer_hook : nullptr);
  if (!result.ok()) {
    if (IsBackendUnusable(result.status())) return Break(result.status());
    FailBatch(decision, result.status(), &outputs);
    return outputs;
  }
  PostProcess(decision, *result, &outputs);
  CountStep(*result);
  return outputs;
}

}  // namespace tandem
