#include "worker/proto_convert.h"

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
  return s;
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
  ev.set_finish_reason(FinishReasonToProto(out.finish_reason));
  if (out.finish_reason == FinishReason::kError) ev.set_error_message(out.error);
  return ev;
}

}  // namespace tandem
