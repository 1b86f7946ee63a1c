// HttpServer: an asynchronous HTTP/1.1 server on Boost.Beast/Asio. A few I/O threads serve every
// connection (no thread per connection, so thousands of idle SSE streams cost only memory).
// Keep-alive; bodies over max_body_bytes get 413; responses are whole (Content-Length) or
// streamed (chunked transfer encoding, each Write flushed at once, Nagle off). While a request
// is being answered the server keeps reading the socket, so a client that disconnects is noticed
// at once and the request's cancel callback runs.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem::router {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query string
  std::string query;
  HttpHeaders headers;  // names lower-cased
  std::string body;

  // The first header named `name` (lower case), or "".
  std::string Header(const std::string& name) const;
};

// Answers one request. Thread-safe: may be called from any thread, calls are applied in order.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  virtual void Send(int status, const std::string& content_type, std::string body,
                    HttpHeaders extra_headers = {}) = 0;
  virtual void StartStream(int status, const std::string& content_type,
                           HttpHeaders extra_headers = {}) = 0;
  virtual void Write(std::string data) = 0;  // one chunk, flushed
  virtual void EndStream() = 0;
  // `on_cancel` runs once, on an I/O thread, if the client goes away before the response is
  // complete (at once if it already has).
  virtual void SetCancelCallback(std::function<void()> on_cancel) = 0;
};

using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;

struct HttpServerOptions {
  std::string address = "0.0.0.0";
  int port = 8000;  // 0: pick a free port
  int num_threads = 2;
  size_t max_body_bytes = size_t{8} << 20;
  absl::Duration idle_timeout = absl::Seconds(120);  // keep-alive connections with no request
};

class HttpServer {
 public:
  // `handler` runs on an I/O thread and must not block.
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();

  absl::Status Start();
  int port() const { return port_; }
  // Stops accepting and serving; connections still referenced by responders are closed.
  void Stop();

  struct Impl;  // the io_context and acceptor (http_server.cc)

 private:
  HttpServerOptions options_;
  HttpHandler handler_;
  std::shared_ptr<Impl> impl_;
  std::vector<std::thread> threads_;
  int port_ = 0;
};

}  // namespace tandem::router
