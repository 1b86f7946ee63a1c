// Conversions between worker.proto messages and engine types (one place, both worker roles).
#pragma once

#include "engine/engine.h"
#include "tandem/v1/generate.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

SamplingParams SamplingFromProto(const tandem::v1::SamplingParams& p);
// kNone -> UNSPECIFIED, kStop -> STOP, kLength -> LENGTH, kAbort -> ABORT, kError -> ERROR
// (kPrefillDone is not a client-visible reason: UNSPECIFIED).
tandem::v1::FinishReason FinishReasonToProto(FinishReason r);
// The TokenEvent a decode or mixed worker streams for one engine output: its tokens and, when
// the output ends the request, its finish reason (and error message, for kError).
tandem::v1::TokenEvent TokenEventFor(const RequestOutput& out);

}  // namespace tandem
