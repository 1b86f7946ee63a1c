// RequestFlow, output side: text (TextStream: detokenizing, stop strings), the terminal event,
// metrics, cleanup.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "router/request_flow.h"
#include "router/worker_calls.h"

namespace tandem::router {
namespace {

using tandem::v1::AbortRequest;
using tandem::v1::AbortResponse;
using tandem::v1::FinishReason;

const char* OutcomeOf(FinishReason reason) {
  switch (reason) {
    case tandem::v1::FINISH_REASON_STOP:
      return "stop";
    case tandem::v1::FINISH_REASON_LENGTH:
      return "length";
    case tandem::v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "error";
  }
}

}  // namespace

TokenLogprob RequestFlow::LogprobOf(int32_t id, float logprob) const {
  return TokenLogprob{id, deps_->tokenizer->Decode({id}, /*skip_special_tokens=*/false), logprob};
}

void RequestFlow::EmitTokens(
    int sequence, const google::protobuf::RepeatedField<int32_t>& all_ids,
    const google::protobuf::RepeatedPtrField<tandem::v1::TokenLogprobs>& logprobs, Actions& later,
    const google::protobuf::RepeatedPtrField<tandem::v1::TokenLogprobs>* prompt_logprobs) {
  if (all_ids.empty()) return;
  const size_t want_prompt = spec_.prompt_tokens.empty() ? 0 : spec_.prompt_tokens.size() - 1;
  if (spec_.sampling.prompt_logprobs >= 0 && prompt_logprobs != nullptr &&
      !prompt_logprobs->empty() && !prompt_logprobs_.has_value()) {
    if (static_cast<size_t>(prompt_logprobs->size()) != want_prompt) {
      Fail(absl::InternalError(absl::StrCat("worker sent ", prompt_logprobs->size(),
                                            " prompt logprobs for ", want_prompt,
                                            " prompt tokens after the first")),
           later);
      return;
    }
    std::vector<TokenLogprobInfo> infos;
    for (int i = 0; i < prompt_logprobs->size(); ++i) {
      const tandem::v1::TokenLogprobs& lp = (*prompt_logprobs)[i];
      TokenLogprobInfo info;
      info.sampled = LogprobOf(spec_.prompt_tokens[i + 1], lp.logprob());
      for (const tandem::v1::TopLogprob& top : lp.top()) {
        info.top.push_back(LogprobOf(top.token_id(), top.logprob()));
      }
      infos.push_back(std::move(info));
    }
    prompt_logprobs_ = std::move(infos);
  }
  if (spec_.sampling.prompt_logprobs >= 0 && sequences_[sequence]->completion_tokens == 0 &&
      !prompt_logprobs_.has_value()) {
    if (want_prompt > 0) {
      Fail(absl::InternalError("the worker sent the first token without the prompt logprobs"),
           later);
      return;
    }
    prompt_logprobs_.emplace();  // a one-token prompt: nothing to score
  }
  if (spec_.sampling.logprobs >= 0 && logprobs.size() != all_ids.size()) {
    Fail(absl::InternalError(absl::StrCat("worker sent ", logprobs.size(), " logprobs for ",
                                          all_ids.size(), " tokens")),
         later);
    return;
  }
  Sequence& seq = *sequences_[sequence];
  // Tokens after the one that completes a stop string are past the end of the output.
  const TextStream::Delta delta = seq.text.Add(absl::MakeConstSpan(all_ids.data(), all_ids.size()));
  const absl::Span<const int32_t> ids(all_ids.data(), delta.num_tokens);
  const absl::Time now = deps_->options.clock->Now();
  const bool first_delta = seq.completion_tokens == 0;
  if (seq.completion_tokens == 0) {
    seq.ttft_s = absl::ToDoubleSeconds(now - arrival_);
    seq.first_token_at = now;
    deps_->metrics->ttft().Observe(seq.ttft_s);
  } else {
    // Tokens that arrive together share the gap since the previous batch.
    const double gap = absl::ToDoubleSeconds(now - seq.last_token_at) / ids.size();
    for (size_t i = 0; i < ids.size(); ++i) deps_->metrics->itl().Observe(gap);
  }
  seq.last_token_at = now;
  seq.completion_tokens += ids.size();
  deps_->metrics->generation_tokens().Increment(ids.size());
  if (!ids.empty()) seq.last_token = ids.back();
  OutputDelta out;
  if (spec_.sampling.prompt_logprobs >= 0 && first_delta) {
    out.prompt_logprobs = prompt_logprobs_;  // with the sequence's first token
  }
  out.token_ids.assign(ids.begin(), ids.end());
  out.text = delta.text;
  if (spec_.sampling.logprobs >= 0) {
    for (size_t i = 0; i < ids.size(); ++i) {
      const tandem::v1::TokenLogprobs& lp = logprobs[static_cast<int>(i)];
      TokenLogprobInfo info;
      info.sampled = LogprobOf(ids[i], lp.logprob());
      for (const tandem::v1::TopLogprob& top : lp.top()) {
        info.top.push_back(LogprobOf(top.token_id(), top.logprob()));
      }
      out.logprobs.push_back(std::move(info));
    }
  }
  seq.sink->OnOutput(out);
  if (delta.stopped) {
    // The workers may still be generating: FinishSequence aborts them.
    FinishSequence(sequence, tandem::v1::FINISH_REASON_STOP, /*router_ended=*/true, later);
  }
}

void RequestFlow::MergeTimings(const tandem::v1::PhaseTimings& t) {
  if (t.prefill_queue_s() > 0) timings_.set_prefill_queue_s(t.prefill_queue_s());
  if (t.prefill_s() > 0) timings_.set_prefill_s(t.prefill_s());
  if (t.kv_transfer_s() > 0) timings_.set_kv_transfer_s(t.kv_transfer_s());
  if (t.kv_transfer_bytes() > 0) timings_.set_kv_transfer_bytes(t.kv_transfer_bytes());
  if (t.first_decode_step_s() > 0) timings_.set_first_decode_step_s(t.first_decode_step_s());
}

void RequestFlow::FinishSequence(int sequence, FinishReason reason, bool router_ended,
                                 Actions& later) {
  if (phase_ == Phase::kDone) return;
  Sequence& seq = *sequences_[sequence];
  if (seq.sink == nullptr) return;  // ended already
  // Text held back (an incomplete character, a possible stop string) goes out now, unless it
  // completes a stop string.
  const TextStream::Delta tail = seq.text.Finish();
  if (tail.stopped) reason = tandem::v1::FINISH_REASON_STOP;
  if (!tail.text.empty()) seq.sink->OnOutput(OutputDelta{{}, tail.text, {}, std::nullopt});
  const absl::Time now = deps_->options.clock->Now();
  timings_.set_queue_s(absl::ToDoubleSeconds(admitted_at_ - arrival_));
  timings_.set_e2e_s(absl::ToDoubleSeconds(now - arrival_));
  timings_.set_ttft_s(seq.ttft_s);
  FinishInfo info;
  info.reason = reason;
  info.prompt_tokens = static_cast<int>(spec_.prompt_tokens.size());
  info.completion_tokens = seq.completion_tokens;
  info.cached_tokens = cached_tokens_;
  if (reason == tandem::v1::FINISH_REASON_STOP) {
    if (seq.text.stopped()) {
      info.stop_string = seq.text.matched_stop();
    } else if (std::find(spec_.sampling.stop_token_ids.begin(), spec_.sampling.stop_token_ids.end(),
                         seq.last_token) != spec_.sampling.stop_token_ids.end()) {
      info.stop_token_id = seq.last_token;
    }
  }
  info.timings = timings_;
  FinishedRequest finished;
  finished.prompt_tokens = info.prompt_tokens;
  finished.generation_tokens = seq.completion_tokens;
  finished.e2e_s = timings_.e2e_s();
  finished.router_queue_s = timings_.queue_s();
  finished.prefill_queue_s = timings_.prefill_queue_s();
  finished.queue_s = finished.router_queue_s + finished.prefill_queue_s;
  finished.prefill_s = timings_.prefill_s();
  if (seq.completion_tokens > 0) {
    finished.decode_s = absl::ToDoubleSeconds(seq.last_token_at - seq.first_token_at);
  }
  finished.kv_transfer_s = timings_.kv_transfer_s();
  finished.first_decode_step_s = timings_.first_decode_step_s();
  finished.kv_transfer_bytes = timings_.kv_transfer_bytes();
  deps_->metrics->ObserveFinished(finished);
  std::shared_ptr<GenerationSink> sink = std::move(seq.sink);
  if (--live_sequences_ > 0) {
    // Other sequences go on; a worker still streaming this one is told to end it alone.
    deps_->metrics->CountOutcome(OutcomeOf(reason));
    if (router_ended && phase_ == Phase::kDecoding && abort_decode_) {
      later.push_back([this, self = shared_from_this(), worker = *abort_decode_, sequence] {
        SendAbortSequence(worker, sequence);
      });
    }
    sink->OnFinish(info);
    return;
  }
  // Workers still holding state (a reservation never used, a stream stopped by a stop string)
  // are told to let go.
  const bool finished_at_prefill = phase_ == Phase::kPrefilling;
  // Metrics before the terminal call: a client reading /metrics right after its response
  // sees its request counted.
  EndCommon(OutcomeOf(reason),
            finished_at_prefill ? tandem::v1::ABORT_REASON_FINISHED_AT_PREFILL
                                : tandem::v1::ABORT_REASON_STOP_STRING,
            later);
  sink->OnFinish(info);
}

std::vector<std::shared_ptr<GenerationSink>> RequestFlow::TakeLiveSinks() {
  std::vector<std::shared_ptr<GenerationSink>> sinks;
  for (const std::unique_ptr<Sequence>& seq : sequences_) {
    if (seq->sink != nullptr) sinks.push_back(std::move(seq->sink));
  }
  return sinks;
}

void RequestFlow::AddSiblings(
    google::protobuf::RepeatedPtrField<tandem::v1::SiblingSequence>* out) const {
  for (size_t j = 1; j < sequences_.size(); ++j) {
    tandem::v1::SiblingSequence* s = out->Add();
    s->set_request_id(absl::StrCat(worker_request_id_, "-", j));
    // The samples of one prompt differ by seed (sequence 0 keeps the request's seed).
    if (spec_.sampling.seed) s->set_seed(*spec_.sampling.seed + j);
  }
}

void RequestFlow::Fail(absl::Status status, Actions& later) {
  if (phase_ == Phase::kDone) return;
  const bool cancelled = status.code() == absl::StatusCode::kCancelled;
  if (!cancelled) {
    LOG(WARNING) << "request " << worker_request_id_ << " failed: " << status;
  }
  deps_->metrics->e2e().Observe(absl::ToDoubleSeconds(deps_->options.clock->Now() - arrival_));
  std::vector<std::shared_ptr<GenerationSink>> sinks = TakeLiveSinks();
  EndCommon(
      cancelled ? "abort" : "error",
      cancelled ? tandem::v1::ABORT_REASON_CLIENT_CANCELLED : tandem::v1::ABORT_REASON_PEER_FAILED,
      later);
  for (const auto& sink : sinks) sink->OnError(status);
}

void RequestFlow::EndCommon(const char* outcome, tandem::v1::AbortReason abort_reason,
                            Actions& later) {
  phase_ = Phase::kDone;
  for (const std::unique_ptr<Sequence>& seq : sequences_) seq->sink.reset();
  deps_->metrics->CountOutcome(outcome);
  for (std::optional<WorkerRef>* ref : {&abort_prefill_, &abort_decode_}) {
    if (*ref) {
      later.push_back([this, self = shared_from_this(), worker = **ref, abort_reason] {
        SendAbort(worker, abort_reason);
      });
      ref->reset();
    }
  }
  // Streams still open are cancelled (a no-op for those already finished).
  for (const auto& context : {prefill_ctx_, decode_ctx_}) {
    if (context) later.push_back([context] { context->TryCancel(); });
  }
  ReleaseWorker(prefill_);
  ReleaseWorker(decode_);
  if (admitted_) {
    later.push_back([this, ticket = ticket_] { deps_->admission->Release(ticket); });
  }
  later.push_back([this, self = shared_from_this()] { deps_->on_done(worker_request_id_); });
}

void RequestFlow::ReleaseWorker(std::optional<WorkerRef>& ref) {
  if (!ref) return;
  deps_->registry->AddOutstanding(ref->id, ref->epoch, -1);
  ref.reset();
}

void RequestFlow::SendAbortSequence(const WorkerRef& worker, int sequence) {
  std::shared_ptr<WorkerStub> stub = deps_->registry->Stub(worker.id, worker.epoch);
  if (stub == nullptr) return;
  AbortRequest request;
  request.set_request_id(worker_request_id_);
  request.set_reason(tandem::v1::ABORT_REASON_STOP_STRING);
  request.set_sequence(sequence);
  UnaryCall<AbortRequest, AbortResponse>::Start(
      std::move(request), deps_->options.rpc_timeout,
      [stub](auto* c, auto* q, auto* r, auto cb) { stub->async()->Abort(c, q, r, cb); },
      [](const grpc::Status&, const AbortResponse&) {});
}

void RequestFlow::SendAbort(const WorkerRef& worker, tandem::v1::AbortReason reason) {
  std::shared_ptr<WorkerStub> stub = deps_->registry->Stub(worker.id, worker.epoch);
  if (stub == nullptr) return;  // gone or restarted: it holds nothing of ours any more
  AbortRequest request;
  request.set_request_id(worker_request_id_);
  request.set_reason(reason);
  UnaryCall<AbortRequest, AbortResponse>::Start(
      std::move(request), deps_->options.rpc_timeout,
      [stub](auto* c, auto* q, auto* r, auto cb) { stub->async()->Abort(c, q, r, cb); },
      [id = worker_request_id_, worker](const grpc::Status& status, const AbortResponse&) {
        if (!status.ok()) {
          LOG(DEBUG) << "Abort(" << id << ") on '" << worker.id
                     << "' failed: " << status.error_message();
        }
      });
}

}  // namespace tandem::router
