// EngineImpl: the Engine (engine/engine.h) over a Model, a KvCache, a Scheduler, a Sampler and a
// StopChecker. Single-threaded: the engine loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/engine.h"
#include "engine/kv/kv_cache.h"
#include "engine/runner/model_runner.h"
#include "engine/sample/stop_checker.h"
#include "engine/sched/scheduler.h"
#include "engine/sched/sequence.h"
#include "engine/spec/proposer.h"

namespace tandem {

class EngineImpl : public Engine {
 public:
  // Validates `options` against the model and allocates the KV pool. A request stops at any of
  // `eos_token_ids` (unless ignore_eos). `draft`: the draft model of the draft method (its own
  // KV pool is carved out of the same budget).
  static absl::StatusOr<std::unique_ptr<EngineImpl>> Create(const EngineOptions& options,
                                                            std::unique_ptr<Model> model,
                                                            std::vector<int> eos_token_ids,
                                                            std::unique_ptr<Model> draft = nullptr);

  ~EngineImpl() override;

  absl::Status AddRequest(EngineRequest request) override;
  absl::Status Abort(const std::string& id) override;
  absl::StatusOr<std::vector<RequestOutput>> Step() override;
  bool HasWork() const override;

  absl::StatusOr<std::vector<int32_t>> ReservePages(const std::string& id, int num_tokens) override;
  absl::Status AddPrefilledRequest(EngineRequest request, int32_t first_token,
                                   bool first_token_finished = false) override;
  absl::StatusOr<std::vector<int32_t>> KvPages(const std::string& id) const override;
  absl::Status ReleaseRequest(const std::string& id) override;
  void* kv_pool() override { return kv_cache_->pool(); }
  const KvLayout& kv_layout() const override { return kv_cache_->layout(); }
  bool kv_pool_on_device() const override { return model_->backend() == Backend::kCuda; }
  absl::Status CopyKvMemory(void* dst, const void* src, int64_t bytes) const override;
  void SetKvPushListener(KvPushListener* listener) override { push_listener_ = listener; }

  const ModelConfig& model_config() const override { return model_->config(); }
  int max_model_len() const override { return max_model_len_; }
  EngineStats Stats() const override;
  int ResetPrefixCache() override;
  std::vector<uint64_t> PrefixCacheHashes() const override;
  uint64_t prefix_cache_version() const override;

 private:
  EngineImpl(const EngineOptions& options, int max_model_len, std::unique_ptr<Model> model,
             std::vector<int> eos_token_ids, std::unique_ptr<KvCache> kv_cache,
             std::unique_ptr<Proposer> proposer);

  // AddRequest's checks but the duplicate id: InvalidArgument.
  absl::Status ValidateRequestBody(const EngineRequest& request) const;
  std::unique_ptr<Sequence> NewSequence(EngineRequest request);

  // Step's parts.
  std::vector<RequestOutput> FinishAborted();
  // The oldest launched step (async scheduling): waits for it and post-processes it into
  // `outputs`.
  // Returns the error that broke the engine, if it did.
  absl::Status CollectLaunched(std::vector<RequestOutput>* outputs);
  // Collects every launched step, discarding what they computed (the engine broke or goes).
  void DrainLaunched();
  // Step() but its timing.
  absl::StatusOr<std::vector<RequestOutput>> StepOnce();
  // The device counters of a collected step.
  void CountStep(const ModelRunner::StepResult& result);
  void PostProcess(const ScheduleDecision& decision, const ModelRunner::StepResult& result,
                   std::vector<RequestOutput>* outputs);
  // Appends one sampled token (row `row` of `output`) to `seq`: stop checks, text, finishing.
  RequestOutput AppendToken(Sequence* seq, const StepOutput& output, size_t row);
  // Appends `token` to `seq` and `out` (with `logprobs` when the request asked for them): stop
  // checks and finishing. True when no token may follow: `seq` finished (and is gone) or handed
  // its prefill over.
  bool Emit(Sequence* seq, int32_t token, TokenLogprobs logprobs, RequestOutput* out);
  // Speculative decoding (engine_spec.cc): proposals for every decoding sequence before the
  // step is scheduled, and the verification of a verify chunk's rows [row, row + 1 + m).
  absl::Status Propose();
  RequestOutput VerifyChunk(const ScheduledChunk& chunk, const ModelRunner::StepResult& result,
                            size_t row);
  void FailBatch(const ScheduleDecision& decision, const absl::Status& error,
                 std::vector<RequestOutput>* outputs);
  // The backend is unusable: ends every request (pages freed) and remembers `error`.
  absl::Status Break(const absl::Status& error);
  // FailedPrecondition naming broken_, for calls that take new work after Break.
  absl::Status BrokenError() const;
  void Finish(Sequence* seq);  // frees pages, forgets the sequence
  // Siblings (engine_fork.cc): the checks of AddRequest for request.siblings, the sibling
  // sequences (kForkWaiting) of a new parent, the fork once the parent's prompt KV is computed,
  // and what becomes of waiting siblings when their parent ends first.
  absl::Status ValidateSiblings(const EngineRequest& request) const;
  void AddSiblings(Sequence* parent, const std::vector<SiblingRequest>& siblings);
  void Fork(Sequence* parent);
  void OrphanSiblings(Sequence* parent);
  // The prefill-only chunks of `decision` that compute their prompt's last token, announced to
  // the push listener (engine/kv_push.h); false when there are none (or no listener).
  bool AnnouncePushes(const ScheduleDecision& decision);
  // Prefix caching: extends seq->page_hashes over its full pages of tokens, and hashes the
  // pages of its block table whose every token's KV is now computed.
  void ExtendPageHashes(Sequence* seq) const;
  void RegisterFullPages(Sequence* seq);

  EngineOptions options_;
  int max_model_len_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> kv_cache_;
  Scheduler scheduler_;
  std::vector<int> eos_token_ids_;  // before runner_, which is built with them
  ModelRunner runner_;
  StopChecker stop_checker_;
  std::unique_ptr<Proposer> proposer_;  // null: no speculation
  absl::flat_hash_map<std::string, std::unique_ptr<Sequence>> sequences_;
  int64_t next_arrival_ = 0;
  int num_abort_requested_ = 0;
  // Async scheduling: steps are launched (Step) and collected by a later Step(): the next one,
  // or, with pipeline micro-batches (Model::MaxStepsInFlight > 1), the one that finds
  // max_in_flight_ steps in flight (or nothing else to schedule). Steps in flight together hold
  // disjoint sequences (Sequence::in_flight; the scheduler skips those).
  bool async_steps_ = false;
  int max_in_flight_ = 1;
  std::deque<ScheduleDecision> launched_;    // launched, not yet collected; oldest first
  int max_launched_ = 0;                     // the most ever in flight (EngineStats)
  KvPushListener* push_listener_ = nullptr;  // SetKvPushListener; null: no layer-wise push
  absl::Status broken_;                      // OK until the backend became unusable (Break)
  EngineStats counters_;                     // the *_total fields; gauges are computed in Stats()
};

}  // namespace tandem
