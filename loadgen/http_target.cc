#include "loadgen/http_target.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <unordered_set>
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded

#include "absl/strings/str_cat.h"
#include "loadgen/sse_parser.h"
#include "loadgen/stream_chunk.h"

namespace tandem::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using nlohmann::json;

namespace {

constexpr auto kAwait = asio::use_awaitable;
constexpr size_t kReadChunk = 16 * 1024;
constexpr size_t kErrorBodyLimit = 4096;

struct ParsedUrl {
  std::string host;
  std::string port;
  std::string prefix;  // path before the endpoint, without a trailing '/'
};

absl::StatusOr<ParsedUrl> ParseBaseUrl(const std::string& base_url) {
  const std::string kScheme = "http://";
  if (base_url.rfind("https://", 0) == 0) {
    return absl::InvalidArgumentError("https is not supported; use http:// (or a local proxy)");
  }
  if (base_url.rfind(kScheme, 0) != 0) {
    return absl::InvalidArgumentError("--base-url must start with http://: " + base_url);
  }
  std::string url = base_url.substr(kScheme.size());
  ParsedUrl out;
  size_t slash = url.find('/');
  std::string authority = url.substr(0, slash);
  out.prefix = slash == std::string::npos ? "" : url.substr(slash);
  while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  size_t colon = authority.rfind(':');
  out.host = authority.substr(0, colon);
  out.port = colon == std::string::npos ? "80" : authority.substr(colon + 1);
  if (out.host.empty()) return absl::InvalidArgumentError("--base-url has no host");
  return out;
}

}  // namespace

std::string BuildRequestBody(const HttpTargetOptions& options, const RequestSpec& spec) {
  json body = json::object();
  if (!options.model.empty()) body["model"] = options.model;
  if (options.chat) {
    body["messages"] = json::array({{{"role", "user"}, {"content", spec.prompt}}});
    body["max_completion_tokens"] = spec.output_len;
  } else {
    body["prompt"] = spec.prompt;
    body["max_tokens"] = spec.output_len;
  }
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  if (options.temperature) body["temperature"] = *options.temperature;
  if (!options.extra_body.empty()) {
    json extra = json::parse(options.extra_body, nullptr, false);
    if (extra.is_object()) body.merge_patch(extra);
  }
  return body.dump(-1, ' ', false, json::error_handler_t::replace);
}

// One pooled HTTP/1.1 connection. `deadline` closes the socket when a request times out.
struct HttpTarget::Connection {
  explicit Connection(asio::io_context& io) : socket(io), deadline(io) {}
  tcp::socket socket;
  beast::flat_buffer buffer;  // bytes read past the previous response stay here
  asio::steady_timer deadline;
  bool timed_out = false;
  bool cancelled = false;
};

struct HttpTarget::Impl {
  asio::io_context& io;
  const BenchClock* clock;
  HttpTargetOptions options;
  ParsedUrl url;
  tcp::resolver::results_type endpoints;
  std::string head;  // request line and fixed headers, up to Content-Length's value
  std::vector<std::shared_ptr<Connection>> idle;
  std::unordered_set<std::shared_ptr<Connection>> active;

  Impl(asio::io_context& io, const BenchClock* clock) : io(io), clock(clock) {}

