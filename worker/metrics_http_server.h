// MetricsHttpServer: a worker's Prometheus pull endpoint, a minimal HTTP/1.1 server on
// Boost.Beast with one I/O thread.
//
// Why not prometheus-cpp's Exposer: it runs on CivetWeb, which starts its threads with a small
// fixed stack size, and glibc places the static TLS of every library loaded at startup at the top
// of each new thread's stack. libcublasLt alone has ~94 KB of it, so in a worker that links the
// CUDA backend CivetWeb cannot create its threads ("Cannot create first worker thread"). This
// server's one thread has the default stack.
//
// Contract:
// - `GET /metrics` (any query string): 200, the collectable rendered in the text exposition
//   format, Content-Type `text/plain; version=0.0.4; charset=utf-8`, Content-Length.
// - `HEAD /metrics`: the same status and headers (Content-Length of the body GET would send),
//   no body.
// - `GET /health` (liveness): 200 `ok` while the health probe (SetProbes) is OK or unset, else
//   503 with its message. `GET /ready` (readiness): 200 `ready` when the ready probe returns
//   true, else 503 (also before SetProbes). HEAD: the same without a body.
// - Another path: 404. Another method on /metrics: 405 with `Allow: GET, HEAD`. A request that
//   cannot be parsed: 400, then the connection is closed.
// - HTTP/1.1 keep-alive (HTTP/1.0 and `Connection: close` close after the response).
// - Every connection is served asynchronously, so a slow or idle client never delays another.
//   A connection that does not deliver a whole request within `read_timeout` (an idle
//   keep-alive connection, or a slow one), or does not take a response within it, is closed.
//   Beyond `max_connections` open connections, a new one is closed at once. accept(2) failing
//   for want of descriptors backs off and logs rarely (base/accept_backoff.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace prometheus {
class Collectable;
}  // namespace prometheus

namespace tandem {

class MetricsHttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";                    // an address or a host name to listen on
    int port = 0;                                      // 0: any free port (see port())
    absl::Duration read_timeout = absl::Seconds(120);  // longer than usual scrape intervals
    int max_connections = 64;
  };

  // Listens and starts the I/O thread. Errors: the port is taken: PortTakenError
  // (base/listen_error.h; the launcher then picks another port); `host` is not an IP address
  // or `port` is out of range: InvalidArgument; any other failure to listen: Unavailable.
  // `collectable` is collected on every GET and HEAD, on the I/O thread.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const Options& options, std::shared_ptr<const prometheus::Collectable> collectable);

  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;
  ~MetricsHttpServer();  // Stop()

  // The bound port (the chosen one when Options::port was 0).
  int port() const { return port_; }

  // What /health and /ready answer (see the contract above); called on the I/O thread, so they
  // must be thread-safe and outlive the server or be replaced (null clears) first. Thread-safe.
  void SetProbes(std::function<absl::Status()> health, std::function<bool()> ready);

  // Stops listening, drops every connection (a response being written is cut off) and joins the
  // I/O thread. Does not wait for any client. Idempotent; not thread-safe.
  void Stop();

  struct Impl;  // the io_context, the acceptor and the thread (metrics_http_server.cc)

 private:
  explicit MetricsHttpServer(std::unique_ptr<Impl> impl, int port);

  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace tandem
