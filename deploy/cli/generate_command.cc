// tandem generate --model DIR --prompt TEXT [--max-tokens N] [--temperature T] [--top-p P]
//                 [--top-k K] [--seed S] [--chat] [--ignore-eos] [--stop STR ...]
//                 [engine flags: --backend ... (worker/engine_flags.h)]
// The single-process example: drives the Engine directly (no RPC), streams the text to stdout
// and prints the throughput to stderr at the end. The engine knows tokens only: the text and the
// stop strings come from a TextStream here, as in the router, and a stop string aborts the
// request in the engine.
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "deploy/cli/commands.h"
#include "engine/engine.h"
#include "tokenizer/text_stream.h"
#include "tokenizer/tokenizer.h"
#include "worker/engine_flags.h"

namespace tandem::cli {
namespace {

struct GenerateOptions {
  std::string model_dir;
  std::string prompt;
  int max_tokens = 64;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int top_k = -1;
  int64_t seed = -1;
  bool chat = false;
  bool ignore_eos = false;
  std::vector<std::string> stop;
  EngineFlags engine;
};

void Write(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

// The prompt's token ids: chat-formatted with the checkpoint's template if asked.
absl::StatusOr<std::vector<int32_t>> EncodePrompt(const GenerateOptions& opts,
                                                  const Tokenizer& tokenizer) {
  if (!opts.chat) return tokenizer.Encode(opts.prompt, /*add_special_tokens=*/true);
  absl::StatusOr<ChatFormat> format = LoadChatFormat(opts.model_dir);
  if (!format.ok()) return format.status();
  absl::StatusOr<std::string> text =
      ApplyChatTemplate(*format, {{"user", opts.prompt}}, /*add_generation_prompt=*/true);
  if (!text.ok()) return text.status();
  return tokenizer.Encode(*text, /*add_special_tokens=*/false);
}

int Generate(const GenerateOptions& opts) {
  EngineFlags flags = opts.engine;
  flags.engine.model_dir = opts.model_dir;
  if (absl::Status s = ResolveEngineFlags(&flags); !s.ok()) {
    std::cerr << "generate: " << s << "\n";
    return 1;
  }
  const EngineOptions& options = flags.engine;
  const absl::Time load_start = Clock::Real()->Now();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  if (!engine.ok()) {
    std::cerr << "generate: " << engine.status() << "\n";
    return 1;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(opts.model_dir);
  if (!tokenizer.ok()) {
    std::cerr << "generate: " << tokenizer.status() << "\n";
    return 1;
  }
  absl::StatusOr<std::vector<int32_t>> prompt = EncodePrompt(opts, **tokenizer);
  if (!prompt.ok()) {
    std::cerr << "generate: " << prompt.status() << "\n";
    return 1;
  }
  const std::string request_id = "generate";
  EngineRequest request;
  request.id = request_id;
  request.prompt_tokens = *std::move(prompt);
  request.sampling.max_tokens = opts.max_tokens;
  request.sampling.temperature = opts.temperature;
  request.sampling.top_p = opts.top_p;
  request.sampling.top_k = opts.top_k;
  request.sampling.ignore_eos = opts.ignore_eos;
  if (opts.seed >= 0) request.sampling.seed = static_cast<uint64_t>(opts.seed);
  const size_t num_prompt_tokens = request.prompt_tokens.size();
  if (absl::Status s = (*engine)->AddRequest(std::move(request)); !s.ok()) {
    std::cerr << "generate: " << s << "\n";
    return 1;
  }

  const absl::Time start = Clock::Real()->Now();
  absl::Time first_token;
  int64_t num_generated = 0;
  FinishReason reason = FinishReason::kNone;
  TextStream text(tokenizer->get(), /*skip_special_tokens=*/true, opts.stop);
  while ((*engine)->HasWork()) {
    absl::StatusOr<std::vector<RequestOutput>> outputs = (*engine)->Step();
    if (!outputs.ok()) {
      std::cerr << "\ngenerate: " << outputs.status() << "\n";
      return 1;
    }
    for (const RequestOutput& out : *outputs) {
      if (text.stopped()) continue;  // the abort's kAbort
      if (num_generated == 0 && !out.new_tokens.empty()) first_token = Clock::Real()->Now();
      const TextStream::Delta delta = text.Add(out.new_tokens);
      num_generated += delta.num_tokens;
      Write(delta.text);
      if (delta.stopped) {
        reason = FinishReason::kStop;
        (void)(*engine)->Abort(request_id);  // frees its pages at the next step
        continue;
      }
      if (out.finish_reason != FinishReason::kNone) {
        reason = out.finish_reason;
        const TextStream::Delta tail = text.Finish();
        if (tail.stopped) reason = FinishReason::kStop;
        Write(tail.text);
      }
      if (out.finish_reason == FinishReason::kError) std::cerr << "\ngenerate: " << out.error;
    }
  }
  const absl::Time end = Clock::Real()->Now();
  const double decode_s = absl::ToDoubleSeconds(end - first_token);
  std::cerr << absl::StrFormat(
      "\n[%d prompt tokens, %d generated, finish: %s] load %.2f s, prefill %.3f s, "
      "%.1f tokens/s overall, %.1f tokens/s decode\n",
      num_prompt_tokens, num_generated, FinishReasonName(reason),
      absl::ToDoubleSeconds(start - load_start), absl::ToDoubleSeconds(first_token - start),
      num_generated / std::max(absl::ToDoubleSeconds(end - start), 1e-9),
      num_generated > 1 ? (num_generated - 1) / std::max(decode_s, 1e-9) : 0.0);
  return reason == FinishReason::kError ? 1 : 0;
}

}  // namespace

std::function<int()> AddGenerateCommand(CLI::App* sub) {
  auto opts = std::make_shared<GenerateOptions>();
  sub->add_option("--model", opts->model_dir, "Hugging Face model folder")->required();
  sub->add_option("--prompt", opts->prompt, "Prompt text")->required();
  sub->add_option("--max-tokens", opts->max_tokens, "New tokens to generate")
      ->capture_default_str();
  sub->add_option("--temperature", opts->temperature, "0: greedy")->capture_default_str();
  sub->add_option("--top-p", opts->top_p, "Nucleus sampling mass (1: off)")->capture_default_str();
  sub->add_option("--top-k", opts->top_k, "Top-k sampling (<= 0: off)")->capture_default_str();
  sub->add_option("--seed", opts->seed, "Sampling seed (< 0: derived from the request)");
  sub->add_flag("--chat", opts->chat, "Format the prompt with the model's chat template");
  sub->add_flag("--ignore-eos", opts->ignore_eos, "Keep generating past EOS");
  sub->add_option("--stop", opts->stop,
                  "Stop string (repeatable); neither it nor what follows is printed");
  AddEngineFlags(*sub, &opts->engine);
  return [opts]() { return Generate(*opts); };
}

}  // namespace tandem::cli
