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

}  // namespace tandem