  std::string Wire(const RequestSpec& spec) const {
    std::string body = BuildRequestBody(options, spec);
    return absl::StrCat(head, body.size(), "\r\n\r\n", body);
  }
  void Fail(RequestRecord* rec, const Connection& conn, FailureCause cause, std::string error) {
    rec->success = false;
    rec->cause = conn.cancelled   ? FailureCause::kCancelled
                 : conn.timed_out ? FailureCause::kTimeout
                                  : cause;
    rec->error = conn.cancelled   ? "cancelled"
                 : conn.timed_out ? "request timed out"
                                  : std::move(error);
  }
  void Arm(const std::shared_ptr<Connection>& conn) {
    conn->deadline.expires_after(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options.request_timeout_s)));
    conn->deadline.async_wait([conn](const beast::error_code& ec) {
      if (ec) return;
      conn->timed_out = true;
      beast::error_code ignored;
      conn->socket.close(ignored);
    });
  }
  void Release(const std::shared_ptr<Connection>& conn, bool reusable) {
    conn->deadline.cancel();
    active.erase(conn);
    if (reusable && !conn->cancelled && !conn->timed_out && conn->socket.is_open()) {
      idle.push_back(conn);
    } else {
      beast::error_code ignored;
      conn->socket.close(ignored);
    }
  }
  // Applies one SSE event to the record; `now` is when the bytes carrying it were read.
  void OnEvent(std::string_view payload, int64_t now, RequestRecord* rec,
               std::optional<std::string>* error) const {
    ChunkInfo chunk = ParseChunk(payload, options.keep_text);
    if (chunk.error) {
      *error = std::move(chunk.error);
      return;
    }
    if (chunk.is_token) {
      rec->chunk_ns.push_back(now);
      if (options.keep_text) rec->generated_text += chunk.text;
    }
    if (chunk.prompt_tokens >= 0) rec->prompt_len = chunk.prompt_tokens;
    if (chunk.completion_tokens >= 0) rec->output_tokens = chunk.completion_tokens;
    if (chunk.server_timing) rec->server_timing = chunk.server_timing;
  }
  asio::awaitable<bool> Attempt(std::shared_ptr<Connection> conn, bool reused,
                                const std::string& wire, const RequestSpec& spec,
                                RequestRecord* rec);
  asio::awaitable<bool> ReadStream(Connection& conn, const RequestSpec& spec,
                                   http::response_parser<http::buffer_body>& parser,
                                   RequestRecord* rec);
  asio::awaitable<void> ReadErrorBody(Connection& conn,
                                      http::response_parser<http::buffer_body>& parser,
                                      RequestRecord* rec);
};

HttpTarget::HttpTarget(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpTarget::~HttpTarget() = default;

absl::StatusOr<std::unique_ptr<HttpTarget>> HttpTarget::Create(asio::io_context& io,
                                                               const BenchClock* clock,
                                                               HttpTargetOptions options) {
  auto impl = std::make_unique<Impl>(io, clock);
  auto url = ParseBaseUrl(options.base_url);
  if (!url.ok()) return url.status();
  impl->url = *url;
  beast::error_code ec;
  tcp::resolver resolver(io);
  impl->endpoints = resolver.resolve(url->host, url->port, ec);
  if (ec)
    return absl::UnavailableError(absl::StrCat("cannot resolve ", url->host, ": ", ec.message()));
  std::string path = url->prefix + options.endpoint;
  impl->head = absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: ", url->host, ":", url->port,
                            "\r\nUser-Agent: tandem-loadgen\r\nAccept: text/event-stream\r\n"
                            "Content-Type: application/json\r\n");
  if (!options.api_key.empty()) {
    absl::StrAppend(&impl->head, "Authorization: Bearer ", options.api_key, "\r\n");
  }
  for (const std::string& h : options.headers) absl::StrAppend(&impl->head, h, "\r\n");
  absl::StrAppend(&impl->head, "Content-Length: ");
  impl->options = std::move(options);
  return std::unique_ptr<HttpTarget>(new HttpTarget(std::move(impl)));
}

void HttpTarget::CancelAll() {
  for (const auto& conn : impl_->active) {
    conn->cancelled = true;
    beast::error_code ignored;
    conn->socket.close(ignored);
  }
}

asio::awaitable<void> HttpTarget::Send(const RequestSpec& spec, RequestRecord* rec) {
  std::string wire = impl_->Wire(spec);
  rec->send_ns = impl_->clock->Now();
  // A pooled connection the server already closed fails before any response byte: retry once
  // on a fresh connection (Attempt returns true for "retry").
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::shared_ptr<Connection> conn;
    bool reused = attempt == 0 && !impl_->idle.empty();
    if (reused) {
      conn = std::move(impl_->idle.back());
      impl_->idle.pop_back();
    } else {
      conn = std::make_shared<Connection>(impl_->io);
    }
    if (!co_await impl_->Attempt(conn, reused, wire, spec, rec)) break;
  }
}

}  // namespace tandem::loadgen

