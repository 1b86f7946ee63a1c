#include "worker/metrics_http_server.h"

#include <prometheus/collectable.h>
#include <prometheus/text_serializer.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/accept_backoff.h"
#include "base/check.h"
#include "base/listen_error.h"
#include "base/logging.h"

namespace tandem {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// Lifetime: `ioc` owns every pending handler, and handlers own the sessions. Stop() stops `ioc`,
// joins `thread`, then destroys `acceptor` and `ioc` (which destroys the sessions, closing their
// sockets) while the rest is still alive: sessions point back here.
struct MetricsHttpServer::Impl {
  MetricsHttpServer::Options options;
  absl::Mutex probes_mu;
  std::function<absl::Status()> health ABSL_GUARDED_BY(probes_mu);
  std::function<bool()> ready ABSL_GUARDED_BY(probes_mu);
  std::shared_ptr<const prometheus::Collectable> collectable;
  int num_connections = 0;  // open sessions; on the I/O thread (or after it is joined)
  std::optional<net::io_context> ioc;
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> retry_timer;  // accept backoff (base/accept_backoff.h)
  AcceptBackoff backoff;
  std::thread thread;
};

namespace {

constexpr char kMetricsPath[] = "/metrics";
constexpr char kHealthPath[] = "/health";
constexpr char kReadyPath[] = "/ready";
constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;
constexpr uint64_t kMaxBodyBytes = 64 * 1024;  // only GET and HEAD are served; a body is ignored

using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

Response MakeResponse(const Request& req, http::status status, std::string content_type,
                      std::string body) {
  Response res{status, req.version()};
  res.set(http::field::server, "tandem");
  res.set(http::field::content_type, std::move(content_type));
  res.keep_alive(req.keep_alive());
  res.body() = std::move(body);
  res.prepare_payload();  // Content-Length
  return res;
}

// The response to `req`, with its body even for HEAD (the caller drops it).
Response Answer(const Request& req, MetricsHttpServer::Impl& server) {
  const beast::string_view target = req.target();
  const beast::string_view path = target.substr(0, target.find('?'));
  const bool get = req.method() == http::verb::get || req.method() == http::verb::head;
  if (get && (path == kHealthPath || path == kReadyPath)) {
    std::function<absl::Status()> health;
    std::function<bool()> ready;
    {
      absl::MutexLock lock(&server.probes_mu);
      health = server.health;
      ready = server.ready;
    }
    const absl::Status status = health ? health() : absl::OkStatus();
    if (path == kHealthPath) {
      return status.ok() ? MakeResponse(req, http::status::ok, "text/plain", "ok\n")
                         : MakeResponse(req, http::status::service_unavailable, "text/plain",
                                        absl::StrCat(status.message(), "\n"));
    }
    return status.ok() && ready && ready()
               ? MakeResponse(req, http::status::ok, "text/plain", "ready\n")
               : MakeResponse(req, http::status::service_unavailable, "text/plain", "not ready\n");
  }
  if (path != kMetricsPath) {
    return MakeResponse(req, http::status::not_found, "text/plain", "not found\n");
  }
  if (req.method() != http::verb::get && req.method() != http::verb::head) {
    Response res =
        MakeResponse(req, http::status::method_not_allowed, "text/plain", "method not allowed\n");
    res.set(http::field::allow, "GET, HEAD");
    return res;
  }
  return MakeResponse(req, http::status::ok, kContentType,
                      prometheus::TextSerializer().Serialize(server.collectable->Collect()));
}

// One connection: read a request → answer it → with keep-alive, the next one. Runs on the one
// I/O thread only.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, MetricsHttpServer::Impl* server)
      : server_(server), stream_(std::move(socket)) {
    ++server_->num_connections;
  }
  ~Session() { --server_->num_connections; }

  void Read() {
    parser_.emplace();
    parser_->header_limit(kMaxHeaderBytes);
    parser_->body_limit(kMaxBodyBytes);
    stream_.expires_after(Timeout());
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

 private:
  std::chrono::steady_clock::duration Timeout() const {
    return absl::ToChronoNanoseconds(server_->options.read_timeout);
  }

  void OnRead(beast::error_code ec, size_t) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::eof ||
        ec == net::error::connection_reset) {
      return Close();
    }
    if (ec) {  // not HTTP, or over a limit: say so, then close
      Request bad;
      bad.version(11);
      bad.keep_alive(false);
      return Write(MakeResponse(bad, http::status::bad_request, "text/plain",
                                absl::StrCat("bad request: ", ec.message(), "\n")),
                   /*head=*/false);
    }
    const Request& req = parser_->get();
    Write(Answer(req, *server_), req.method() == http::verb::head);
  }

