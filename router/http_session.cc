#include "router/http_session.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace tandem::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

constexpr size_t kMaxWatchBuffer = 64 * 1024;  // stop reading ahead past this (pipelining)
constexpr size_t kWatchReadSize = 4096;

class Session;

class Responder : public HttpResponder {
 public:
  Responder(std::shared_ptr<Session> session, uint64_t generation)
      : session_(std::move(session)), generation_(generation) {}
  void Send(int status, const std::string& content_type, std::string body,
            HttpHeaders extra_headers) override;
  void StartStream(int status, const std::string& content_type, HttpHeaders extra_headers) override;
  void Write(std::string data) override;
  void EndStream() override;
  void SetCancelCallback(std::function<void()> on_cancel) override;

 private:
  std::shared_ptr<Session> session_;
  const uint64_t generation_;  // which request of the connection this answers
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<SessionConfig> config,
          std::shared_ptr<void> keep_alive)
      : io_owner_(std::move(keep_alive)), stream_(std::move(socket)), config_(std::move(config)) {}

  void Run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->DoRead(); });
  }
  template <typename F>
  void Post(F f) {
    net::post(stream_.get_executor(), std::move(f));
  }

  // --- on the strand ---
  void SendWhole(uint64_t gen, int status, const std::string& type, std::string body,
                 const HttpHeaders& extra) {
    if (!Current(gen) || response_started_) return;
    response_started_ = true;
    const std::string length = absl::StrCat("Content-Length: ", body.size());
    Enqueue(ResponseHead(status, type, keep_alive_, extra, &length) + body);
    response_done_ = true;
    MaybeComplete();
  }
  void StartStream(uint64_t gen, int status, const std::string& type, const HttpHeaders& extra) {
    if (!Current(gen) || response_started_) return;
    response_started_ = true;
    const std::string chunked = "Transfer-Encoding: chunked";
    Enqueue(ResponseHead(status, type, keep_alive_, extra, &chunked));
  }
  void WriteChunk(uint64_t gen, const std::string& data) {
    if (!Current(gen) || !response_started_ || response_done_ || data.empty()) return;
    Enqueue(absl::StrFormat("%x\r\n", data.size()) + data + "\r\n");
  }
  void EndStream(uint64_t gen) {
    if (!Current(gen) || !response_started_ || response_done_) return;
    Enqueue("0\r\n\r\n");
    response_done_ = true;
    MaybeComplete();
  }
  void SetCancel(uint64_t gen, std::function<void()> on_cancel) {
    if (gen != generation_) return;
    if (disconnected_) {
      on_cancel();
    } else if (in_request_) {
      on_cancel_ = std::move(on_cancel);
    }
  }

 private:
  bool Current(uint64_t gen) const { return gen == generation_ && in_request_ && !closed_; }

  void DoRead() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(config_->options.max_body_bytes);
    stream_.expires_after(
        std::chrono::seconds(absl::ToInt64Seconds(config_->options.idle_timeout)));
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code ec, size_t) {
    if (ec == http::error::body_limit) return Reject(413, "the request body is too large");
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted ||
        ec == beast::error::timeout || ec == net::error::eof ||
        ec == net::error::connection_reset) {
      return Close();
    }
    if (ec) return Reject(400, absl::StrCat("malformed HTTP request: ", ec.message()));
    http::request<http::string_body> req = parser_->release();
    HttpRequest request;
    request.method = std::string(req.method_string());
    std::string target(req.target());
    const size_t q = target.find('?');
    request.path = target.substr(0, q);
    if (q != std::string::npos) request.query = target.substr(q + 1);
    for (const auto& field : req) {
      request.headers.emplace_back(absl::AsciiStrToLower(std::string(field.name_string())),
                                   std::string(field.value()));
    }
    request.body = std::move(req.body());
    keep_alive_ = req.keep_alive();
    BeginRequest();
    auto responder = std::make_shared<Responder>(shared_from_this(), generation_);
    Watch();
    config_->handler(std::move(request), std::move(responder));
  }

  void BeginRequest() {
    in_request_ = true;
    response_started_ = false;
    response_done_ = false;
    stream_.expires_never();  // a streamed response may stay quiet for a long time
  }

  // Answers a request that could not be parsed, then closes.
  void Reject(int status, const std::string& message) {
    keep_alive_ = false;
    BeginRequest();
    nlohmann::json body = {{"error",
                            {{"message", message},
                             {"type", status == 413 ? "RequestTooLargeError" : "BadRequestError"},
                             {"param", nullptr},
                             {"code", status}}}};
    SendWhole(generation_, status, "application/json", body.dump(), {});
  }

  // Reads while a request is answered (to notice a disconnect) and between requests.
  void Watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(kWatchReadSize),
                            beast::bind_front_handler(&Session::OnWatch, shared_from_this()));
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (ec) return in_request_ ? Disconnected() : Close();
    buffer_.commit(n);
    if (draining_) {
      buffer_.consume(buffer_.size());
      return Watch();
    }
    if (!in_request_) return DoRead();  // the next request has started to arrive
    if (buffer_.size() < kMaxWatchBuffer) Watch();
  }

  void Enqueue(std::string data) {
    out_.push_back(std::move(data));
    DoWrite();
  }

  void DoWrite() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    net::async_write(stream_, net::buffer(out_.front()),
                     beast::bind_front_handler(&Session::OnWrite, shared_from_this()));
  }

  void OnWrite(beast::error_code ec, size_t) {
    writing_ = false;
    if (closed_) {
      out_.clear();  // kept alive until now: the write was still using it
      return;
    }
    if (ec) return Disconnected();
    out_.pop_front();
    if (!out_.empty()) return DoWrite();
    MaybeComplete();
  }

  // The whole response is written: next request (keep-alive) or close.
  void MaybeComplete() {
    if (!response_done_ || writing_ || !out_.empty() || !in_request_) return;
    in_request_ = false;
    on_cancel_ = nullptr;
    ++generation_;
    if (!keep_alive_) {
      // Half-close and drain what the client still sends, so that it reads our response
      // instead of a reset.
      draining_ = true;
      beast::error_code ignored;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
      stream_.expires_after(std::chrono::seconds(2));
      return Watch();
    }
    stream_.expires_after(
        std::chrono::seconds(absl::ToInt64Seconds(config_->options.idle_timeout)));
    if (!watching_) DoRead();  // else OnWatch continues with the next request
  }

  void Disconnected() {
    if (disconnected_) return;
    disconnected_ = true;
    std::function<void()> on_cancel = std::move(on_cancel_);
    on_cancel_ = nullptr;
    Close();
    if (on_cancel) on_cancel();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    if (!writing_) out_.clear();  // else OnWrite clears once the aborted write lets go
  }

  std::shared_ptr<void> io_owner_;  // keeps the io_context alive; first: destroyed last
  beast::tcp_stream stream_;
  std::shared_ptr<SessionConfig> config_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> out_;
  std::function<void()> on_cancel_;
  uint64_t generation_ = 0;
  bool keep_alive_ = false;
  bool in_request_ = false;
  bool response_started_ = false;
  bool response_done_ = false;
  bool writing_ = false;
  bool watching_ = false;
  bool disconnected_ = false;
  bool draining_ = false;  // response sent on a closing connection: read until EOF
  bool closed_ = false;
};

