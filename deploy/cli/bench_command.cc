// tandem bench --model DIR [engine flags] [--scenarios latency,decode,prefill,throughput] ...
// Offline benchmarks of the engine in one process (no RPC), in the spirit of vLLM's
// `bench latency` / `bench throughput`:
//   latency     batch-1 decode: ms per token and tokens/s, beside the floor of reading the
//               weights (and KV) once per token at --bandwidth-gbs
//   decode      decode tokens/s at each --batch-sizes x --contexts (prompts of that length,
//               timed once every sequence has its first token)
//   prefill     one prompt of each --prefill-lens: TTFT, tokens/s, TFLOP/s (GEMMs + attention)
//   throughput  --num-prompts requests of --input-len tokens generating --output-len each, all
//               submitted at once: output tokens/s over the whole run; with
//               --random-range-ratio R (vLLM's random dataset) each request's input and output
//               lengths are drawn uniformly from [len (1 - R), len (1 + R)] instead (ragged
//               contexts, as served batches have)
// Prompts are random token ids (with --prompt-period N, a random N-token phrase repeated, which
// n-gram speculation can look up); EOS is ignored so every request runs its full length. With
// speculative decoding on (--speculative-method), every scenario also reports the proposals,
// acceptance rate and mean accepted length of its own steps. Results print as a table and, with
// --json FILE, as JSON.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "base/status_macros.h"
#include "deploy/cli/bench_model_math.h"
#include "deploy/cli/commands.h"
#include "engine/engine.h"
#include "engine/kv_budget.h"
#include "engine/model/quant_config.h"
#include "nlohmann/json.hpp"
#include "worker/engine_flags.h"

namespace tandem::cli {
namespace {

using json = nlohmann::ordered_json;

struct BenchOptions {
  std::string model_dir;
  EngineFlags engine;
  std::string scenarios = "latency,decode,prefill,throughput";
  int latency_prompt = 128;
  int latency_tokens = 256;
  std::string batch_sizes = "8,16,32,64,128,256";
  std::string contexts = "1024,4096";
  int decode_tokens = 64;
  std::string prefill_lens = "1024,8192";
  int num_prompts = 256;
  int input_len = 128;
  int output_len = 1024;
  double random_range_ratio = 0;  // throughput: lengths uniform in [len (1 - R), len (1 + R)]
  double bandwidth_gbs = 4800;    // H200 HBM3e, the vendor's figure
  uint64_t seed = 0;
  int prompt_period = 0;  // 0: random prompts; N: a random N-token phrase repeated
  std::string json_path;
};

std::vector<int> ParseInts(const std::string& list) {
  std::vector<int> out;
  for (absl::string_view s : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    out.push_back(std::atoi(std::string(s).c_str()));
  }
  return out;
}

class Bench {
 public:
  // `linear_bytes`: bytes per projection weight (ModelMath), for the floors.
  Bench(const BenchOptions& o, std::unique_ptr<Engine> engine, double linear_bytes)
      : o_(o), engine_(std::move(engine)), rng_(o.seed), linear_bytes_(linear_bytes) {}

