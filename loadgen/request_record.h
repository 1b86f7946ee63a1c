// The unit of work and the unit of measurement of the load generator: what one request asks
// for (RequestSpec) and what happened to it (RequestRecord). Every timestamp is nanoseconds on
// the monotonic clock, relative to the benchmark's start (t = 0 when the first arrival is due).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::loadgen {

// One request of a workload.
struct RequestSpec {
  std::string prompt;        // completions prompt, or the user message for chat
  int prompt_len = -1;       // input tokens as the dataset counted them (-1: unknown)
  int output_len = 0;        // max_tokens asked for
  double arrival_s = 0.0;    // trace datasets: arrival offset from the start (seconds)
  bool has_arrival = false;  // true when the dataset fixes arrivals (trace replay)
};

// Server-reported phases of TTFT (milliseconds), all optional: see loadgen/README.md,
// "Server-side TTFT phases", for how a server reports them.
struct ServerTiming {
  std::optional<double> queue_ms;
  std::optional<double> prefill_ms;
  std::optional<double> kv_transfer_ms;
  std::optional<double> first_decode_ms;
  bool any() const { return queue_ms || prefill_ms || kv_transfer_ms || first_decode_ms; }
};

// Why a request failed. Failed requests are excluded from latency statistics (as in
// `vllm bench serve`) and counted per cause.
enum class FailureCause {
  kNone = 0,
  kConnect,      // TCP connect / name resolution failed
  kHttpStatus,   // non-200 response
  kGrpcStatus,   // a non-OK gRPC status
  kStreamError,  // an {"error": ...} event inside a 200 stream
  kNoToken,      // stream ended without a single token chunk
  kTransport,    // connection reset / truncated stream / malformed HTTP
  kTimeout,      // --request-timeout expired
  kCancelled,    // interrupted (Ctrl-C) before it finished
};
const char* FailureCauseName(FailureCause cause);

struct RequestRecord {
  int index = -1;
  bool success = false;
  FailureCause cause = FailureCause::kNone;
  std::string error;  // human-readable detail for failures

  int64_t scheduled_ns = 0;  // when the arrival process released it
  int64_t released_ns = 0;   // when it got a --max-concurrency slot (== scheduled_ns without cap)
  int64_t send_ns = 0;       // when the loadgen actually started writing it (diagnostic)
  int64_t end_ns = 0;        // when the response finished (or failed)
  // Arrival time of every token chunk (chunks with choices that carry a token; see README).
  std::vector<int64_t> chunk_ns;

  int prompt_len = -1;     // from usage.prompt_tokens, else the dataset's count
  int output_tokens = -1;  // from usage.completion_tokens, else the number of token chunks
  std::optional<ServerTiming> server_timing;
  std::string generated_text;  // kept only with --save-detailed

  // Latencies are measured from released_ns: the moment the request was due to be sent. A late
  // loadgen or a slow server therefore shows up in the latency (no coordinated omission).
  double TtftMs() const { return (chunk_ns.front() - released_ns) / 1e6; }
  double E2elMs() const { return (chunk_ns.back() - released_ns) / 1e6; }
  double ClientQueueMs() const { return (released_ns - scheduled_ns) / 1e6; }
};

}  // namespace tandem::loadgen