void Responder::Send(int status, const std::string& content_type, std::string body,
                     HttpHeaders extra_headers) {
  session_->Post([s = session_, g = generation_, status, content_type, body = std::move(body),
                  extra = std::move(extra_headers)]() mutable {
    s->SendWhole(g, status, content_type, std::move(body), extra);
  });
}

void Responder::StartStream(int status, const std::string& content_type,
                            HttpHeaders extra_headers) {
  session_->Post(
      [s = session_, g = generation_, status, content_type, extra = std::move(extra_headers)] {
        s->StartStream(g, status, content_type, extra);
      });
}

void Responder::Write(std::string data) {
  session_->Post(
      [s = session_, g = generation_, data = std::move(data)] { s->WriteChunk(g, data); });
}

void Responder::EndStream() {
  session_->Post([s = session_, g = generation_] { s->EndStream(g); });
}

void Responder::SetCancelCallback(std::function<void()> on_cancel) {
  session_->Post([s = session_, g = generation_, f = std::move(on_cancel)]() mutable {
    s->SetCancel(g, std::move(f));
  });
}

}  // namespace

void StartSession(tcp::socket socket, std::shared_ptr<SessionConfig> config,
                  std::shared_ptr<void> keep_alive) {
  std::make_shared<Session>(std::move(socket), std::move(config), std::move(keep_alive))->Run();
}

std::string ResponseHead(int status, const std::string& content_type, bool keep_alive,
                         const HttpHeaders& extra, const std::string* length_or_chunked) {
  std::string head = absl::StrCat("HTTP/1.1 ", status, " ",
                                  std::string(http::obsolete_reason(http::int_to_status(status))),
                                  "\r\nServer: tandem\r\nContent-Type: ", content_type,
                                  "\r\nConnection: ", keep_alive ? "keep-alive" : "close", "\r\n");
  if (length_or_chunked != nullptr) absl::StrAppend(&head, *length_or_chunked, "\r\n");
  for (const auto& [name, value] : extra) absl::StrAppend(&head, name, ": ", value, "\r\n");
  head += "\r\n";
  return head;
}

}  // namespace tandem::router
