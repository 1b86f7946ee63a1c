// HttpConnection: one persistent client connection for keep-alive and pipelining tests. The test
// writes raw bytes (any number of requests at once) and reads responses one by one, each parsed
// by its Content-Length or chunked encoding, each within a timeout, so a hang is a failure, not
// a stuck test.
#pragma once

#include <optional>
#include <string>

#include "absl/time/time.h"
#include "tests/router/http_test_client.h"

namespace tandem::router::testing {

// A keep-alive request: `method path` with `headers` (lines ending in "\r\n") and `body`.
std::string KeepAliveRequest(const std::string& method, const std::string& path,
                             const std::string& body = "", const std::string& headers = "");

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

}  // namespace tandem::router::testing
