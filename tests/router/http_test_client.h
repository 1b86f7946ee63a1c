// A minimal blocking HTTP/1.1 client for router tests (one connection per call, chunked bodies
// decoded), plus helpers for Server-Sent Events. Keep-alive and pipelining: tests/http.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/http/http_connection.h"

namespace tandem::router::testing {

// The raw keep-alive client (tests/http) under the names the router's tests use.
using ::tandem::testing::HttpConnection;
using ::tandem::testing::HttpResult;
using ::tandem::testing::KeepAliveRequest;

// Sends one request (Connection: close) and reads the whole response. status 0 on I/O failure.
HttpResult HttpCall(int port, const std::string& method, const std::string& path,
                    const std::string& body = "", const std::string& extra_headers = "");
inline HttpResult Post(int port, const std::string& path, const std::string& body,
                       const std::string& extra_headers = "") {
  return HttpCall(port, "POST", path, body, extra_headers);
}

// The "data: " payloads of an SSE body, in order (including "[DONE]").
std::vector<std::string> SseData(const std::string& body);

// A streaming request whose connection the test controls (to disconnect mid-stream).
class StreamingCall {
 public:
  StreamingCall(int port, const std::string& path, const std::string& body);
  ~StreamingCall();
  // Reads until the raw response contains `needle` or `timeout_ms` passes; true if found.
  bool ReadUntil(const std::string& needle, int timeout_ms);
  const std::string& received() const { return received_; }
  // The SSE "data: " payloads received so far (the chunked body decoded).
  std::vector<std::string> Events() const;
  void Close();

 private:
  std::unique_ptr<boost::asio::io_context> io_;
  std::unique_ptr<boost::asio::ip::tcp::socket> socket_;
  std::string received_;
};

}  // namespace tandem::router::testing
