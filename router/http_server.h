// HttpServer: an asynchronous HTTP/1.1 server on Boost.Beast/Asio. A few I/O threads serve every
// connection (no thread per connection, so thousands of idle SSE streams cost only memory).
// - Keep-alive and pipelining: requests of one connection are answered one after the other, in
//   order; bytes of the next request that arrive while one is answered are kept (up to 64 KiB,
//   then reading pauses) and parsed as soon as that response is written.
// - A connection is closed when it is idle (no request, or a request not yet whole) for
//   idle_timeout; never while a request is being answered (a stream may be quiet for long).
// - Bodies over max_body_bytes get 413 (before the body is read; "Expect: 100-continue" is
//   answered); a request that cannot be parsed gets 400; both close the connection.
// - HEAD: the status and headers the handler's answer has (Content-Length of its body), no body.
// - Responses are whole (Content-Length) or streamed (chunked transfer encoding, each Write
//   flushed at once, Nagle off). While a request is answered the server keeps reading the
//   socket, so a client that disconnects is noticed at once and the request's cancel callback
//   runs.
// - accept(2) failing for lack of descriptors backs off and logs rarely (base/accept_backoff.h).
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
  // Requests with a body of at least this many bytes are handed to one of handler_threads
  // threads (parsing a large JSON body takes milliseconds, which an I/O thread owes to every
  // other connection, /health included); smaller ones are handled on the I/O thread.
  size_t offload_body_bytes = size_t{64} << 10;
  int handler_threads = 2;
  // Idle keep-alive connections close after this (longer than clients keep idle connections:
  // httpx, under the openai client, drops them after 5 s, so the client closes first).
  absl::Duration idle_timeout = absl::Seconds(60);
};

class HttpServer {
 public:
  // `handler` runs on an I/O thread (or a handler thread, for large bodies) and must not block;
  // it is called from several threads at once.
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
