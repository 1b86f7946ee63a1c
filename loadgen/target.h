// Target: where requests go. One implementation per protocol (OpenAI HTTP/SSE; tandem gRPC).
// A target runs on the benchmark's single io_context thread and records, for each request,
// the monotonic arrival time of every token chunk, the usage and any server-side timing.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded

#include "loadgen/request_record.h"

namespace tandem::loadgen {

class Target {
 public:
  virtual ~Target() = default;
  // Sends `spec` and fills `record`: send_ns, chunk_ns, prompt_len, output_tokens,
  // server_timing, success / cause / error. Never throws; never leaves the request hanging
  // past its timeout.
  virtual boost::asio::awaitable<void> Send(const RequestSpec& spec, RequestRecord* record) = 0;
  // Ctrl-C: ends every in-flight request promptly with FailureCause::kCancelled.
  virtual void CancelAll() = 0;
};

}  // namespace tandem::loadgen
