// A raw TCP client for HTTP tests of the metrics server: the test writes bytes and reads exactly
// what the server sends (a response parsed by its Content-Length, or whatever arrives within a
// time), so it can see a body that should not be there and a connection that is closed.
#pragma once

#include <optional>
#include <string>

#include "absl/time/time.h"

namespace tandem::testing {

struct RawHttpResponse {
  int status = 0;
  std::string head;  // status line and headers, up to and without the blank line
  std::string body;  // Content-Length bytes (none when `body_expected` was false)
  // The value of header `name` (case-insensitive name), or nullopt.
  std::optional<std::string> Header(const std::string& name) const;
};

class RawHttpConnection {
 public:
  RawHttpConnection() = default;
  RawHttpConnection(const RawHttpConnection&) = delete;
  RawHttpConnection& operator=(const RawHttpConnection&) = delete;
  ~RawHttpConnection();

  // Connects to 127.0.0.1:port; false on failure.
  bool Connect(int port);
  bool Send(const std::string& bytes);
  // Reads one response: its head, then Content-Length body bytes unless `body_expected` is false
  // (a response to HEAD). nullopt if the connection fails or closes first or `timeout` passes.
  std::optional<RawHttpResponse> ReadResponse(bool body_expected = true,
                                              absl::Duration timeout = absl::Seconds(5));
  // The bytes that arrive within `wait` (after those already read past the last response).
  std::string ReadFor(absl::Duration wait);
  // True if the server closes the connection (EOF or reset) within `timeout`; bytes that arrive
  // meanwhile are kept in the buffer.
  bool ClosedWithin(absl::Duration timeout);
  void Close();

 private:
  // Reads what is available within `deadline`; false on EOF, error or timeout.
  bool Fill(absl::Time deadline);

  int fd_ = -1;
  std::string buffer_;  // received, not yet consumed
  bool eof_ = false;
};

// One request with `Connection: close` on a fresh connection; nullopt on failure.
std::optional<RawHttpResponse> HttpGetOnce(int port, const std::string& path);

}  // namespace tandem::testing
