// Conversions between worker.proto messages and engine types (one place, both worker roles).
#pragma once

#include <vector>

#include "engine/engine.h"
#include "tandem/v1/generate.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// Every field, logit_bias sorted by token id; repetition_penalty 0 (unset) reads as 1, logprobs
// and prompt_logprobs unset as -1. The engine validates the ranges (AddRequest).
SamplingParams SamplingFromProto(const tandem::v1::SamplingParams& p);
tandem::v1::TokenLogprobs LogprobsToProto(const TokenLogprobs& lp);
std::vector<SiblingRequest> SiblingsFromProto(
    const google::protobuf::RepeatedPtrField<tandem::v1::SiblingSequence>& siblings);
// kNone -> UNSPECIFIED, kStop -> STOP, kLength -> LENGTH, kAbort -> ABORT, kError -> ERROR
// (kPrefillDone is not a client-visible reason: UNSPECIFIED).
tandem::v1::FinishReason FinishReasonToProto(FinishReason r);
// The TokenEvent a decode or mixed worker streams for one engine output: its tokens and, when
// the output ends the request, its finish reason (and error message, for kError); its logprobs
// and num_cached_tokens; the prompt logprobs on the output that carries them.
tandem::v1::TokenEvent TokenEventFor(const RequestOutput& out);

}  // namespace tandem
