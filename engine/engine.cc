#include "engine/engine.h"

#include "base/status_macros.h"
#include "engine/engine_impl.h"
#include "engine/tokenizer/tokenizer.h"

namespace tandem {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
    case FinishReason::kPrefillDone:
      return "prefill_done";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadModel(options.model_dir, options.backend));
  std::unique_ptr<Tokenizer> tokenizer;
  if (options.load_tokenizer) {
    ASSIGN_OR_RETURN(tokenizer, Tokenizer::Load(options.model_dir));
  }
  return CreateWithModel(options, std::move(model), std::move(tokenizer));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::CreateWithModel(
    const EngineOptions& options, std::unique_ptr<Model> model,
    std::unique_ptr<Tokenizer> tokenizer) {
  ASSIGN_OR_RETURN(std::unique_ptr<EngineImpl> engine,
                   EngineImpl::Create(options, std::move(model), std::move(tokenizer)));
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace tandem