  // Submits `n` requests of `prompt` random tokens generating `tokens` each.
  absl::Status Submit(int n, int prompt, int tokens) {
    return SubmitEach(std::vector<int>(n, prompt), std::vector<int>(n, tokens));
  }
  // Submits request i with prompts[i] random tokens generating outputs[i].
  absl::Status SubmitEach(const std::vector<int>& prompts, const std::vector<int>& outputs) {
    std::uniform_int_distribution<int32_t> id(0, engine_->model_config().vocab_size - 1);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int prompt = prompts[i], tokens = outputs[i];
      EngineRequest r;
      r.id = absl::StrCat("bench-", next_id_++);
      r.prompt_tokens.resize(prompt);
      for (int32_t& t : r.prompt_tokens) t = id(rng_);
      if (o_.prompt_period > 0) {
        for (int j = o_.prompt_period; j < prompt; ++j) {
          r.prompt_tokens[j] = r.prompt_tokens[j % o_.prompt_period];
        }
      }
      r.sampling.max_tokens = tokens;
      r.sampling.temperature = 0.0f;
      r.sampling.ignore_eos = true;
      if (absl::Status s = engine_->AddRequest(std::move(r)); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // Steps until no request is left; per step: wall seconds, tokens sampled, and how many
  // requests had their first token by the end of it.
  struct StepLog {
    std::vector<double> seconds;
    std::vector<int> tokens;
    std::vector<int> started;
  };
  absl::StatusOr<StepLog> RunToEnd() { return Run(/*until_started=*/-1); }
  // Steps until `n` requests have their first token.
  absl::StatusOr<StepLog> RunUntilStarted(int n) { return Run(n); }
  absl::StatusOr<StepLog> Run(int until_started) {
    StepLog log;
    absl::flat_hash_set<std::string> started;
    while (engine_->HasWork() &&
           (until_started < 0 || static_cast<int>(started.size()) < until_started)) {
      const absl::Time t0 = Clock::Real()->Now();
      absl::StatusOr<std::vector<RequestOutput>> outs = engine_->Step();
      if (!outs.ok()) return outs.status();
      int tokens = 0;
      for (const RequestOutput& out : *outs) {
        if (out.finish_reason == FinishReason::kError) {
          return absl::InternalError(absl::StrCat("request ", out.id, ": ", out.error));
        }
        tokens += static_cast<int>(out.new_tokens.size());
        if (!out.new_tokens.empty()) started.insert(out.id);
      }
      log.seconds.push_back(absl::ToDoubleSeconds(Clock::Real()->Now() - t0));
      log.tokens.push_back(tokens);
      log.started.push_back(static_cast<int>(started.size()));
    }
    return log;
  }

  bool Fits(int seqs, int tokens_each) const {
    const EngineStats s = engine_->Stats();
    const int page = o_.engine.engine.page_size;
    return int64_t{seqs} * ((tokens_each + page - 1) / page) <= s.num_pages_total &&
           tokens_each <= engine_->max_model_len();
  }

  absl::StatusOr<json> Latency() {
    const int prompt = o_.latency_prompt, tokens = o_.latency_tokens;
    if (!Fits(1, prompt + tokens)) return json{{"skipped", "does not fit"}};
    if (absl::Status s = Submit(1, prompt, tokens); !s.ok()) return s;
    const EngineStats before = engine_->Stats();
    ASSIGN_OR_RETURN(StepLog log, RunToEnd());
    const EngineStats after = engine_->Stats();
    // Decode steps: every step after the first (which runs the prompt).
    std::vector<double> decode(log.seconds.begin() + 1, log.seconds.end());
    double decode_seconds = 0;
    int64_t decode_tokens = 0;
    for (size_t i = 1; i < log.seconds.size(); ++i) {
      decode_seconds += log.seconds[i];
      decode_tokens += log.tokens[i];
    }
    std::sort(decode.begin(), decode.end());
    // A speculative step emits several tokens: time per token is then the decode window's
    // seconds over its tokens; otherwise the median step.
    const double median = Speculating() ? (decode_tokens > 0 ? decode_seconds / decode_tokens : 0)
                          : decode.empty() ? 0
                                           : decode[decode.size() / 2];
    const ModelMath m(engine_->model_config(), linear_bytes_);
    const int mid_context = prompt + tokens / 2;
    const double floor_s = m.DecodeBytes(1, mid_context) / (o_.bandwidth_gbs * 1e9);
    json j = {{"prompt_tokens", prompt},
              {"output_tokens", tokens},
              {"ms_per_token_median", median * 1e3},
              {"tokens_per_s", median > 0 ? 1.0 / median : 0.0},
              {"floor_ms_per_token", floor_s * 1e3},
              {"floor_tokens_per_s", 1.0 / floor_s},
              {"host_share", HostShare(before, after)}};
    Row(absl::StrFormat(
        "latency  B=1  prompt %d: %.3f ms/token = %.1f tokens/s (floor %.1f "
        "tokens/s at %.0f GB/s: %.0f%%), host share %.1f%%",
        prompt, median * 1e3, j["tokens_per_s"].get<double>(), 1.0 / floor_s, o_.bandwidth_gbs,
        100.0 * (1.0 / std::max(median, 1e-12)) * floor_s, 100 * j["host_share"].get<double>()));
    AddSpec(before, after, &j);
    return j;
  }

  absl::StatusOr<json> Decode() {
    json rows = json::array();
    for (int context : ParseInts(o_.contexts)) {
      for (int batch : ParseInts(o_.batch_sizes)) {
        json row = {{"batch", batch}, {"context", context}};
        if (batch > o_.engine.engine.max_num_seqs || !Fits(batch, context + o_.decode_tokens)) {
          row["skipped"] = "does not fit the KV pool, max_num_seqs or max_model_len";
          Row(absl::StrFormat("decode   B=%d ctx %d: skipped (does not fit)", batch, context));
          rows.push_back(row);
          continue;
        }
        if (absl::Status s = Submit(batch, context, o_.decode_tokens); !s.ok()) return s;
        // Prefill every sequence (and its first token) untimed; then the timed decode window.
        ASSIGN_OR_RETURN(const StepLog prefill, RunUntilStarted(batch));
        (void)prefill;
        const EngineStats before = engine_->Stats();
        ASSIGN_OR_RETURN(StepLog log, RunToEnd());
        const EngineStats after = engine_->Stats();
        double seconds = 0;
        int64_t tokens = 0;
        for (size_t i = 0; i < log.seconds.size(); ++i) {
          seconds += log.seconds[i];
          tokens += log.tokens[i];
        }
        const double tps = seconds > 0 ? tokens / seconds : 0;
        const ModelMath m(engine_->model_config(), linear_bytes_);
        const double floor_s =
            m.DecodeBytes(batch, context + o_.decode_tokens / 2) / (o_.bandwidth_gbs * 1e9);
        row["tokens_per_s"] = tps;
        row["ms_per_step"] = tokens > 0 ? seconds / tokens * batch * 1e3 : 0;
        row["floor_tokens_per_s"] = batch / floor_s;
        row["host_share"] = HostShare(before, after);
        if (Speculating()) {  // a step emits more than one token per sequence
          row["ms_per_step"] = log.seconds.empty() ? 0 : seconds / log.seconds.size() * 1e3;
        }
        Row(
            absl::StrFormat("decode   B=%d ctx %d: %.0f tokens/s, %.2f ms/step (floor %.0f "
                            "tokens/s), host share %.1f%%",
                            batch, context, tps, row["ms_per_step"].get<double>(), batch / floor_s,
                            100 * row["host_share"].get<double>()));
        AddSpec(before, after, &row);
        rows.push_back(row);
      }
    }
    return rows;
  }

  absl::StatusOr<json> Prefill() {
    json rows = json::array();
    const ModelMath m(engine_->model_config(), linear_bytes_);
    for (int len : ParseInts(o_.prefill_lens)) {
      // A prompt of the model's whole context leaves no room for its one token: one less.
      len = std::min(len, engine_->max_model_len() - 1);
      json row = {{"prompt_tokens", len}};
      if (!Fits(1, len + 1)) {
        row["skipped"] = "does not fit";
        Row(absl::StrFormat("prefill  %d tokens: skipped (does not fit)", len));
        rows.push_back(row);
        continue;
      }
      // Warm-up: the first prompt of a length pays one-time costs (cuBLASLt plans).
      if (absl::Status s = Submit(1, len, 1); !s.ok()) return s;
      if (absl::StatusOr<StepLog> warm = RunToEnd(); !warm.ok()) return warm.status();
      std::vector<double> ttft;
      for (int rep = 0; rep < 3; ++rep) {
        if (absl::Status s = Submit(1, len, 1); !s.ok()) return s;
        const absl::Time t0 = Clock::Real()->Now();
        if (absl::StatusOr<StepLog> log = RunToEnd(); !log.ok()) return log.status();
        ttft.push_back(absl::ToDoubleSeconds(Clock::Real()->Now() - t0));
      }
      std::sort(ttft.begin(), ttft.end());
      const double t = ttft[ttft.size() / 2];
      row["ttft_ms"] = t * 1e3;
      row["tokens_per_s"] = len / t;
      row["tflops"] = m.PrefillFlops(len) / t / 1e12;
      Row(absl::StrFormat("prefill  %d tokens: TTFT %.1f ms, %.0f tokens/s, %.0f TFLOP/s", len,
                          t * 1e3, len / t, row["tflops"].get<double>()));
      rows.push_back(row);
    }
    return rows;
  }

  absl::StatusOr<json> Throughput() {
    const int n = o_.num_prompts, in = o_.input_len, out = o_.output_len;
    const std::vector<int> ins = RandomLengths(n, in), outs = RandomLengths(n, out);
    int64_t input_tokens = 0;
    int longest = 0;
    for (int i = 0; i < n; ++i) {
      input_tokens += ins[i];
      longest = std::max(longest, ins[i] + outs[i]);
    }
    json j = {{"num_prompts", n},
              {"input_len", in},
              {"output_len", out},
              {"random_range_ratio", o_.random_range_ratio}};
    if (!Fits(std::min(n, o_.engine.engine.max_num_seqs), longest)) {
      j["note"] = "not every sequence fits at once: the scheduler preempts";
    }
    if (absl::Status s = SubmitEach(ins, outs); !s.ok()) return s;
    const EngineStats before = engine_->Stats();
    const absl::Time t0 = Clock::Real()->Now();
    ASSIGN_OR_RETURN(StepLog log, RunToEnd());
    const double seconds = absl::ToDoubleSeconds(Clock::Real()->Now() - t0);
    const EngineStats after = engine_->Stats();
    int64_t tokens = 0;
    for (int t : log.tokens) tokens += t;
    j["seconds"] = seconds;
    j["input_tokens"] = input_tokens;
    j["output_tokens"] = tokens;
    j["output_tokens_per_s"] = tokens / seconds;
    j["total_tokens_per_s"] = (tokens + input_tokens) / seconds;
    j["preemptions"] = after.num_preemptions_total - before.num_preemptions_total;
    j["host_share"] = HostShare(before, after);
    const std::string ragged =
        o_.random_range_ratio > 0
            ? absl::StrFormat(", lengths +-%.0f%%", 100 * o_.random_range_ratio)
            : "";
    Row(
        absl::StrFormat("throughput %d x (%d in, %d out%s): %.0f output tokens/s in %.1f s, "
                        "host share %.1f%%",
                        n, in, out, ragged, j["output_tokens_per_s"].get<double>(), seconds,
                        100 * j["host_share"].get<double>()));
    AddSpec(before, after, &j);
    return j;
  }

 private:
  bool Speculating() const { return o_.engine.engine.speculative.enabled(); }

  // n lengths of about `len`: all `len`, or with --random-range-ratio R uniform in
  // [floor(len (1 - R)), ceil(len (1 + R))], at least 1 (vLLM's random dataset).
  std::vector<int> RandomLengths(int n, int len) {
    const double r = o_.random_range_ratio;
    if (r <= 0) return std::vector<int>(n, len);
    std::uniform_int_distribution<int> pick(
        std::max(1, static_cast<int>(std::floor(len * (1 - r)))),
        std::max(1, static_cast<int>(std::ceil(len * (1 + r)))));
    std::vector<int> lens(n);
    for (int& l : lens) l = pick(rng_);
    return lens;
  }

  // Speculative decoding over [before, after]: vLLM's counters and the two ratios, in `j` and as
  // a row.
  void AddSpec(const EngineStats& a, const EngineStats& b, json* j) const {
    if (!Speculating()) return;
    const int64_t drafts = b.spec_decode_num_drafts - a.spec_decode_num_drafts;
    const int64_t proposed = b.spec_decode_num_draft_tokens - a.spec_decode_num_draft_tokens;
    const int64_t accepted = b.spec_decode_num_accepted_tokens - a.spec_decode_num_accepted_tokens;
    const int64_t emitted = b.spec_decode_num_emitted_tokens - a.spec_decode_num_emitted_tokens;
    const double rate = proposed > 0 ? static_cast<double>(accepted) / proposed : 0.0;
    const double length = drafts > 0 ? static_cast<double>(emitted) / drafts : 0.0;
    (*j)["spec_decode"] = {{"num_drafts", drafts},
                           {"num_draft_tokens", proposed},
                           {"num_accepted_tokens", accepted},
                           {"num_emitted_tokens", emitted},
                           {"acceptance_rate", rate},
                           {"mean_accepted_length", length}};
    Row(
        absl::StrFormat("         speculative: %d proposals in %d verify steps, acceptance rate "
                        "%.3f, mean accepted length %.2f",
                        proposed, drafts, rate, length));
  }

  static double HostShare(const EngineStats& a, const EngineStats& b) {
    const double step = static_cast<double>(b.step_time_ns_total - a.step_time_ns_total);
    const double wait = static_cast<double>(b.device_wait_ns_total - a.device_wait_ns_total);
    return step > 0 ? 1.0 - wait / step : 0.0;
  }
  static void Row(const std::string& line) { std::cout << line << std::endl; }

  const BenchOptions& o_;
  std::unique_ptr<Engine> engine_;
  std::mt19937_64 rng_;
  double linear_bytes_;
  int64_t next_id_ = 0;
};

// What a projection weight of the model in `o` costs to read: 2 (bf16) unless its checkpoint or
// --quantization makes it quantized.
absl::StatusOr<std::pair<double, std::string>> LinearBytes(const BenchOptions& o,
                                                           const ModelConfig& config) {
  ASSIGN_OR_RETURN(const QuantConfig q,
                   QuantConfig::Resolve(o.model_dir, o.engine.engine.quantization));
  using F = QuantConfig::Format;
  switch (q.format) {
    case F::kNone:
      return std::pair<double, std::string>(2.0, "bf16");
    case F::kAwq:
    case F::kGptq:
    case F::kLoadTimeInt4:
      return std::pair(QuantBytesPerWeight(true, q.group_size, config.hidden_size), q.Describe());
    case F::kFp8Block:
      return std::pair(QuantBytesPerWeight(false, q.block_k, config.hidden_size), q.Describe());
    default:
      return std::pair(QuantBytesPerWeight(false, 0, config.hidden_size), q.Describe());
  }
}

int RunBench(BenchOptions& o) {
  o.engine.engine.model_dir = o.model_dir;
  if (absl::Status s = ResolveEngineFlags(&o.engine); !s.ok()) {
    std::cerr << "bench: " << s << "\n";
    return 2;
  }
  const absl::Time start = Clock::Real()->Now();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o.engine.engine);
  if (!engine.ok()) {
    std::cerr << "bench: " << engine.status() << "\n";
    return 1;
  }
  const double startup_s = absl::ToDoubleSeconds(Clock::Real()->Now() - start);
  const ModelConfig config = (*engine)->model_config();
  const KvLayout kv = (*engine)->kv_layout();
  absl::StatusOr<std::pair<double, std::string>> linear = LinearBytes(o, config);
  if (!linear.ok()) {
    std::cerr << "bench: " << linear.status() << "\n";
    return 1;
  }
  Bench bench(o, *std::move(engine), linear->first);
  json result = {{"model", o.model_dir},
                 {"backend", BackendName(o.engine.engine.backend)},
                 {"startup_s", startup_s},
                 {"enforce_eager", o.engine.engine.enforce_eager},
                 {"kv_cache_dtype", std::string(KvCacheDtypeName(kv.dtype))},
                 {"kv_pages", kv.num_pages},
                 {"enable_prefix_caching", o.engine.engine.enable_prefix_caching},
                 {"async_scheduling", o.engine.engine.async_scheduling},
                 {"speculative_method", SpecMethodName(o.engine.engine.speculative.method)},
                 {"num_speculative_tokens", o.engine.engine.speculative.num_speculative_tokens},
                 {"bandwidth_gbs", o.bandwidth_gbs},
                 {"weights", linear->second},
                 {"linear_bytes_per_weight", linear->first}};
  std::cout << absl::StrFormat(
      "bench: %s on %s, start-up %.1f s, weights %s (%.3f bytes per projection weight in the "
      "floors), KV cache %s: %d pages of %d tokens\n",
      config.model_type, BackendName(o.engine.engine.backend), startup_s, linear->second,
      linear->first, KvCacheDtypeName(kv.dtype), kv.num_pages, kv.page_size);
  for (absl::string_view s : absl::StrSplit(o.scenarios, ',', absl::SkipEmpty())) {
    absl::StatusOr<json> r = absl::InvalidArgumentError(absl::StrCat("unknown scenario ", s));
    if (s == "latency") r = bench.Latency();
    if (s == "decode") r = bench.Decode();
    if (s == "prefill") r = bench.Prefill();
    if (s == "throughput") r = bench.Throughput();
    if (!r.ok()) {
      std::cerr << "bench: " << s << ": " << r.status() << "\n";
      return 1;
    }
    result[std::string(s)] = *r;
  }
  if (!o.json_path.empty()) {
    std::ofstream(o.json_path) << result.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

std::function<int()> AddBenchCommand(CLI::App* sub) {
  auto o = std::make_shared<BenchOptions>();
  // Bench defaults: an 8k prompt is one prefill step.
  o->engine.engine.max_num_batched_tokens = 8192;
  sub->add_option("--model", o->model_dir, "Hugging Face model folder")->required();
  AddEngineFlags(*sub, &o->engine);
  sub->add_option("--scenarios", o->scenarios, "latency,decode,prefill,throughput")
      ->capture_default_str();
  sub->add_option("--latency-prompt", o->latency_prompt, "Prompt tokens (latency)")
      ->capture_default_str();
  sub->add_option("--latency-tokens", o->latency_tokens, "Generated tokens (latency)")
      ->capture_default_str();
  sub->add_option("--batch-sizes", o->batch_sizes, "Concurrent sequences (decode)")
      ->capture_default_str();
  sub->add_option("--contexts", o->contexts, "Prompt lengths (decode)")->capture_default_str();
  sub->add_option("--decode-tokens", o->decode_tokens, "Tokens generated per sequence (decode)")
      ->capture_default_str();
  sub->add_option("--prefill-lens", o->prefill_lens, "Prompt lengths (prefill)")
      ->capture_default_str();
  sub->add_option("--num-prompts", o->num_prompts, "Requests (throughput)")->capture_default_str();
  sub->add_option("--input-len", o->input_len, "Prompt tokens (throughput)")->capture_default_str();
  sub->add_option("--output-len", o->output_len, "Output tokens (throughput)")
      ->capture_default_str();
  sub->add_option("--random-range-ratio", o->random_range_ratio,
                  "Throughput lengths uniform in [len (1 - R), len (1 + R)] (0: all len)")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str();
  sub->add_option("--bandwidth-gbs", o->bandwidth_gbs, "Memory bandwidth for the floors")
      ->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed of the random prompts")->capture_default_str();
  sub->add_option("--prompt-period", o->prompt_period,
                  "Prompts repeat a random phrase of this many tokens (0: random prompts)")
      ->capture_default_str();
  sub->add_option("--json", o->json_path, "Write the results as JSON to this file");
  return [o]() { return RunBench(*o); };
}

}  // namespace tandem::cli