  void Write(Response res, bool head) {
    stream_.expires_after(Timeout());
    if (head) {  // the same header (Content-Length included), no body
      auto msg = std::make_shared<http::response<http::empty_body>>(std::move(res.base()));
      return http::async_write(stream_, *msg,
                               [self = shared_from_this(), msg](beast::error_code ec, size_t) {
                                 self->OnWrite(ec, msg->need_eof());
                               });
    }
    auto msg = std::make_shared<Response>(std::move(res));
    http::async_write(stream_, *msg,
                      [self = shared_from_this(), msg](beast::error_code ec, size_t) {
                        self->OnWrite(ec, msg->need_eof());
                      });
  }

  void OnWrite(beast::error_code ec, bool close) {
    if (ec || close) return Close();
    Read();
  }

  // The session ends when its last handler returns (nothing more is queued).
  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  MetricsHttpServer::Impl* const server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;  // bytes read past a request (pipelining) stay here
  std::optional<http::request_parser<http::string_body>> parser_;
};

void Accept(MetricsHttpServer::Impl* server) {
  server->acceptor->async_accept([server](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted) return;  // the acceptor closed
    if (ec) {
      // Out of descriptors: wait instead of failing again at once, and log a little.
      const AcceptBackoff::Decision next = server->backoff.OnFailure(ec.value(), ec.message());
      if (next.log) {
        LOG(WARNING) << "metrics server: " << next.message;
      }
      if (next.delay > absl::ZeroDuration()) {
        server->retry_timer->expires_after(absl::ToChronoNanoseconds(next.delay));
        server->retry_timer->async_wait([server](beast::error_code timer_ec) {
          if (!timer_ec) Accept(server);
        });
        return;
      }
    } else if (server->num_connections >= server->options.max_connections) {
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      server->backoff.OnSuccess();
      std::make_shared<Session>(std::move(socket), server)->Read();
    }
    Accept(server);
  });
}

absl::Status Listen(MetricsHttpServer::Impl& server) {
  const MetricsHttpServer::Options& o = server.options;
  if (o.port < 0 || o.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("metrics port out of range: ", o.port));
  }
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(o.host, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics server: not an IP address: \"", o.host, "\""));
  }
  const tcp::endpoint endpoint(address, static_cast<uint16_t>(o.port));
  server.acceptor.emplace(*server.ioc);
  server.retry_timer.emplace(*server.ioc);
  tcp::acceptor& acceptor = *server.acceptor;
  acceptor.open(endpoint.protocol(), ec);
  // SO_REUSEADDR: a restarted worker may bind its port again at once (connections of the last
  // run in TIME_WAIT); on Linux it never lets two sockets listen on one port.
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    const std::string message =
        absl::StrCat("metrics server cannot listen on ", o.host, ":", o.port, ": ", ec.message());
    return ec == net::error::address_in_use ? PortTakenError(message)
                                            : absl::UnavailableError(message);
  }
  return absl::OkStatus();
}

}  // namespace

void MetricsHttpServer::SetProbes(std::function<absl::Status()> health,
                                  std::function<bool()> ready) {
  absl::MutexLock lock(&impl_->probes_mu);
  impl_->health = std::move(health);
  impl_->ready = std::move(ready);
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const Options& options, std::shared_ptr<const prometheus::Collectable> collectable) {
  CHECK(collectable != nullptr);
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->collectable = std::move(collectable);
  impl->ioc.emplace(/*concurrency_hint=*/1);
  if (absl::Status st = Listen(*impl); !st.ok()) return st;
  const int port = impl->acceptor->local_endpoint().port();
  Accept(impl.get());
  impl->thread = std::thread([ioc = &*impl->ioc] { ioc->run(); });
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(std::move(impl), port));
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  if (!impl_->ioc.has_value()) return;
  impl_->ioc->stop();
  impl_->thread.join();
  impl_->retry_timer.reset();
  impl_->acceptor.reset();
  impl_->ioc.reset();
  CHECK_EQ(impl_->num_connections, 0);
}

}  // namespace tandem
