#include "tests/http/http_connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace tandem::testing {

std::string HttpResult::Header(const std::string& name) const {
  for (absl::string_view line : absl::StrSplit(headers, "\r\n")) {
    const size_t colon = line.find(':');
    if (colon != absl::string_view::npos && absl::EqualsIgnoreCase(line.substr(0, colon), name)) {
      return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "";
}

std::string KeepAliveRequest(const std::string& method, const std::string& path,
                             const std::string& body, const std::string& headers) {
  std::string request =
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: localhost\r\n", headers);
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&request, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  return request;
}

bool HttpConnection::Connect(int port) {
  Close();
  buffer_.clear();
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Close();
    return false;
  }
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return true;
}

bool HttpConnection::Send(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool HttpConnection::Fill(absl::Time deadline) {
  if (fd_ < 0) return false;
  const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
  if (left <= 0) return false;
  pollfd pfd{fd_, POLLIN, 0};
  const int ready = poll(&pfd, 1, static_cast<int>(left));
  if (ready <= 0) return ready < 0 && errno == EINTR;
  char buf[65536];
  const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
  if (n < 0 && errno == EINTR) return true;
  if (n <= 0) return false;
  buffer_.append(buf, static_cast<size_t>(n));
  return true;
}

std::optional<HttpResult> HttpConnection::Read(bool head, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  size_t head_end;
  while ((head_end = buffer_.find("\r\n\r\n")) == std::string::npos) {
    if (!Fill(deadline)) return std::nullopt;
  }
  HttpResult result;
  const std::string head_text = buffer_.substr(0, head_end);
  std::vector<std::string> lines = absl::StrSplit(head_text, "\r\n");
  if (lines.empty() || lines[0].size() < 12 ||
      !absl::SimpleAtoi(lines[0].substr(9, 3), &result.status)) {
    return std::nullopt;
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    absl::StrAppend(&result.headers, absl::AsciiStrToLower(lines[i].substr(0, colon)),
                    lines[i].substr(colon), "\r\n");
  }
  size_t pos = head_end + 4;
  if (head || result.status == 100 || result.status == 204 || result.status == 304) {
    buffer_.erase(0, pos);
    return result;
  }
  if (absl::EqualsIgnoreCase(result.Header("transfer-encoding"), "chunked")) {
    for (;;) {
      size_t eol;
      while ((eol = buffer_.find("\r\n", pos)) == std::string::npos) {
        if (!Fill(deadline)) return std::nullopt;
      }
      size_t size = 0;
      if (!absl::SimpleHexAtoi(buffer_.substr(pos, eol - pos), &size)) return std::nullopt;
      while (buffer_.size() < eol + 2 + size + 2) {
        if (!Fill(deadline)) return std::nullopt;
      }
      result.body += buffer_.substr(eol + 2, size);
      pos = eol + 2 + size + 2;
      if (size == 0) break;
    }
  } else {
    size_t length = 0;
    if (!absl::SimpleAtoi(result.Header("content-length"), &length)) return std::nullopt;
    while (buffer_.size() < pos + length) {
      if (!Fill(deadline)) return std::nullopt;
    }
    result.body = buffer_.substr(pos, length);
    pos += length;
  }
  buffer_.erase(0, pos);
  return result;
}

std::string HttpConnection::ReadFor(absl::Duration wait) {
  const absl::Time deadline = absl::Now() + wait;
  while (Fill(deadline)) {
  }
  std::string out;
  out.swap(buffer_);
  return out;
}

bool HttpConnection::ClosedWithin(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (fd_ < 0) return true;
    pollfd pfd{fd_, POLLIN, 0};
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (poll(&pfd, 1, static_cast<int>(std::max<int64_t>(left, 1))) <= 0) continue;
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
    if (n > 0) buffer_.append(buf, static_cast<size_t>(n));
  }
  return false;
}

void HttpConnection::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

std::optional<HttpResult> HttpGetOnce(int port, const std::string& path) {
  HttpConnection c;
  if (!c.Connect(port)) return std::nullopt;
  if (!c.Send("GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")) {
    return std::nullopt;
  }
  return c.Read();
}

}  // namespace tandem::testing
