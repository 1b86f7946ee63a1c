#include "tests/router/http_test_client.h"

#include <poll.h>

#include <boost/asio.hpp>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::router::testing {
namespace {

namespace net = boost::asio;
using tcp = net::ip::tcp;

std::string Request(const std::string& method, const std::string& path, const std::string& body,
                    const std::string& extra_headers) {
  return absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: localhost\r\n",
                      "Content-Type: application/json\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n", extra_headers, "\r\n", body);
}

std::string Dechunk(const std::string& raw) {
  std::string out;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    size_t size = 0;
    if (!absl::SimpleHexAtoi(raw.substr(pos, eol - pos), &size) || size == 0) break;
    out += raw.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
  return out;
}

}  // namespace

HttpResult HttpCall(int port, const std::string& method, const std::string& path,
                    const std::string& body, const std::string& extra_headers) {
  HttpResult result;
  net::io_context io;
  tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return result;
  net::write(socket, net::buffer(Request(method, path, body, extra_headers)), ec);
  std::string raw;
  char buf[16384];
  for (;;) {
    const size_t n = socket.read_some(net::buffer(buf), ec);
    raw.append(buf, n);
    if (ec) break;
  }
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return result;
  std::string head = raw.substr(0, head_end);
  const size_t sp = head.find(' ');
  if (!absl::SimpleAtoi(head.substr(sp + 1, 3), &result.status)) return result;
  // Lower-case header names.
  std::vector<std::string> lines = absl::StrSplit(head, "\r\n");
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    absl::StrAppend(&result.headers, absl::AsciiStrToLower(lines[i].substr(0, colon)),
                    lines[i].substr(colon), "\r\n");
  }
  const std::string rest = raw.substr(head_end + 4);
  result.body = absl::StrContains(absl::AsciiStrToLower(head), "transfer-encoding: chunked")
                    ? Dechunk(rest)
                    : rest;
  return result;
}

std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&event, "data: ")) out.emplace_back(event);
  }
  return out;
}

StreamingCall::StreamingCall(int port, const std::string& path, const std::string& body)
    : io_(std::make_unique<net::io_context>()), socket_(std::make_unique<tcp::socket>(*io_)) {
  boost::system::error_code ec;
  socket_->connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
  if (!ec) net::write(*socket_, net::buffer(Request("POST", path, body, "")), ec);
}

StreamingCall::~StreamingCall() { Close(); }

bool StreamingCall::ReadUntil(const std::string& needle, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[4096];
  while (received_.find(needle) == std::string::npos) {
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
    if (left <= 0 || !socket_->is_open()) return false;
    pollfd pfd{socket_->native_handle(), POLLIN, 0};
    if (poll(&pfd, 1, left) <= 0) continue;
    boost::system::error_code ec;
    const size_t n = socket_->read_some(net::buffer(buf), ec);
    received_.append(buf, n);
    if (ec) return received_.find(needle) != std::string::npos;
  }
  return true;
}

std::vector<std::string> StreamingCall::Events() const {
  const size_t head_end = received_.find("\r\n\r\n");
  if (head_end == std::string::npos) return {};
  return SseData(Dechunk(received_.substr(head_end + 4)));
}

void StreamingCall::Close() {
  if (socket_ && socket_->is_open()) {
    boost::system::error_code ec;
    socket_->shutdown(tcp::socket::shutdown_both, ec);
    socket_->close(ec);
  }
}

}  // namespace tandem::router::testing
