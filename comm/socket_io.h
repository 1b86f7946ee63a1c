// Thin POSIX TCP helpers with deadlines, for the host KV transport. Every socket is
// non-blocking; reads and writes poll() until the deadline, so a silent peer can never hang a
// caller. A socket may also carry a cancel check (Socket::SetCancel): then every wait of its
// I/O ends with Cancelled within kCancelCheckInterval of the check turning true, long before
// the deadline (a prefill worker gives up a transfer to a frozen peer at once that way). Writes use
// MSG_NOSIGNAL: a dead peer is an error status, not SIGPIPE. Deadlines are real time
// (Clock::Real()): poll(2) is what waits them out.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

// True when the caller has given up on a socket's I/O (checked from the thread doing the I/O;
// must be cheap and thread-safe, e.g. reading atomics).
using CancelCheck = std::function<bool()>;

// How often a blocked wait re-reads its socket's cancel check.
inline constexpr absl::Duration kCancelCheckInterval = absl::Milliseconds(10);

// Owns one file descriptor; closes it on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.Release()), cancel_(std::move(other.cancel_)) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { Close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Close();
  // Every later wait in WriteAll / ReadAll / Accept on this socket also ends, with Cancelled,
  // once `cancelled()` is true (checked before each wait and every kCancelCheckInterval).
  void SetCancel(CancelCheck cancelled) { cancel_ = std::move(cancelled); }
  // True when a cancel check is set and returns true.
  bool Cancelled() const { return cancel_ && cancel_(); }
  bool HasCancel() const { return static_cast<bool>(cancel_); }
  // Wakes any thread blocked in poll() on this socket (shutdown(SHUT_RDWR)); keeps the fd.
  void Shutdown();

 private:
  int fd_ = -1;
  CancelCheck cancel_;  // empty: waits end only at their deadline
};

// Listens on host:port (port 0: any free port). Unavailable on bind failure (IsPortTaken when the
// port is in use).
// reuse_address: SO_REUSEADDR (a port whose old connections linger in TIME_WAIT still binds).
absl::StatusOr<Socket> Listen(const std::string& host, int port, bool reuse_address = true);
// The local port a socket is bound to.
absl::StatusOr<int> LocalPort(const Socket& socket);
// Accepts one connection, waiting at most until `deadline`. DeadlineExceeded when none came;
// Cancelled when the listening socket was shut down.
absl::StatusOr<Socket> Accept(const Socket& listener, absl::Time deadline);
// Connects to "host:port". Unavailable (refused / unreachable), DeadlineExceeded; Cancelled when
// `cancelled` turned true first (the returned socket carries it: see Socket::SetCancel).
absl::StatusOr<Socket> Connect(const std::string& address, absl::Time deadline,
                               CancelCheck cancelled = {});

// Writes / reads exactly `size` bytes. Unavailable when the peer closed or reset the connection
// (for ReadAll: also EOF), DeadlineExceeded when the deadline passed first, Cancelled when the
// socket's cancel check turned true first (a write may then have sent part of the bytes).
absl::Status WriteAll(const Socket& socket, const void* data, size_t size, absl::Time deadline);
absl::Status ReadAll(const Socket& socket, void* data, size_t size, absl::Time deadline);

// Waits at most `wait` (sub-millisecond waits are honoured: ppoll) for the socket to have
// something to read or to be closed by the peer: true then (read it to learn which), false
// when nothing came. Cancelled when the socket's cancel check is true; Unavailable on a socket
// error. For callers that poll something else between looks at the socket (comm/nccl_kv_*).
absl::StatusOr<bool> PollReadable(const Socket& socket, absl::Duration wait);

// Spins (never sleeps) for at most `spin`, and not past `deadline`, until the socket has
// something to read or the peer closed it: true then; false when the time passed first (or on a
// socket error, which the next read reports). For a reply due within microseconds, where the
// wake-up from a poll(2) sleep would cost more than the wait itself; callers then read as usual.
bool SpinUntilReadable(const Socket& socket, absl::Duration spin, absl::Time deadline);

// Splits "host:port"; InvalidArgument if malformed.
absl::Status SplitHostPort(const std::string& address, std::string* host, int* port);

}  // namespace tandem
