#include "loadgen/fake_server.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/check.h"

namespace tandem::loadgen {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

std::string FakeTokenText(int k) { return absl::StrCat(" w", k % 10); }

namespace {

constexpr auto kAwait = asio::use_awaitable;

FakeRequest ParseFakeRequest(const std::string& target, const std::string& body, int seq) {
  FakeRequest r;
  r.seq = seq;
  r.chat = target.find("chat") != std::string::npos;
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return r;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (j.contains(key) && j[key].is_number_integer()) r.max_tokens = j[key].get<int>();
  }
  if (j.contains("stream_options") && j["stream_options"].is_object()) {
    r.include_usage = j["stream_options"].value("include_usage", false);
  }
  if (j.contains("ignore_eos") && j["ignore_eos"].is_boolean()) r.ignore_eos = j["ignore_eos"];
  if (j.contains("prompt") && j["prompt"].is_string()) r.prompt = j["prompt"].get<std::string>();
  if (j.contains("messages") && j["messages"].is_array() && !j["messages"].empty()) {
    const json& last = j["messages"].back();
    if (last.is_object() && last.contains("content") && last["content"].is_string()) {
      r.prompt = last["content"].get<std::string>();
    }
  }
  return r;
}

int CountWords(const std::string& text) {
  int words = 0;
  bool in_word = false;
  for (char c : text) {
    bool space = c == ' ' || c == '\n' || c == '\t';
    if (!space && !in_word) ++words;
    in_word = !space;
  }
  return words;
}

// One SSE event framed as one HTTP/1.1 chunk.
void AppendEvent(std::string* out, std::string_view data) {
  size_t len = data.size() + 8;  // "data: " + data + "\n\n"
  absl::StrAppend(out, absl::Hex(len), "\r\ndata: ");
  out->append(data);
  out->append("\n\n\r\n");
}

std::string TokenChunk(const FakeRequest& req, int first_token, int count, bool last) {
  std::string text;
  for (int k = first_token; k < first_token + count; ++k) text += FakeTokenText(k);
  const char* finish = last ? "\"length\"" : "null";
  if (req.chat) {
    const char* role = first_token == 0 ? "\"role\":\"assistant\"," : "";
    return absl::StrFormat(
        R"({"id":"chatcmpl-%d","object":"chat.completion.chunk","created":0,"model":"fake",)"
        R"("choices":[{"index":0,"delta":{%s"content":"%s"},"logprobs":null,"finish_reason":%s}],)"
        R"("usage":null})",
        req.seq, role, text, finish);
  }
  return absl::StrFormat(
      R"({"id":"cmpl-%d","object":"text_completion","created":0,"model":"fake",)"
      R"("choices":[{"index":0,"text":"%s","logprobs":null,"finish_reason":%s}],"usage":null})",
      req.seq, text, finish);
}

std::string UsageChunk(const FakeRequest& req, const FakeResponse& script, int n) {
  json j = {{"id", absl::StrCat("cmpl-", req.seq)},
            {"object", "text_completion"},
            {"created", 0},
            {"model", "fake"},
            {"choices", json::array()}};
  int prompt_tokens = script.prompt_tokens >= 0 ? script.prompt_tokens : CountWords(req.prompt);
  j["usage"] = {{"prompt_tokens", prompt_tokens},
                {"completion_tokens", n},
                {"total_tokens", prompt_tokens + n}};
  if (script.server_timing) {
    json t = json::object();
    const ServerTiming& s = *script.server_timing;
    if (s.queue_ms) t["queue_ms"] = *s.queue_ms;
    if (s.prefill_ms) t["prefill_ms"] = *s.prefill_ms;
    if (s.kv_transfer_ms) t["kv_transfer_ms"] = *s.kv_transfer_ms;
    if (s.first_decode_ms) t["first_decode_ms"] = *s.first_decode_ms;
    j["server_timing"] = t;
  }
  return j.dump();
}

double GapMs(const FakeResponse& s, int k) {  // gap before token k+1
  if (s.itl_ms.empty()) return 0;
  return s.itl_ms[std::min<size_t>(k, s.itl_ms.size() - 1)];
}

Clock::duration Ms(double ms) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

}  // namespace

struct FakeServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  FakeScript script;
  std::atomic<int>* served = nullptr;
  absl::Mutex mu;
  int next_seq ABSL_GUARDED_BY(mu) = 0;
  std::vector<Clock::time_point> slot_free ABSL_GUARDED_BY(mu);  // empty: unlimited

  // Numbers the request and, with slots, books the earliest free slot (FIFO). Returns t_start.
  Clock::time_point Admit(Clock::time_point t_recv, const std::string& target,
                          const std::string& body, FakeRequest* req, FakeResponse* resp) {
    absl::MutexLock lock(&mu);
    *req = ParseFakeRequest(target, body, next_seq++);
    *resp = script ? script(*req) : FakeResponse();
    if (slot_free.empty() || resp->http_status != 200) return t_recv;
    auto slot = std::min_element(slot_free.begin(), slot_free.end());
    Clock::time_point start = std::max(t_recv, *slot);
    int n = resp->num_tokens >= 0 ? resp->num_tokens : req->max_tokens;
    Clock::duration busy = Ms(resp->ttft_ms);
    for (int k = 0; k + 1 < n; ++k) busy += Ms(GapMs(*resp, k));
    *slot = start + busy;
    return start;
  }

  asio::awaitable<bool> Stream(tcp::socket& sock, const FakeRequest& req, const FakeResponse& s,
                               Clock::time_point t_start);
  asio::awaitable<void> Serve(tcp::socket sock);
  asio::awaitable<void> Accept();
};

