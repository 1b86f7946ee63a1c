// The tests' one raw HTTP/1.1 client (router and worker HTTP servers alike): a persistent
// connection the test writes raw bytes to (any number of requests at once: pipelining) and reads
// responses from one by one, each parsed by its Content-Length or chunked encoding within a
// timeout, so a hang is a failure, not a stuck test; and it sees what a response should not have
// (a body after HEAD, bytes after the last response, a connection left open).
#pragma once

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "nlohmann/json.hpp"

namespace tandem::testing {

struct HttpResult {
  int status = 0;
  std::string headers;  // the header lines, names lower-cased, each ending in "\r\n"
  std::string body;     // de-chunked
  // The value of header `name` (any case), "" when absent.
  std::string Header(const std::string& name) const;
  nlohmann::json Json() const { return nlohmann::json::parse(body, nullptr, false); }
};

// A keep-alive request: `method path` with `headers` (lines ending in "\r\n") and `body` (a JSON
// Content-Type and its Content-Length when there is a body or the method is POST).
std::string KeepAliveRequest(const std::string& method, const std::string& path,
                             const std::string& body = "", const std::string& headers = "");

// Thread-compatible.
class HttpConnection {
 public:
  HttpConnection() = default;
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;
  ~HttpConnection() { Close(); }

  bool Connect(int port);  // 127.0.0.1:port
  bool Send(const std::string& bytes);
  // The next response (body de-chunked; none when `head` says it answers a HEAD). nullopt when
  // the connection closes or fails first, or `timeout` passes.
  std::optional<HttpResult> Read(bool head = false, absl::Duration timeout = absl::Seconds(5));
  // Whatever arrives within `wait` after what Read consumed (with what was pending).
  std::string ReadFor(absl::Duration wait);
  // True if the server closes the connection within `timeout` (bytes before that are kept).
  bool ClosedWithin(absl::Duration timeout);
  // Bytes received and not consumed by Read.
  const std::string& pending() const { return buffer_; }
  void Close();

 private:
  // Appends what arrives before `deadline`; false on EOF, error or timeout.
  bool Fill(absl::Time deadline);

  int fd_ = -1;
  std::string buffer_;
};

// One GET with `Connection: close` on a fresh connection; nullopt on failure.
std::optional<HttpResult> HttpGetOnce(int port, const std::string& path);

}  // namespace tandem::testing
