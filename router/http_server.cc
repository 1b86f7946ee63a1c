#include "router/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/accept_backoff.h"
#include "base/listen_error.h"
#include "base/logging.h"
#include "router/http_session.h"

namespace tandem::router {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

std::string HttpRequest::Header(const std::string& name) const {
  for (const auto& [key, value] : headers) {
    if (key == name) return value;
  }
  return "";
}

struct HttpServer::Impl {
  net::io_context ioc;
  // Every use of the acceptor (re-arming the accept, closing it) runs on this strand: with
  // several I/O threads, a close racing an accept completion would otherwise re-arm a closed
  // acceptor.
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(ioc)};
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::thread_pool> handler_pool;  // large bodies (offload_body_bytes)
  AcceptBackoff backoff;                         // on accept_strand
  net::steady_timer retry_timer{accept_strand};
};

namespace {

void Accept(std::shared_ptr<HttpServer::Impl> impl, std::shared_ptr<SessionConfig> config) {
  impl->acceptor->async_accept(
      net::make_strand(impl->ioc),
      net::bind_executor(
          impl->accept_strand, [impl, config](beast::error_code ec, tcp::socket socket) {
            if (!impl->acceptor->is_open()) return;
            if (!ec) {
              impl->backoff.OnSuccess();
              beast::error_code ignored;
              socket.set_option(tcp::no_delay(true), ignored);
              StartSession(std::move(socket), config, impl);
              return Accept(impl, config);
            }
            // Out of descriptors: wait (the connection stays in the backlog) instead of
            // failing again at once, and log a little (base/accept_backoff.h).
            const AcceptBackoff::Decision next = impl->backoff.OnFailure(ec.value(), ec.message());
            if (next.log) {
              LOG(WARNING) << "HTTP server: " << next.message;
            }
            if (next.delay <= absl::ZeroDuration()) return Accept(impl, config);
            impl->retry_timer.expires_after(absl::ToChronoNanoseconds(next.delay));
            impl->retry_timer.async_wait([impl, config](beast::error_code timer_ec) {
              if (timer_ec || !impl->acceptor->is_open()) return;
              Accept(impl, config);
            });
          }));
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : options_(std::move(options)), handler_(std::move(handler)), impl_(std::make_shared<Impl>()) {}

HttpServer::~HttpServer() { Stop(); }

absl::Status HttpServer::Start() {
  beast::error_code ec;
  const net::ip::address address = net::ip::make_address(options_.address, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad address ", options_.address));
  tcp::endpoint endpoint(address, static_cast<uint16_t>(options_.port));
  impl_->acceptor.emplace(impl_->ioc);
  tcp::acceptor& acceptor = *impl_->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    const std::string message =
        absl::StrCat("cannot listen on ", options_.address, ":", options_.port, ": ", ec.message());
    return ec == net::error::address_in_use ? PortTakenError(message)
                                            : absl::UnavailableError(message);
  }
  port_ = acceptor.local_endpoint().port();
  impl_->handler_pool.emplace(static_cast<size_t>(std::max(1, options_.handler_threads)));
  HttpHandler handler = [handler = handler_, impl = impl_.get(),
                         threshold = options_.offload_body_bytes](
                            HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    if (request.body.size() < threshold) return handler(std::move(request), std::move(responder));
    net::post(*impl->handler_pool,
              [handler, request = std::move(request), responder = std::move(responder)]() mutable {
                handler(std::move(request), std::move(responder));
              });
  };
  auto config = std::make_shared<SessionConfig>(SessionConfig{options_, std::move(handler)});
  Accept(impl_, config);
  for (int i = 0; i < std::max(1, options_.num_threads); ++i) {
    threads_.emplace_back([impl = impl_] { impl->ioc.run(); });
  }
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (threads_.empty()) return;
  net::post(impl_->accept_strand, [impl = impl_] {
    beast::error_code ignored;
    impl->acceptor->close(ignored);
    impl->retry_timer.cancel();
  });
  impl_->ioc.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  impl_->handler_pool->join();
}

}  // namespace tandem::router
