#include "router/worker_proto.h"

#include "absl/strings/str_cat.h"

namespace tandem::router {

tandem::v1::SamplingParams ToProto(const SamplingSpec& s) {
  tandem::v1::SamplingParams p;
  p.set_temperature(s.temperature);
  p.set_top_k(s.top_k);
  p.set_top_p(s.top_p);
  if (s.seed) p.set_seed(*s.seed);
  p.set_max_tokens(s.max_tokens);
  for (int32_t id : s.stop_token_ids) p.add_stop_token_ids(id);
  p.set_ignore_eos(s.ignore_eos);
  p.set_min_p(s.min_p);
  p.set_min_tokens(s.min_tokens);
  p.set_repetition_penalty(s.repetition_penalty);
  p.set_frequency_penalty(s.frequency_penalty);
  p.set_presence_penalty(s.presence_penalty);
  for (const auto& [id, bias] : s.logit_bias) (*p.mutable_logit_bias())[id] = bias;
  if (s.logprobs >= 0) p.set_logprobs(s.logprobs);
  if (s.prompt_logprobs >= 0) p.set_prompt_logprobs(s.prompt_logprobs);
  return p;
}

absl::Status WorkerCallError(const grpc::Status& status, const std::string& worker_id,
                             const char* what) {
  std::string message =
      absl::StrCat(what, " on worker '", worker_id, "' failed: ", status.error_message(),
                   " (gRPC code ", static_cast<int>(status.error_code()), ")");
  if (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
    return absl::InvalidArgumentError(message);
  }
  return absl::UnavailableError(message);
}

}  // namespace tandem::router
