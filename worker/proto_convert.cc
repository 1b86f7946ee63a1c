#include "worker/proto_convert.h"

#include <algorithm>
#include <utility>

namespace tandem {

SamplingParams SamplingFromProto(const tandem::v1::SamplingParams& p) {
  SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p();
  if (p.has_seed()) s.seed = p.seed();
  s.max_tokens = p.max_tokens();
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.min_p = p.min_p();
  s.min_tokens = p.min_tokens();
  s.repetition_penalty = p.repetition_penalty() == 0.0f ? 1.0f : p.repetition_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.presence_penalty = p.presence_penalty();
  s.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  // Map order is unspecified: sorted, so that a request's bias rows do not depend on it.
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  s.logprobs = p.has_logprobs() ? p.logprobs() : -1;
  s.prompt_logprobs = p.has_prompt_logprobs() ? p.prompt_logprobs() : -1;
  return s;
}

tandem::v1::TokenLogprobs LogprobsToProto(const TokenLogprobs& lp) {
  tandem::v1::TokenLogprobs out;
  out.set_logprob(lp.logprob);
  for (const auto& [id, logprob] : lp.top) {
    tandem::v1::TopLogprob* top = out.add_top();
    top->set_token_id(id);
    top->set_logprob(logprob);
  }
  return out;
}

std::vector<SiblingRequest> SiblingsFromProto(
    const google::protobuf::RepeatedPtrField<tandem::v1::SiblingSequence>& siblings) {
  std::vector<SiblingRequest> out;
  for (const tandem::v1::SiblingSequence& s : siblings) {
    SiblingRequest r;
    r.id = s.request_id();
    if (s.has_seed()) r.seed = s.seed();
    out.push_back(std::move(r));
  }
  return out;
}

tandem::v1::FinishReason FinishReasonToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return tandem::v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return tandem::v1::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return tandem::v1::FINISH_REASON_ABORT;
    case FinishReason::kError:
      return tandem::v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
    case FinishReason::kPrefillDone:
      break;
  }
  return tandem::v1::FINISH_REASON_UNSPECIFIED;
}

tandem::v1::TokenEvent TokenEventFor(const RequestOutput& out) {
  tandem::v1::TokenEvent ev;
  ev.mutable_token_ids()->Assign(out.new_tokens.begin(), out.new_tokens.end());
  for (const TokenLogprobs& lp : out.logprobs) *ev.add_logprobs() = LogprobsToProto(lp);
  for (const TokenLogprobs& lp : out.prompt_logprobs) {
    *ev.add_prompt_logprobs() = LogprobsToProto(lp);
  }
  ev.set_num_cached_tokens(out.num_cached_tokens);
  ev.set_finish_reason(FinishReasonToProto(out.finish_reason));
  if (out.finish_reason == FinishReason::kError) ev.set_error_message(out.error);
  return ev;
}

}  // namespace tandem
