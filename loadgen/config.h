// Everything a tandem-loadgen invocation asks for; filled from the command line (flags.cc),
// consumed by the driver (driver.cc). Flag names follow `vllm bench serve`; extras are marked.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace tandem::loadgen {

struct Config {
  // Target.
  std::string backend = "openai";  // openai (/v1/completions) | openai-chat | tandem-grpc
  std::string base_url;  // default http://{host}:{port}; grpc: {host}:{port} (grpc:// optional)
  std::string host = "127.0.0.1";
  std::optional<int> port;  // default 8000 (HTTP) or 8001 (tandem-grpc)
  std::string endpoint;     // default by backend
  std::string model;        // default: the first of GET /v1/models
  std::string tokenizer;    // tokenizer folder (extra: used when engine's tokenizer is built)
  std::vector<std::string> headers;  // --header KEY=VALUE
  std::optional<double> temperature;
  std::string extra_body;
  std::optional<bool> ignore_eos;       // default: on for random and trace datasets
  double request_timeout_s = 6 * 3600;  // extra

  // Load shape.
  int num_prompts = 1000;
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int max_concurrency = 0;
  uint64_t seed = 0;

  // Dataset.
  std::string dataset_name = "random";  // random | sharegpt | trace (alias mooncake) | multi-turn
  std::string dataset_path;
  int random_input_len = 1024;
  int random_output_len = 128;
  double random_range_ratio = 0.0;
  int random_prefix_len = 0;
  std::string random_length_dist = "uniform";  // extra: uniform | normal
  double prefix_sharing_ratio = 0.0;           // extra
  int num_prefix_groups = 1;                   // extra
  int sharegpt_output_len = -1;
  int trace_block_size = 512;         // extra
  double trace_time_scale = 1.0;      // extra
  int multi_turn_system_len = 256;    // extra (multi-turn)
  int multi_turn_system_prompts = 1;  // extra
  int multi_turn_turns = 4;           // extra

  // Reporting.
  std::vector<std::string> goodput;  // ttft:MS tpot:MS e2el:MS
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  bool save_result = false;
  bool save_detailed = false;
  std::string result_dir = ".";
  std::string result_filename;
  std::string label;
  std::vector<std::string> metadata;  // KEY=VALUE
  std::optional<bool> progress;       // extra: default on when stderr is a terminal

  // Sweeps and reports (extras).
  std::string sweep;                    // rate=1,2,4 | concurrency=1,2,4
  std::string sweep_prompts = "fresh";  // fresh | same: see sweep_prompts.h
  std::vector<std::string> compare;     // result or sweep JSONs to put in one report
  std::string report;                   // HTML report path
};

}  // namespace tandem::loadgen
