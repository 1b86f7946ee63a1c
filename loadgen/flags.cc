#include "loadgen/flags.h"

#include <CLI/CLI.hpp>

namespace tandem::loadgen {
namespace {

void TargetFlags(CLI::App& app, Config* c) {
  app.add_option("--backend", c->backend, "openai | openai-chat | tandem-grpc")
      ->check(CLI::IsMember({"openai", "openai-chat", "vllm", "tandem-grpc"}));
  app.add_option("--base-url", c->base_url, "http://host:port (default http://{host}:{port})");
  app.add_option("--host", c->host);
  app.add_option("--port", c->port);
  app.add_option("--endpoint", c->endpoint,
                 "default /v1/completions (openai) or /v1/chat/completions (openai-chat)");
  app.add_option("--model", c->model, "default: the first model of GET /v1/models");
  app.add_option("--served-model-name", c->model);
  app.add_option("--tokenizer", c->tokenizer, "tokenizer folder (tokenizer.json)");
  app.add_option("--header", c->headers, "extra request header KEY=VALUE (repeatable)");
  app.add_option("--temperature", c->temperature);
  app.add_option("--extra-body", c->extra_body, "JSON object merged into every request body");
  // Two callbacks rather than add_flag on std::optional<bool>: CLI11 2.1 fills the optional with
  // false when neither flag is given, which silently turned the dataset default off.
  app.add_flag_callback(
      "--ignore-eos", [c] { c->ignore_eos = true; },
      "keep generating past EOS (default on for random and trace datasets)");
  app.add_flag_callback("--no-ignore-eos", [c] { c->ignore_eos = false; });
  app.add_option("--request-timeout", c->request_timeout_s, "seconds per request (default 6 h)");
}

void LoadFlags(CLI::App& app, Config* c) {
  app.add_option("--num-prompts", c->num_prompts);
  app.add_option("--request-rate", c->request_rate, "requests/s; inf sends everything at once");
  app.add_option("--burstiness", c->burstiness, "gamma shape: 1 Poisson, >1 regular, <1 bursty");
  app.add_option("--max-concurrency", c->max_concurrency, "cap on requests in flight");
  app.add_option("--seed", c->seed);
}

void DatasetFlags(CLI::App& app, Config* c) {
  app.add_option("--dataset-name", c->dataset_name)
      ->check(CLI::IsMember({"random", "sharegpt", "trace", "mooncake", "multi-turn"}));
  app.add_option("--dataset-path", c->dataset_path);
  app.add_option("--random-input-len,--input-len", c->random_input_len);
  app.add_option("--random-output-len,--output-len", c->random_output_len);
  app.add_option("--random-range-ratio", c->random_range_ratio);
  app.add_option("--random-prefix-len", c->random_prefix_len);
  app.add_option("--random-length-dist", c->random_length_dist)
      ->check(CLI::IsMember({"uniform", "normal"}));
  app.add_option("--prefix-sharing-ratio", c->prefix_sharing_ratio,
                 "fraction of each random prompt taken from a shared group prefix");
  app.add_option("--num-prefix-groups", c->num_prefix_groups);
  app.add_option("--sharegpt-output-len", c->sharegpt_output_len);
  app.add_option("--trace-block-size", c->trace_block_size, "tokens per trace hash id");
  app.add_option("--trace-time-scale", c->trace_time_scale, "multiply trace timestamps");
  app.add_option("--multi-turn-system-len", c->multi_turn_system_len,
                 "multi-turn: tokens of each shared system prompt (user turns: --random-input-len, "
                 "answers: --random-output-len)");
  app.add_option("--multi-turn-system-prompts", c->multi_turn_system_prompts,
                 "multi-turn: distinct system prompts the conversations share");
  app.add_option("--multi-turn-turns", c->multi_turn_turns, "multi-turn: turns per conversation");
}

void ReportFlags(CLI::App& app, Config* c) {
  app.add_option("--goodput", c->goodput, "SLOs in ms: ttft:MS tpot:MS e2el:MS");
  app.add_option("--percentile-metrics", c->percentile_metrics,
                 "ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue");
  app.add_option("--metric-percentiles", c->metric_percentiles, "e.g. 25,50,99.9");
  app.add_flag("--save-result", c->save_result);
  app.add_flag("--save-detailed", c->save_detailed, "add per-request arrays to the JSON");
  app.add_option("--result-dir", c->result_dir);
  app.add_option("--result-filename", c->result_filename);
  app.add_option("--label", c->label);
  app.add_option("--metadata", c->metadata, "KEY=VALUE saved in the result JSON");
  app.add_flag("--progress,!--disable-progress", c->progress, "live progress line on stderr");
  app.add_option("--sweep", c->sweep, "rate=1,2,4 or concurrency=1,2,4: one run per value");
  app.add_option("--sweep-prompts", c->sweep_prompts,
                 "fresh (default): each sweep point sends prompts no other point sent, so a "
                 "prefix cache cannot serve them; same: every point sends the same prompts")
      ->check(CLI::IsMember({"fresh", "same"}));
  app.add_option("--compare", c->compare, "result or sweep JSONs: one report, no benchmark")
      ->expected(1, -1);
  app.add_option("--report", c->report, "HTML report path");
}

}  // namespace

int ParseFlags(int argc, char** argv, Config* config) {
  CLI::App app{
      "tandem-loadgen: open-loop load generator for OpenAI-compatible and tandem servers "
      "(flags follow `vllm bench serve`)"};
  TargetFlags(app, config);
  LoadFlags(app, config);
  DatasetFlags(app, config);
  ReportFlags(app, config);
  try {  // CLI11 reports errors by throwing; converted here, at the call site
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

}  // namespace tandem::loadgen
