#include "engine/engine_impl.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/logging.h"
#include "base/status_macros.h"

namespace tandem {
namespace {

KvLayout LayoutFor(const ModelConfig& config, int page_size) {
  KvLayout layout;
  layout.num_layers = config.num_layers;
  layout.page_size = page_size;
  layout.num_kv_heads = config.num_kv_heads;
  layout.head_dim = config.head_dim;
  // The kernels store the cache in fp32 or bf16; bf16 unless the model itself is fp32.
  layout.dtype = config.dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  return layout;
}

absl::StatusOr<int> ResolveMaxModelLen(const EngineOptions& options, const ModelConfig& config) {
  if (options.max_model_len < 0 || options.max_model_len > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrFormat("max_model_len %d outside [0, max_position_embeddings = %d]",
                        options.max_model_len, config.max_position_embeddings));
  }
  return options.max_model_len > 0 ? options.max_model_len : config.max_position_embeddings;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EngineImpl>> EngineImpl::Create(const EngineOptions& options,
                                                               std::unique_ptr<Model> model,
                                                               std::vector<int> eos_token_ids) {
  if (model == nullptr) return absl::InvalidArgumentError("engine needs a model");
  if (options.page_size < 1 || options.max_num_seqs < 1 || options.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(
        "page_size, max_num_seqs and max_num_batched_tokens must be >= 1");
  }
  if (options.backend != Backend::kCpu) {
    return absl::UnimplementedError("the engine runs on the CPU backend only for now");
  }
  ASSIGN_OR_RETURN(const int max_model_len, ResolveMaxModelLen(options, model->config()));
  KvLayout layout = LayoutFor(model->config(), options.page_size);
  layout.num_pages = options.num_pages > 0 ? options.num_pages
                                           : KvCache::NumPagesFor(layout, options.kv_memory_bytes);
  if (layout.num_pages < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "kv_memory_bytes %d holds no KV page of this model", options.kv_memory_bytes));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<KvCache> kv_cache, KvCache::CreateOnHost(layout));
  LOG(INFO) << "KV cache: " << layout.num_pages << " pages of " << layout.page_size << " tokens, "
            << (layout.PoolBytes() >> 20) << " MiB";
  return std::unique_ptr<EngineImpl>(new EngineImpl(options, max_model_len, std::move(model),
                                                    std::move(eos_token_ids), std::move(kv_cache)));
}

EngineImpl::EngineImpl(const EngineOptions& options, int max_model_len,
                       std::unique_ptr<Model> model, std::vector<int> eos_token_ids,
                       std::unique_ptr<KvCache> kv_cache)
    : options_(options),
      max_model_len_(max_model_len),
      model_(std::move(model)),
      kv_cache_(std::move(kv_cache)),
      scheduler_(
          SchedulerConfig{options.max_num_seqs, options.max_num_batched_tokens, options.page_size},
          &kv_cache_->allocator()),
      runner_(model_.get(), kv_cache_.get()),
      sampler_(options.backend),
      stop_checker_(std::move(eos_token_ids)) {}

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
  seq->seed = seq->sampling.seed.value_or(SeedFromRequestId(seq->id));
  return seq;
}

absl::Status EngineImpl::AddRequest(EngineRequest request) {
  if (!broken_.ok()) return BrokenError();
  if (sequences_.contains(request.id)) {
    return absl::AlreadyExistsError(absl::StrFormat("request '%s' already exists", request.id));
  }
  RETURN_IF_ERROR(ValidateRequestBody(request));
  std::unique_ptr<Sequence> seq = NewSequence(std::move(request));
  counters_.num_prompt_tokens_total += seq->num_prompt_tokens;
  scheduler_.AddWaiting(seq.get());
  sequences_.emplace(seq->id, std::move(seq));
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
  return scheduler_.num_running() > 0 || scheduler_.num_waiting() > 0 || num_abort_requested_ > 0;
}

absl::StatusOr<std::vector<RequestOutput>> EngineImpl::Step() {
  if (!broken_.ok()) return broken_;
  std::vector<RequestOutput> outputs = FinishAborted();
  const ScheduleDecision decision = scheduler_.Schedule();
  if (decision.empty()) return outputs;
  ++counters_.num_steps_total;

  absl::StatusOr<ModelRunner::StepResult> result = runner_.Run(decision);
  absl::StatusOr<std::vector<int32_t>> tokens =
      result.ok() ? Sample(decision, *result) : result.status();
  if (!tokens.ok()) {
    if (IsBackendUnusable(tokens.status())) return Break(tokens.status());
    FailBatch(decision, tokens.status(), &outputs);
    return outputs;
  }
  PostProcess(decision, result->sampling_chunks, *tokens, &outputs);
  return outputs;
}

}  // namespace tandem
