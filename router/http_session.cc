#include "router/http_session.h"

#include <array>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace tandem::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

// While a request is answered, bytes of the next ones (pipelining) are read and kept up to this
// much; then reading pauses until the response is complete.
constexpr size_t kMaxPendingInput = 64 * 1024;
constexpr size_t kReadSize = 16 * 1024;
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;
// After a response with "Connection: close", how long the client may take to close its side.
constexpr auto kLingerTime = std::chrono::seconds(2);

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

// The connection's state machine. One read is outstanding at a time, into read_buf_; what it
// brings is appended to input_, which the parser consumes only between requests. So bytes of a
// pipelined request that arrive while one is answered wait in input_, and are parsed the moment
// that response is written (not when more bytes arrive). A timer (not the socket) closes a
// connection that is idle, or slow to deliver a request, for idle_timeout.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<SessionConfig> config,
          std::shared_ptr<void> keep_alive)
      : io_owner_(std::move(keep_alive)),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        config_(std::move(config)) {}

  void Run() {
    net::dispatch(socket_.get_executor(), [self = shared_from_this()] {
      self->ArmTimer(self->IdleTimeout());
      self->StartRead();
    });
  }
  template <typename F>
  void Post(F f) {
    net::post(socket_.get_executor(), std::move(f));
  }

  // --- on the strand ---
  void SendWhole(uint64_t gen, int status, const std::string& type, std::string body,
                 const HttpHeaders& extra) {
    if (!Current(gen) || response_started_) return;
    response_started_ = true;
    const std::string length = absl::StrCat("Content-Length: ", body.size());
    std::string head = ResponseHead(status, type, keep_alive_, extra, &length);
    if (!head_request_) head += body;  // HEAD: the headers GET would send, no body
    Enqueue(std::move(head));
    response_done_ = true;
    MaybeComplete();
  }
  void StartStream(uint64_t gen, int status, const std::string& type, const HttpHeaders& extra) {
    if (!Current(gen) || response_started_) return;
    response_started_ = true;
    const std::string chunked = "Transfer-Encoding: chunked";
    Enqueue(ResponseHead(status, type, keep_alive_, extra, &chunked));
    if (head_request_) {  // no body at all, not even the last chunk
      response_done_ = true;
      MaybeComplete();
    }
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
  std::chrono::steady_clock::duration IdleTimeout() const {
    return absl::ToChronoNanoseconds(config_->options.idle_timeout);
  }

  // --- reading ---
  void StartRead() {
    if (reading_ || closed_ || read_ended_) return;
    if (in_request_ && input_.size() >= kMaxPendingInput) return;  // resumed by MaybeComplete
    reading_ = true;
    socket_.async_read_some(net::buffer(read_buf_),
                            beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec) {
      read_ended_ = true;
      // While a request is answered, the client going away (EOF or reset) cancels it.
      return in_request_ ? Disconnected() : Close();
    }
    if (lingering_) return StartRead();  // discard until the client closes
    input_.append(read_buf_.data(), n);
    ParseInput();
    StartRead();
  }

  // Between requests: feeds input_ to the parser; a whole request is dispatched.
  void ParseInput() {
    while (!in_request_ && !closed_ && !lingering_ && !input_.empty()) {
      if (!parser_) {
        parser_.emplace();
        parser_->header_limit(kMaxHeaderBytes);
        parser_->body_limit(config_->options.max_body_bytes);
        parser_->eager(true);
        continue_sent_ = false;
      }
      beast::error_code ec;
      const size_t used = parser_->put(net::buffer(input_), ec);
      input_.erase(0, used);
      if (ec == http::error::body_limit) return Reject(413, "the request body is too large");
      if (ec && ec != http::error::need_more) {
        return Reject(400, absl::StrCat("malformed HTTP request: ", ec.message()));
      }
      if (parser_->is_done()) {
        Dispatch();
        continue;
      }
      MaybeSendContinue();
      if (ec || used == 0) return;  // wait for more bytes
    }
  }

  // "Expect: 100-continue" (curl sends it for large bodies): tell the client to go on.
  void MaybeSendContinue() {
    if (continue_sent_ || !parser_->is_header_done()) return;
    continue_sent_ = true;
    const auto& header = parser_->get();
    if (absl::EqualsIgnoreCase(std::string(header[http::field::expect]), "100-continue") &&
        header.version() >= 11) {
      Enqueue("HTTP/1.1 100 Continue\r\n\r\n");
    }
  }

  void Dispatch() {
    http::request<http::string_body> req = parser_->release();
    parser_.reset();
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
    BeginRequest(req.method() == http::verb::head);
    auto responder = std::make_shared<Responder>(shared_from_this(), generation_);
    config_->handler(std::move(request), std::move(responder));
  }

  void BeginRequest(bool head) {
    in_request_ = true;
    head_request_ = head;
    response_started_ = false;
    response_done_ = false;
    CancelTimer();  // a streamed response may stay quiet for a long time
  }

  // Answers a request that could not be parsed, then closes.
  void Reject(int status, const std::string& message) {
    parser_.reset();
    keep_alive_ = false;
    BeginRequest(/*head=*/false);
    nlohmann::json body = {{"error",
                            {{"message", message},
                             {"type", status == 413 ? "RequestTooLargeError" : "BadRequestError"},
                             {"param", nullptr},
                             {"code", status}}}};
    SendWhole(generation_, status, "application/json", body.dump(), {});
  }

  // --- writing ---
  void Enqueue(std::string data) {
    out_.push_back(std::move(data));
    DoWrite();
  }

  void DoWrite() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    net::async_write(socket_, net::buffer(out_.front()),
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

  // The whole response is written: the next request (keep-alive) or close.
  void MaybeComplete() {
    if (!response_done_ || writing_ || !out_.empty() || !in_request_) return;
    in_request_ = false;
    on_cancel_ = nullptr;
    ++generation_;
    if (!keep_alive_) {
      // Half-close and drain what the client still sends, so that it reads our response
      // instead of a reset.
      lingering_ = true;
      input_.clear();
      beast::error_code ignored;
      socket_.shutdown(tcp::socket::shutdown_send, ignored);
      ArmTimer(kLingerTime);
      return StartRead();
    }
    ArmTimer(IdleTimeout());
    ParseInput();  // a pipelined request may be here already
    StartRead();   // resumes a read paused on a full input_
  }

  // --- timer and teardown ---
  void ArmTimer(std::chrono::steady_clock::duration after) {
    const uint64_t gen = ++timer_generation_;
    timer_.expires_after(after);
    timer_.async_wait([self = shared_from_this(), gen](beast::error_code ec) {
      if (ec || gen != self->timer_generation_) return;  // cancelled or re-armed
      self->Close();
    });
  }
  void CancelTimer() {
    ++timer_generation_;
    timer_.cancel();
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
    CancelTimer();
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    if (!writing_) out_.clear();  // else OnWrite clears once the aborted write lets go
  }

  std::shared_ptr<void> io_owner_;  // keeps the io_context alive; first: destroyed last
  tcp::socket socket_;
  net::steady_timer timer_;
  std::shared_ptr<SessionConfig> config_;
  std::array<char, kReadSize> read_buf_;
  std::string input_;  // read, not yet parsed
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> out_;
  std::function<void()> on_cancel_;
  uint64_t generation_ = 0;
  uint64_t timer_generation_ = 0;
  bool keep_alive_ = false;
  bool head_request_ = false;
  bool in_request_ = false;
  bool response_started_ = false;
  bool response_done_ = false;
  bool continue_sent_ = false;
  bool reading_ = false;
  bool read_ended_ = false;  // EOF or error on the read side
  bool writing_ = false;
  bool disconnected_ = false;
  bool lingering_ = false;  // response sent on a closing connection: read until EOF
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
