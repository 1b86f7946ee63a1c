// Fuzzes the OpenAI request parser and validation (router/openai_request.h): completions and
// chat bodies, and /tokenize's message parsing, over the router tests' byte tokenizer. Every
// input must end in a spec or an error Status; a spec must satisfy what validation promises.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/check.h"
#include "nlohmann/json.hpp"
#include "router/api_error.h"
#include "router/openai_request.h"
#include "tests/router/byte_tokenizer.h"

namespace {

using tandem::router::GenerateSpec;
using tandem::router::ModelContext;

void CheckSpec(const absl::StatusOr<GenerateSpec>& spec, const ModelContext& model) {
  if (!spec.ok()) {
    const int http = tandem::router::HttpStatusFor(spec.status());
    CHECK(http == 400 || http == 404) << spec.status();  // a client error, never a 5xx
    return;
  }
  CHECK(!spec->prompt_tokens.empty());
  CHECK_GE(spec->sampling.max_tokens, 1);
  CHECK_LE(static_cast<int64_t>(spec->prompt_tokens.size()) + spec->sampling.max_tokens,
           model.max_model_len);
  for (int32_t id : spec->prompt_tokens) CHECK(id >= 0 && id < model.vocab_size);
  for (int32_t id : spec->sampling.stop_token_ids) CHECK(id >= 0 && id < model.vocab_size);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tandem::testing::ByteTokenizer* tokenizer = new tandem::testing::ByteTokenizer();
  static const ModelContext model =
      tandem::router::testing::ByteModelContext(tokenizer, /*max_model_len=*/128);
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  CheckSpec(tandem::router::ParseCompletionRequest(body, model), model);
  CheckSpec(tandem::router::ParseChatRequest(body, model), model);
  absl::StatusOr<nlohmann::json> json = tandem::router::ParseJsonObject(body);
  if (json.ok()) {
    (void)tandem::router::CheckModel(*json, model);
    (void)tandem::router::ParseMessages(*json);
  }
  return 0;
}