// Streams one scripted response; returns false when the connection must close.
asio::awaitable<bool> FakeServer::Impl::Stream(tcp::socket& sock, const FakeRequest& req,
                                               const FakeResponse& s, Clock::time_point t_start) {
  beast::error_code ec;
  std::string out =
      "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  int n = s.num_tokens >= 0 ? s.num_tokens : req.max_tokens;
  int per_chunk = std::max(1, s.tokens_per_chunk);
  asio::steady_timer timer(sock.get_executor());
  Clock::time_point due = t_start + Ms(s.ttft_ms);
  int sent = 0;
  while (sent < n && sent != s.error_after_tokens) {
    int count = std::min(per_chunk, n - sent);
    for (int k = sent + 1; k < sent + count; ++k) due += Ms(GapMs(s, k - 1));
    timer.expires_at(due);
    co_await timer.async_wait(asio::redirect_error(kAwait, ec));
    AppendEvent(&out, TokenChunk(req, sent, count, sent + count == n));
    sent += count;
    if (sent == s.drop_after_tokens) {
      co_await asio::async_write(sock, asio::buffer(out), asio::redirect_error(kAwait, ec));
      co_return false;
    }
    if (sent < n && sent != s.error_after_tokens) {
      co_await asio::async_write(sock, asio::buffer(out), asio::redirect_error(kAwait, ec));
      if (ec) co_return false;
      out.clear();
      due += Ms(GapMs(s, sent - 1));
    }
  }
  if (sent == s.error_after_tokens) {
    AppendEvent(&out, R"({"error":{"message":"scripted failure","type":"InternalServerError",)"
                      R"("code":500}})");
  } else if (req.include_usage) {
    AppendEvent(&out, UsageChunk(req, s, n));
  }
  AppendEvent(&out, "[DONE]");
  out += "0\r\n\r\n";
  co_await asio::async_write(sock, asio::buffer(out), asio::redirect_error(kAwait, ec));
  co_return !ec;
}

// GET /v1/models (one model, "fake"), /health; anything else is 404.
asio::awaitable<void> WriteGet(tcp::socket& sock, const std::string& target,
                               beast::error_code& ec) {
  std::string body = R"({"error":{"message":"not found","type":"NotFound","code":404}})";
  int status = 404;
  if (target == "/v1/models") {
    body = R"({"object":"list","data":[{"id":"fake","object":"model","owned_by":"tandem"}]})";
    status = 200;
  } else if (target == "/health") {
    body = "";
    status = 200;
  }
  std::string out = absl::StrFormat(
      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status,
      status == 200 ? "OK" : "Not Found", body.size(), body);
  co_await asio::async_write(sock, asio::buffer(out), asio::redirect_error(kAwait, ec));
}

asio::awaitable<void> FakeServer::Impl::Serve(tcp::socket sock) {
  sock.set_option(tcp::no_delay(true));
  beast::flat_buffer buf;
  for (;;) {
    http::request<http::string_body> request;
    beast::error_code ec;
    co_await http::async_read(sock, buf, request, asio::redirect_error(kAwait, ec));
    if (ec) break;
    bool keep = request.keep_alive();
    if (request.method() == http::verb::get) {
      co_await WriteGet(sock, std::string(request.target()), ec);
      if (ec || !keep) break;
      continue;
    }
    FakeRequest req;
    FakeResponse resp;
    Clock::time_point start =
        Admit(Clock::now(), std::string(request.target()), request.body(), &req, &resp);
    served->fetch_add(1);
    if (resp.http_status != 200) {
      std::string body =
          absl::StrFormat(R"({"error":{"message":"scripted status %d","type":"Error","code":%d}})",
                          resp.http_status, resp.http_status);
      std::string out = absl::StrFormat(
          "HTTP/1.1 %d Error\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
          resp.http_status, body.size(), body);
      co_await asio::async_write(sock, asio::buffer(out), asio::redirect_error(kAwait, ec));
    } else if (!co_await Stream(sock, req, resp, start)) {
      break;
    }
    if (ec || !keep) break;
  }
  beast::error_code ignored;
  sock.shutdown(tcp::socket::shutdown_both, ignored);
}

asio::awaitable<void> FakeServer::Impl::Accept() {
  for (;;) {
    beast::error_code ec;
    tcp::socket sock = co_await acceptor.async_accept(asio::redirect_error(kAwait, ec));
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
    if (ec) continue;
    asio::co_spawn(acceptor.get_executor(), Serve(std::move(sock)), asio::detached);
  }
}

FakeServer::FakeServer(FakeServerOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

FakeServer::~FakeServer() { Stop(); }

absl::StatusOr<int> FakeServer::Start() {
  CHECK(threads_.empty()) << "FakeServer started twice";
  impl_->script = options_.script;
  impl_->served = &served_;
  {
    absl::MutexLock lock(&impl_->mu);
    impl_->slot_free.assign(std::max(0, options_.slots), Clock::time_point());
  }
  beast::error_code ec;
  auto address = asio::ip::make_address(options_.host, ec);
  if (ec) return absl::InvalidArgumentError("bad host: " + options_.host);
  tcp::endpoint endpoint(address, static_cast<uint16_t>(options_.port));
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::UnavailableError("fake server cannot listen: " + ec.message());
  int port = impl_->acceptor.local_endpoint().port();
  asio::co_spawn(impl_->io, impl_->Accept(), asio::detached);
  for (int i = 0; i < std::max(1, options_.threads); ++i) {
    threads_.emplace_back([this] { impl_->io.run(); });
  }
  return port;
}

void FakeServer::Stop() {
  if (threads_.empty()) return;
  impl_->io.stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

}  // namespace tandem::loadgen
