#include "comm/socket_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/listen_error.h"

namespace tandem {
namespace {

absl::Status ErrnoStatus(absl::string_view what, int err) {
  if (err == ECONNREFUSED || err == ECONNRESET || err == EPIPE || err == ENOTCONN ||
      err == EHOSTUNREACH || err == ENETUNREACH) {
    return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
  }
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

absl::Status SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return ErrnoStatus("fcntl(O_NONBLOCK)", errno);
  }
  return absl::OkStatus();
}

// Polls `socket` for `events` until `deadline`. OK when ready (or in error: the next syscall
// reports it), DeadlineExceeded otherwise, Cancelled once the socket's cancel check is true.
absl::Status WaitFor(const Socket& socket, short events, absl::Time deadline,
                     absl::string_view what) {
  // Without a cancel check a wait wakes only to re-read the clock.
  const int64_t slice_ms =
      socket.HasCancel() ? absl::ToInt64Milliseconds(kCancelCheckInterval) : 1000;
  while (true) {
    if (socket.Cancelled()) return absl::CancelledError(absl::StrCat(what, ": given up"));
    const absl::Duration left = deadline - Clock::Real()->Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    }
    pollfd p{socket.fd(), events, 0};
    const int ms =
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, slice_ms));
    const int n = poll(&p, 1, ms);
    if (n > 0) return absl::OkStatus();
    if (n < 0 && errno != EINTR) return ErrnoStatus(absl::StrCat(what, ": poll"), errno);
  }
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.Release();
    cancel_ = std::move(other.cancel_);
  }
  return *this;
}

void Socket::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::Shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

absl::Status SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), port) || *port < 0 || *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("bad address '", address, "' (want host:port)"));
  }
  *host = address.substr(0, colon);
  return absl::OkStatus();
}

absl::StatusOr<Socket> Listen(const std::string& host, int port, bool reuse_address) {
  Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  if (!s.valid()) return ErrnoStatus("socket", errno);
  const int one = 1;
  if (reuse_address) setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("bad IPv4 listen host '", host, "'"));
  }
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    const int err = errno;
    const std::string message = absl::StrCat("bind ", host, ":", port, ": ", std::strerror(err));
    return err == EADDRINUSE ? PortTakenError(message) : absl::UnavailableError(message);
  }
  if (::listen(s.fd(), 128) < 0) return ErrnoStatus("listen", errno);
  if (absl::Status st = SetNonBlocking(s.fd()); !st.ok()) return st;
  return s;
}

absl::StatusOr<int> LocalPort(const Socket& socket) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    return ErrnoStatus("getsockname", errno);
  }
  return static_cast<int>(ntohs(addr.sin_port));
}

absl::StatusOr<Socket> Accept(const Socket& listener, absl::Time deadline) {
  while (true) {
    if (absl::Status st = WaitFor(listener, POLLIN, deadline, "accept"); !st.ok()) return st;
    const int fd = ::accept(listener.fd(), nullptr, nullptr);
    if (fd >= 0) {
      Socket s(fd);
      if (absl::Status st = SetNonBlocking(fd); !st.ok()) return st;
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return s;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
      continue;
    }
    if (errno == EINVAL) return absl::CancelledError("listener shut down");
    return ErrnoStatus("accept", errno);
  }
}

absl::StatusOr<Socket> Connect(const std::string& address, absl::Time deadline,
                               CancelCheck cancelled) {
  std::string host;
  int port = 0;
  if (absl::Status st = SplitHostPort(address, &host, &port); !st.ok()) return st;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) {
    return absl::UnavailableError(absl::StrCat("cannot resolve '", host, "'"));
  }
  Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr;
  std::memcpy(&addr, res->ai_addr, sizeof(addr));
  freeaddrinfo(res);
  if (!s.valid()) return ErrnoStatus("socket", errno);
  s.SetCancel(std::move(cancelled));
  if (absl::Status st = SetNonBlocking(s.fd()); !st.ok()) return st;
  const int one = 1;
  setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) {
    if (errno != EINPROGRESS) return ErrnoStatus(absl::StrCat("connect ", address), errno);
    if (absl::Status st = WaitFor(s, POLLOUT, deadline, "connect"); !st.ok()) return st;
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return ErrnoStatus(absl::StrCat("connect ", address), err);
  }
  return s;
}

absl::Status WriteAll(const Socket& socket, const void* data, size_t size, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(socket.fd(), p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (absl::Status st = WaitFor(socket, POLLOUT, deadline, "send"); !st.ok()) return st;
      continue;
    }
    return ErrnoStatus("send", n < 0 ? errno : EPIPE);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(const Socket& socket, void* data, size_t size, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(socket.fd(), p, size, 0);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return absl::UnavailableError("peer closed the connection");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (absl::Status st = WaitFor(socket, POLLIN, deadline, "recv"); !st.ok()) return st;
      continue;
    }
    return ErrnoStatus("recv", errno);
  }
  return absl::OkStatus();
}

bool SpinUntilReadable(const Socket& socket, absl::Duration spin, absl::Time deadline) {
  const absl::Time end = std::min(deadline, Clock::Real()->Now() + spin);
  do {
    char byte;
    const ssize_t n = ::recv(socket.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n >= 0) return true;  // data, or the peer closed (0)
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
  } while (Clock::Real()->Now() < end);
  return false;
}

absl::StatusOr<bool> PollReadable(const Socket& socket, absl::Duration wait) {
  if (socket.Cancelled()) return absl::CancelledError("given up");
  pollfd p{socket.fd(), POLLIN, 0};
  const timespec ts = absl::ToTimespec(std::max(wait, absl::ZeroDuration()));
  const int n = ppoll(&p, 1, &ts, nullptr);
  if (n < 0) {
    if (errno == EINTR) return false;
    return ErrnoStatus("ppoll", errno);
  }
  return n > 0;
}

}  // namespace tandem
