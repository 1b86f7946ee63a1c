#include "tests/worker/raw_http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace tandem::testing {

std::optional<std::string> RawHttpResponse::Header(const std::string& name) const {
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) continue;
    if (absl::EqualsIgnoreCase(lines[i].substr(0, colon), name)) {
      return std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
  }
  return std::nullopt;
}

RawHttpConnection::~RawHttpConnection() { Close(); }

bool RawHttpConnection::Connect(int port) {
  Close();
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    Close();
    return false;
  }
  eof_ = false;
  buffer_.clear();
  return true;
}

bool RawHttpConnection::Send(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool RawHttpConnection::Fill(absl::Time deadline) {
  if (fd_ < 0 || eof_) return false;
  const absl::Duration left = deadline - absl::Now();
  pollfd p{fd_, POLLIN, 0};
  const int ready =
      poll(&p, 1, static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(left))));
  if (ready <= 0) return false;
  char buf[16384];
  const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
  if (n <= 0) {
    eof_ = true;
    return false;
  }
  buffer_.append(buf, static_cast<size_t>(n));
  return true;
}

std::optional<RawHttpResponse> RawHttpConnection::ReadResponse(bool body_expected,
                                                               absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  size_t head_end;
  while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (!Fill(deadline)) return std::nullopt;
  }
  RawHttpResponse r;
  r.head = buffer_.substr(0, head_end);
  if (r.head.size() < 12 || !absl::SimpleAtoi(r.head.substr(9, 3), &r.status)) {
    return std::nullopt;
  }
  size_t length = 0;
  if (body_expected) {
    const std::optional<std::string> value = r.Header("Content-Length");
    if (!value.has_value() || !absl::SimpleAtoi(*value, &length)) return std::nullopt;
  }
  const size_t body_begin = head_end + 4;
  while (buffer_.size() < body_begin + length) {
    if (!Fill(deadline)) return std::nullopt;
  }
  r.body = buffer_.substr(body_begin, length);
  buffer_.erase(0, body_begin + length);
  return r;
}

std::string RawHttpConnection::ReadFor(absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (Fill(deadline)) {
  }
  std::string out;
  out.swap(buffer_);
  return out;
}

bool RawHttpConnection::ClosedWithin(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!eof_ && absl::Now() < deadline) Fill(deadline);
  return eof_;
}

void RawHttpConnection::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

std::optional<RawHttpResponse> HttpGetOnce(int port, const std::string& path) {
  RawHttpConnection c;
  if (!c.Connect(port)) return std::nullopt;
  if (!c.Send("GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")) {
    return std::nullopt;
  }
  return c.ReadResponse();
}

}  // namespace tandem::testing
