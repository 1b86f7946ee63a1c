#include "deploy/launcher/http_get.h"

#include <sys/socket.h>

#include <cerrno>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "comm/socket_io.h"

namespace tandem::launcher {
namespace {

// Sends `request` and reads the response until the server closes the connection.
absl::StatusOr<HttpResponse> Exchange(const std::string& host_port, const std::string& request,
                                      absl::Duration timeout) {
  const absl::Time deadline = Clock::Real()->Now() + timeout;
  absl::StatusOr<Socket> s = Connect(host_port, deadline);
  if (!s.ok()) return s.status();
  if (absl::Status st = WriteAll(*s, request.data(), request.size(), deadline); !st.ok()) {
    return st;
  }
  std::string raw;
  char buf[4096];
  while (true) {
    const absl::Status st = ReadAll(*s, buf, 1, deadline);  // byte-wise wait, then drain
    if (!st.ok()) {
      if (absl::IsUnavailable(st)) break;  // EOF: the server closed, response complete
      return st;
    }
    raw.push_back(buf[0]);
    const ssize_t n = recv(s->fd(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) raw.append(buf, static_cast<size_t>(n));
    if (n == 0) break;
  }
  HttpResponse r;
  const size_t space = raw.find(' ');
  const size_t header_end = raw.find("\r\n\r\n");
  if (space == std::string::npos || header_end == std::string::npos ||
      !absl::SimpleAtoi(raw.substr(space + 1, 3), &r.status)) {
    return absl::InternalError("malformed HTTP response");
  }
  r.body = raw.substr(header_end + 4);
  return r;
}

}  // namespace

absl::StatusOr<HttpResponse> HttpGet(const std::string& host_port, const std::string& path,
                                     absl::Duration timeout) {
  return Exchange(
      host_port,
      absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: ", host_port, "\r\nConnection: close\r\n\r\n"),
      timeout);
}

absl::StatusOr<HttpResponse> HttpPostJson(const std::string& host_port, const std::string& path,
                                          const std::string& json, absl::Duration timeout) {
  return Exchange(host_port,
                  absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: ", host_port,
                               "\r\nContent-Type: application/json\r\nContent-Length: ",
                               json.size(), "\r\nConnection: close\r\n\r\n", json),
                  timeout);
}

}  // namespace tandem::launcher
