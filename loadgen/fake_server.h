// A scripted OpenAI-compatible streaming server (HTTP/1.1, SSE, keep-alive) on Boost.Asio. It
// serves /v1/completions and /v1/chat/completions with per-token delays taken from a script, so
// the loadgen's measurements can be checked against values computed by hand, and it is the
// trivial server behind the loadgen's own throughput ceiling (tandem-loadgen-fake-server).
//
// Timing contract (all times on the monotonic clock, absolute deadlines, so delays never drift):
//   t_recv  = the moment the request was fully read;
//   t_start = t_recv, or with `slots` > 0 the moment a slot is free: slots are handed out FIFO in
//             arrival order, and a slot is free again at the *scripted* end of its previous
//             request (t_start + ttft + sum of gaps), so an overloaded server queues exactly;
//   token k (k = 0 .. n-1) is due at t_start + ttft_ms + itl_ms[0] + ... + itl_ms[k-1];
//   tokens are grouped `tokens_per_chunk` to an SSE event, sent when its last token is due.
// The final token chunk carries finish_reason "length"; then, if the request asked for
// stream_options.include_usage, a usage chunk (with `server_timing` when scripted); then [DONE].
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "loadgen/request_record.h"

namespace tandem::loadgen {

struct FakeRequest {
  int seq = 0;  // 0-based, in the order the server finished reading requests
  bool chat = false;
  int max_tokens = 16;
  bool include_usage = false;
  bool ignore_eos = false;
  std::string prompt;  // prompt, or the last message's content
};

struct FakeResponse {
  int http_status = 200;       // non-200: an OpenAI error envelope, no stream
  double ttft_ms = 0;          // from t_start to the first token
  std::vector<double> itl_ms;  // gap before token k+1; the last entry repeats; empty = 0
  int num_tokens = -1;         // -1: the request's max_tokens
  int tokens_per_chunk = 1;
  int error_after_tokens = -1;  // >= 0: an in-stream error event after that many tokens
  int drop_after_tokens = -1;   // >= 0: close the connection after that many tokens
  int prompt_tokens = -1;       // usage.prompt_tokens; -1: words in the prompt
  std::optional<ServerTiming> server_timing;  // reported in the usage chunk
};

using FakeScript = std::function<FakeResponse(const FakeRequest&)>;

struct FakeServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;       // 0: pick a free port
  int slots = 0;      // 0: unlimited concurrency; k: k requests served at a time, FIFO
  int threads = 1;    // io threads
  FakeScript script;  // unset: 0 ms delays
};

class FakeServer {
 public:
  explicit FakeServer(FakeServerOptions options);
  ~FakeServer();  // stops the server
  FakeServer(const FakeServer&) = delete;
  FakeServer& operator=(const FakeServer&) = delete;

  // Binds and starts serving on background threads; returns the bound port.
  absl::StatusOr<int> Start();
  void Stop();
  int requests_served() const { return served_.load(); }

  struct Impl;

 private:
  FakeServerOptions options_;
  std::unique_ptr<Impl> impl_;
  std::vector<std::thread> threads_;
  std::atomic<int> served_{0};
};

// The token text the fake server streams for token k of any request.
std::string FakeTokenText(int k);

}  // namespace tandem::loadgen