namespace tandem::loadgen {

// Returns true when the attempt should be retried on a fresh connection.
asio::awaitable<bool> HttpTarget::Impl::Attempt(std::shared_ptr<Connection> conn, bool reused,
                                                const std::string& wire, const RequestSpec& spec,
                                                RequestRecord* rec) {
  beast::error_code ec;
  active.insert(conn);
  Arm(conn);
  if (!reused) {
    co_await asio::async_connect(conn->socket, endpoints, asio::redirect_error(kAwait, ec));
    if (ec) {
      Release(conn, false);
      Fail(rec, *conn, FailureCause::kConnect, "connect: " + ec.message());
      co_return false;
    }
    conn->socket.set_option(tcp::no_delay(true), ec);
  }
  co_await asio::async_write(conn->socket, asio::buffer(wire), asio::redirect_error(kAwait, ec));
  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  if (!ec) {
    co_await http::async_read_header(conn->socket, conn->buffer, parser,
                                     asio::redirect_error(kAwait, ec));
  }
  if (ec) {
    bool retry = reused && !conn->cancelled && !conn->timed_out;
    Release(conn, false);
    if (!retry) Fail(rec, *conn, FailureCause::kTransport, "HTTP: " + ec.message());
    co_return retry;
  }
  bool reusable = false;
  if (parser.get().result_int() != 200) {
    co_await ReadErrorBody(*conn, parser, rec);
  } else {
    reusable = co_await ReadStream(*conn, spec, parser, rec);
  }
  Release(conn, reusable);
  co_return false;
}

asio::awaitable<void> HttpTarget::Impl::ReadErrorBody(
    Connection& conn, http::response_parser<http::buffer_body>& parser, RequestRecord* rec) {
  std::string body;
  char tmp[kErrorBodyLimit];
  beast::error_code ec;
  while (!parser.is_done() && body.size() < kErrorBodyLimit) {
    parser.get().body().data = tmp;
    parser.get().body().size = sizeof(tmp);
    co_await http::async_read_some(conn.socket, conn.buffer, parser,
                                   asio::redirect_error(kAwait, ec));
    if (ec == http::error::need_buffer) ec = {};
    body.append(tmp, sizeof(tmp) - parser.get().body().size);
    if (ec) break;
  }
  std::string message = body.substr(0, 300);
  json j = json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string()) {
    message = j["error"]["message"].get<std::string>();
  }
  Fail(rec, conn, FailureCause::kHttpStatus,
       absl::StrCat("HTTP ", parser.get().result_int(), " ", std::string(parser.get().reason()),
                    ": ", message));
}

// Reads the SSE body; returns true when the connection may be reused.
asio::awaitable<bool> HttpTarget::Impl::ReadStream(Connection& conn, const RequestSpec& spec,
                                                   http::response_parser<http::buffer_body>& parser,
                                                   RequestRecord* rec) {
  SseParser sse;
  std::optional<std::string> stream_error;
  std::vector<char> tmp(kReadChunk);
  beast::error_code ec;
  while (!parser.is_done()) {
    parser.get().body().data = tmp.data();
    parser.get().body().size = tmp.size();
    co_await http::async_read_some(conn.socket, conn.buffer, parser,
                                   asio::redirect_error(kAwait, ec));
    int64_t now = clock->Now();
    if (ec == http::error::need_buffer) ec = {};
    size_t got = tmp.size() - parser.get().body().size;
    if (got > 0) {
      for (std::string_view event : sse.Feed(std::string_view(tmp.data(), got))) {
        OnEvent(event, now, rec, &stream_error);
      }
    }
    if (ec || stream_error) break;
  }
  if (!ec && !stream_error) {
    std::string last = sse.Finish();
    if (!last.empty()) OnEvent(last, clock->Now(), rec, &stream_error);
  }
  if (rec->output_tokens < 0) rec->output_tokens = static_cast<int>(rec->chunk_ns.size());
  if (rec->prompt_len < 0) rec->prompt_len = spec.prompt_len;
  if (stream_error) {
    Fail(rec, conn, FailureCause::kStreamError, *stream_error);
  } else if (ec) {
    Fail(rec, conn, FailureCause::kTransport, "stream: " + ec.message());
  } else if (rec->chunk_ns.empty()) {
    Fail(rec, conn, FailureCause::kNoToken, "Never received a valid chunk to calculate TTFT.");
  } else {
    rec->success = true;
  }
  co_return rec->success&& parser.is_done() && parser.keep_alive();
}

}  // namespace tandem::loadgen
