// The router's HTTP API end to end against fake workers (in-process gRPC servers speaking
// worker.proto): responses, streaming format, errors, cancellation, worker failure and load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "absl/strings/str_format.h"
#include "tests/router/http_test_client.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

using nlohmann::json;
using tandem::v1::WORKER_ROLE_DECODE;
using tandem::v1::WORKER_ROLE_MIXED;
using tandem::v1::WORKER_ROLE_PREFILL;
using ::testing::HasSubstr;

class RouterHttpTest : public ::testing::Test {
 protected:
  void StartPair(int token_delay_ms = 0) {
    prefill_ = env_.AddWorker(Role("prefill-0", WORKER_ROLE_PREFILL, token_delay_ms));
    decode_ = env_.AddWorker(Role("decode-0", WORKER_ROLE_DECODE, token_delay_ms));
    ASSERT_NE(prefill_, nullptr) << env_.last_error();
    ASSERT_NE(decode_, nullptr) << env_.last_error();
  }
  int port() { return env_.http_port(); }
  // All requests over: no live flow, no reservation held anywhere.
  void ExpectIdle() {
    EXPECT_TRUE(RouterTestEnv::WaitFor([&] { return env_.server().service().num_live() == 0; }));
    if (decode_ != nullptr) {
      EXPECT_TRUE(RouterTestEnv::WaitFor([&] { return decode_->reservations_held() == 0; }));
    }
  }

  RouterTestEnv env_;
  FakeWorker* prefill_ = nullptr;
  FakeWorker* decode_ = nullptr;
};

// The prefill worker's prefix-cache hit reaches usage.prompt_tokens_details.cached_tokens.
TEST_F(RouterHttpTest, CachedTokensReachTheUsage) {
  FakeWorkerOptions prefill = Role("prefill-0", WORKER_ROLE_PREFILL);
  prefill.cached_tokens = 2;
  prefill_ = env_.AddWorker(prefill);
  decode_ = env_.AddWorker(Role("decode-0", WORKER_ROLE_DECODE));
  ASSERT_NE(prefill_, nullptr) << env_.last_error();
  ASSERT_NE(decode_, nullptr) << env_.last_error();
  HttpResult r = Post(port(), "/v1/chat/completions",
                      R"({"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                          "max_tokens": 3})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  ExpectIdle();
}

TEST_F(RouterHttpTest, NonStreamingCompletionThroughPrefillAndDecode) {
  StartPair();
  HttpResult r = Post(port(), "/v1/completions",
                      R"({"model": "tiny", "prompt": "hi", "max_tokens": 5, "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.Json();
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_THAT(body["id"].get<std::string>(), ::testing::StartsWith("cmpl-"));
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["choices"][0]["text"], "hello");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);  // BOS + 'h' + 'i'
  EXPECT_EQ(body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(body["usage"]["total_tokens"], 8);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(prefill_->requests_served(), 1);
  EXPECT_EQ(decode_->requests_served(), 1);
  ExpectIdle();
}

TEST_F(RouterHttpTest, StreamingChatWithUsage) {
  StartPair();
  HttpResult r = Post(port(), "/v1/chat/completions",
                      R"({"messages": [{"role": "user", "content": "hey"}], "max_tokens": 9,
                          "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.Header("content-type"), HasSubstr("text/event-stream"));
  std::vector<std::string> events = SseData(r.body);
  ASSERT_GE(events.size(), 4u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string content;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json chunk = json::parse(events[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_TRUE(chunk["usage"].is_null());
    if (i == 0) {
      EXPECT_EQ(chunk["choices"][0]["delta"]["role"], "assistant");
    }
    content += chunk["choices"][0]["delta"].value("content", "");
    if (i + 3 == events.size()) {
      EXPECT_EQ(chunk["choices"][0]["finish_reason"], "length");
    } else {
      EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
    }
  }
  EXPECT_EQ(content, "hello wor");
  json usage_chunk = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage_chunk["choices"].empty());
  EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 9);
  // The server's TTFT phases ride along (the fake workers report these two).
  EXPECT_DOUBLE_EQ(usage_chunk["timings"]["kv_transfer_s"].get<double>(), 0.002);
  EXPECT_DOUBLE_EQ(usage_chunk["timings"]["first_decode_step_s"].get<double>(), 0.003);
  EXPECT_GT(usage_chunk["timings"]["ttft_s"].get<double>(), 0.0);
  ExpectIdle();
}

TEST_F(RouterHttpTest, MixedWorkerServesAlone) {
  decode_ = nullptr;
  ASSERT_NE(env_.AddWorker(Role("mixed-0", WORKER_ROLE_MIXED)), nullptr);
  HttpResult r =
      Post(port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 4, "stream": true})");
  ASSERT_EQ(r.status, 200);
  std::string text;
  for (const std::string& e : SseData(r.body)) {
    if (e != "[DONE]") text += json::parse(e)["choices"][0].value("text", "");
  }
  EXPECT_EQ(text, "hell");
  ExpectIdle();
}

TEST_F(RouterHttpTest, StopStringAndEos) {
  StartPair();
  HttpResult r =
      Post(port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 12, "stop": ["wor"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["choices"][0]["text"], "hello ");
  EXPECT_EQ(r.Json()["choices"][0]["finish_reason"], "stop");
  ExpectIdle();
}

// The fake prefill worker samples "h", the decode worker continues "ello...": the stop string
// "he" spans the two. The text ends before it, the usage counts the two tokens, and the decode
// worker is stopped at once (not after its 200 tokens).
TEST_F(RouterHttpTest, StopStringAcrossTheFirstTokenStopsTheDecodeWorker) {
  StartPair(/*token_delay_ms=*/20);
  HttpResult r =
      Post(port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 200, "stop": ["he"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Json()["choices"][0]["text"], "");
  EXPECT_EQ(r.Json()["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r.Json()["usage"]["completion_tokens"], 2);
  EXPECT_TRUE(RouterTestEnv::WaitFor(
      [&] { return decode_->aborts() > 0 || decode_->cancelled_streams() > 0; }, absl::Seconds(1)));
  EXPECT_TRUE(
      RouterTestEnv::WaitFor([&] { return decode_->streams_open() == 0; }, absl::Seconds(1)));
  ExpectIdle();
}

TEST_F(RouterHttpTest, EndpointsAndMetrics) {
  EXPECT_EQ(HttpCall(port(), "GET", "/health").status, 200);
  HttpResult ready = HttpCall(port(), "GET", "/ready");
  EXPECT_EQ(ready.status, 503);  // no worker yet
  StartPair();
  EXPECT_TRUE(
      RouterTestEnv::WaitFor([&] { return HttpCall(port(), "GET", "/ready").status == 200; }));
  HttpResult models = HttpCall(port(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(models.Json()["data"][0]["id"], "tiny");
  EXPECT_EQ(models.Json()["data"][0]["max_model_len"], 256);
  HttpResult tok = Post(port(), "/tokenize", R"({"prompt": "ab"})");
  ASSERT_EQ(tok.status, 200);
  EXPECT_EQ(tok.Json()["tokens"], json::parse("[256, 97, 98]"));
  EXPECT_EQ(tok.Json()["count"], 3);
  HttpResult detok = Post(port(), "/detokenize", R"({"tokens": [104, 105]})");
  ASSERT_EQ(detok.status, 200);
  EXPECT_EQ(detok.Json()["prompt"], "hi");
  EXPECT_EQ(HttpCall(port(), "GET", "/version").Json()["version"], "0.1.0");
  ASSERT_EQ(Post(port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 3})").status, 200);
  HttpResult metrics = HttpCall(port(), "GET", "/metrics");
  ASSERT_EQ(metrics.status, 200);
  EXPECT_THAT(metrics.body,
              HasSubstr("tandem:time_to_first_token_seconds_count{model_name=\"tiny\"} 1"));
  EXPECT_THAT(metrics.body, HasSubstr("tandem:request_success_total{model_name=\"tiny\","
                                      "finished_reason=\"length\"} 1"));
  EXPECT_THAT(metrics.body, HasSubstr("tandem:generation_tokens_total{model_name=\"tiny\"} 3"));
  EXPECT_THAT(metrics.body, HasSubstr("tandem:prompt_tokens_total{model_name=\"tiny\"} 2"));
  EXPECT_THAT(metrics.body,
              HasSubstr("tandem_kv_transfer_time_seconds_count{model_name=\"tiny\"} 1"));
  EXPECT_THAT(metrics.body, HasSubstr("tandem_router_workers{model_name=\"tiny\",role=\"decode\","
                                      "state=\"healthy\"} 1"));
}

TEST_F(RouterHttpTest, BadInputGetsEnvelopeAndServerKeepsServing) {
  StartPair();
  struct Case {
    std::string path, body;
    int status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{oops", 400, "not valid JSON"},
      {"/v1/completions", R"({"prompt": 1.5})", 400, "'prompt' must be"},
      {"/v1/completions", R"({"max_tokens": 3})", 400, "required"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "at least 1"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 1000})", 400,
       "maximum context length is 256"},
      {"/v1/completions", R"({"prompt": ")" + std::string(300, 'a') + R"("})", 400,
       "maximum context length"},
      {"/v1/completions", R"({"prompt": "x", "model": "nope"})", 404, "does not exist"},
      {"/v1/completions", "{\"prompt\": \"\xFF\"}", 400, "UTF-8"},
      {"/v1/completions", R"({"prompt": "x", "temperature": 9})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "x", "top_p": 0})", 400, "top_p"},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400, "messages"},
      {"/v1/completions", R"({"prompt": "x", "n": 0})", 400, "n must be"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}],
          "tools": [{"type": "function", "function": {"name": "f"}}]})",
       400, "not supported"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_object"}})",
       400, "response_format"},
      {"/v1/nothing", "{}", 404, "no route"},
  };
  for (const Case& c : cases) {
    HttpResult r = Post(port(), c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " → " << r.body;
    json body = r.Json();
    ASSERT_TRUE(body.contains("error")) << r.body;
    EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr(c.message)) << c.body;
    EXPECT_EQ(body["error"]["code"], c.status);
    EXPECT_TRUE(body["error"].contains("type") && body["error"].contains("param"));
  }
  EXPECT_EQ(HttpCall(port(), "GET", "/v1/completions").status, 405);
  EXPECT_EQ(Post(port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 2})").status, 200);
  HttpResult unknown = HttpCall(port(), "GET", "/v1/models/nope");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_THAT(unknown.body, HasSubstr("The model `nope` does not exist"));
  const std::string served = HttpCall(port(), "GET", "/v1/models").Json()["data"][0]["id"];
  HttpResult model = HttpCall(port(), "GET", "/v1/models/" + served);
  EXPECT_EQ(model.status, 200) << model.body;
  EXPECT_EQ(model.Json()["id"], served);
  EXPECT_EQ(model.Json()["object"], "model");
  EXPECT_EQ(HttpCall(port(), "GET",
                     "/v1/models/%" + absl::StrFormat("%02X", served[0]) + served.substr(1))
                .status,
            200);  // percent-encoded
  EXPECT_EQ(HttpCall(port(), "GET", "/v1/models/" + served + "%2").status, 404);
}

TEST(RouterHttpLimitsTest, OversizedBodyIs413AndApiKeyIsChecked) {
  RouterConfig config = TestRouterConfig();
  config.max_body_bytes = 1024;
  config.api_key = "sekrit";
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok()) << env.status();
  ASSERT_NE(env.AddWorker(Role("m", WORKER_ROLE_MIXED)), nullptr);
  const std::string auth = "Authorization: Bearer sekrit\r\n";
  HttpResult big = Post(env.http_port(), "/v1/completions",
                        R"({"prompt": ")" + std::string(4000, 'a') + R"("})", auth);
  EXPECT_EQ(big.status, 413);
  EXPECT_THAT(big.body, HasSubstr("too large"));
  HttpResult no_key = Post(env.http_port(), "/v1/completions", R"({"prompt": "x"})");
  EXPECT_EQ(no_key.status, 401);
  EXPECT_EQ(no_key.Json()["error"]["code"], 401);
  EXPECT_EQ(Post(env.http_port(), "/v1/completions", R"({"prompt": "x"})",
                 "Authorization: Bearer wrong\r\n")
                .status,
            401);
  EXPECT_EQ(Post(env.http_port(), "/tokenize", R"({"prompt": "x"})").status, 401);
  EXPECT_EQ(HttpCall(env.http_port(), "GET", "/health").status, 200);   // open
  EXPECT_EQ(HttpCall(env.http_port(), "GET", "/metrics").status, 200);  // open
  EXPECT_EQ(
      Post(env.http_port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 2})", auth).status,
      200);
}

TEST(RouterHttpLimitsTest, QueueFullIs429WithRetryAfterAndNoWorkerIs503) {
  RouterConfig config = TestRouterConfig();
  config.max_running = 1;
  config.max_waiting = 1;
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok()) << env.status();
  HttpResult none = Post(env.http_port(), "/v1/completions", R"({"prompt": "x"})");
  EXPECT_EQ(none.status, 503);
  EXPECT_EQ(none.Header("retry-after"), "1");
  ASSERT_NE(env.AddWorker(Role("m", WORKER_ROLE_MIXED, /*token_delay_ms=*/20)), nullptr);
  const std::string slow = R"({"prompt": "x", "max_tokens": 20, "stream": true})";
  StreamingCall running(env.http_port(), "/v1/completions", slow);
  ASSERT_TRUE(running.ReadUntil("data:", 3000));
  StreamingCall queued(env.http_port(), "/v1/completions", slow);
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return env.server().admission().waiting() == 1; }));
  HttpResult rejected = Post(env.http_port(), "/v1/completions", R"({"prompt": "x"})");
  EXPECT_EQ(rejected.status, 429);
  EXPECT_EQ(rejected.Header("retry-after"), "1");
  EXPECT_THAT(rejected.body, HasSubstr("queue is full"));
  // The queued request runs once the first finishes.
  EXPECT_TRUE(queued.ReadUntil("[DONE]", 5000)) << queued.received();
}

TEST_F(RouterHttpTest, ClientDisconnectAbortsOnBothWorkers) {
  StartPair(/*token_delay_ms=*/30);
  StreamingCall call(port(), "/v1/completions",
                     R"({"prompt": "x", "max_tokens": 200, "stream": true})");
  ASSERT_TRUE(call.ReadUntil("\"text\":\"e\"", 5000)) << call.received();  // a decode token
  call.Close();
  const absl::Time closed = absl::Now();
  EXPECT_TRUE(RouterTestEnv::WaitFor(
      [&] { return decode_->aborts() > 0 || decode_->cancelled_streams() > 0; }, absl::Seconds(1)));
  EXPECT_TRUE(
      RouterTestEnv::WaitFor([&] { return decode_->streams_open() == 0; }, absl::Seconds(1)));
  EXPECT_LT(absl::Now() - closed, absl::Seconds(1));
  ExpectIdle();
  EXPECT_LT(decode_->requests_served(), 2);
}

TEST_F(RouterHttpTest, NonStreamingClientDisconnectAbortsToo) {
  StartPair(/*token_delay_ms=*/30);
  StreamingCall call(port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 200})");
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return decode_->streams_open() == 1; }));
  call.Close();
  EXPECT_TRUE(
      RouterTestEnv::WaitFor([&] { return decode_->streams_open() == 0; }, absl::Seconds(1)));
  EXPECT_TRUE(decode_->aborts() > 0 || decode_->cancelled_streams() > 0);
  ExpectIdle();
}

TEST_F(RouterHttpTest, CancelDuringPrefillReleasesTheReservation) {
  StartPair(/*token_delay_ms=*/300);
  StreamingCall call(port(), "/v1/completions",
                     R"({"prompt": "x", "max_tokens": 5, "stream": true})");
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return prefill_->streams_open() == 1; }));
  EXPECT_EQ(decode_->reservations_held(), 1);
  call.Close();
  EXPECT_TRUE(
      RouterTestEnv::WaitFor([&] { return decode_->reservations_held() == 0; }, absl::Seconds(1)));
  EXPECT_TRUE(RouterTestEnv::WaitFor([&] { return prefill_->aborts() == 1; }, absl::Seconds(1)));
  ExpectIdle();
}

// A client cancel while the just-admitted request's ReservePages is in flight: the abort the
// ending flow sends overtakes the reservation (finds nothing); the reservation lands after it
// and must be released as soon as ReservePages answers, not left to the decode worker's TTL.
TEST_F(RouterHttpTest, CancelRacingReservePagesReleasesTheLateReservation) {
  FakeWorkerOptions decode = Role("decode-0", WORKER_ROLE_DECODE);
  decode.reserve_delay_ms = 300;
  prefill_ = env_.AddWorker(Role("prefill-0", WORKER_ROLE_PREFILL));
  decode_ = env_.AddWorker(decode);
  ASSERT_NE(prefill_, nullptr) << env_.last_error();
  ASSERT_NE(decode_, nullptr) << env_.last_error();
  StreamingCall call(port(), "/v1/completions",
                     R"({"prompt": "x", "max_tokens": 5, "stream": true})");
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return decode_->reservations_started() == 1; }));
  call.Close();
  // The first abort arrives while ReservePages still waits: it finds no reservation.
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return decode_->aborts() >= 1; }, absl::Seconds(1)));
  EXPECT_EQ(decode_->request_ids().size(), 0u);
  // Then the reservation is made (300 ms after the call began) and released right after.
  ASSERT_TRUE(
      RouterTestEnv::WaitFor([&] { return decode_->request_ids().size() == 1; }, absl::Seconds(2)));
  EXPECT_TRUE(
      RouterTestEnv::WaitFor([&] { return decode_->reservations_held() == 0; }, absl::Seconds(1)))
      << "the late reservation stayed on the decode worker";
  EXPECT_GE(decode_->aborts(), 2);
  EXPECT_TRUE(prefill_->request_ids().empty());  // never prefilled
  ExpectIdle();
}

TEST_F(RouterHttpTest, DecodeWorkerDyingMidStreamEndsWithInBandErrorAndTrafficMovesOn) {
  StartPair(/*token_delay_ms=*/20);
  FakeWorker* spare = env_.AddWorker(Role("decode-1", WORKER_ROLE_DECODE));
  ASSERT_NE(spare, nullptr);
  // Make decode-0 the busier-looking one last: route the stream to whichever the policy picks.
  StreamingCall call(port(), "/v1/completions",
                     R"({"prompt": "x", "max_tokens": 200, "stream": true})");
  ASSERT_TRUE(call.ReadUntil("\"text\":\"e\"", 5000)) << call.received();
  FakeWorker* victim = decode_->streams_open() > 0 ? decode_ : spare;
  FakeWorker* survivor = victim == decode_ ? spare : decode_;
  const absl::Time killed = absl::Now();
  victim->Kill();
  ASSERT_TRUE(call.ReadUntil("[DONE]", 5000)) << call.received();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(3));
  EXPECT_THAT(call.received(), HasSubstr("\"error\""));
  EXPECT_THAT(call.received(), HasSubstr("\"code\":503"));
  // The dead worker is out of the rotation: new requests succeed on the survivor.
  for (int i = 0; i < 3; ++i) {
    HttpResult r = Post(port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 3})");
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_GE(survivor->requests_served(), 3);
  decode_ = survivor;
  ExpectIdle();
}

TEST_F(RouterHttpTest, ChoicesOfNAndBatchedPrompts) {
  StartPair();
  HttpResult r = Post(port(), "/v1/completions", R"({"prompt": "hi", "max_tokens": 5, "n": 3})");
  ASSERT_EQ(r.status, 200) << r.body;
  json body = r.Json();
  ASSERT_EQ(body["choices"].size(), 3u) << r.body;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(body["choices"][i]["index"], i);
    EXPECT_EQ(body["choices"][i]["text"], "hello");
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);  // one prompt, counted once
  EXPECT_EQ(body["usage"]["completion_tokens"], 15);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  r = Post(port(), "/v1/completions", R"({"prompt": ["hi", "x"], "max_tokens": 2, "echo": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  body = r.Json();
  ASSERT_EQ(body["choices"].size(), 2u) << r.body;
  EXPECT_EQ(body["choices"][0]["text"], "hihe");  // echo: the prompt text, then the output
  EXPECT_EQ(body["choices"][1]["text"], "xhe");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3 + 2);
  // Streamed chat, n = 2: each choice's chunks carry its index; one [DONE] after both.
  r = Post(port(), "/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "q"}], "max_tokens": 5, "n": 2,
               "stream": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> events = SseData(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back(), "[DONE]");
  std::map<int, std::string> content;
  std::map<int, int> finishes, roles;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json choice = json::parse(events[i])["choices"][0];
    const int index = choice["index"];
    content[index] += choice["delta"].value("content", "");
    if (choice["delta"].contains("role")) roles[index]++;
    if (!choice["finish_reason"].is_null()) finishes[index]++;
  }
  EXPECT_EQ(content, (std::map<int, std::string>{{0, "hello"}, {1, "hello"}}));
  EXPECT_EQ(finishes, (std::map<int, int>{{0, 1}, {1, 1}}));
  EXPECT_EQ(roles, (std::map<int, int>{{0, 1}, {1, 1}}));
  ExpectIdle();
}

TEST_F(RouterHttpTest, ClientDisconnectCancelsEverySequenceOfARequest) {
  StartPair(/*token_delay_ms=*/20);
  StreamingCall call(port(), "/v1/completions",
                     R"({"prompt": "x", "max_tokens": 200, "n": 3, "stream": true})");
  // One request to the workers: the siblings ride on the request's stream.
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return decode_->streams_open() == 1; }));
  ASSERT_TRUE(call.ReadUntil("\"index\":0", 5000)) << call.received();
  call.Close();
  EXPECT_TRUE(
      RouterTestEnv::WaitFor([&] { return decode_->streams_open() == 0; }, absl::Seconds(1)));
  ExpectIdle();
}

TEST_F(RouterHttpTest, APromptFailingEndsTheResponseAndCancelsTheOthers) {
  StartPair(/*token_delay_ms=*/20);
  FakeWorker* other = env_.AddWorker(Role("decode-1", WORKER_ROLE_DECODE, 20));
  ASSERT_NE(other, nullptr);
  StreamingCall call(port(), "/v1/completions",
                     R"({"prompt": ["x", "y"], "max_tokens": 200, "stream": true})");
  // The two prompts went to different decode workers (least outstanding first).
  ASSERT_TRUE(RouterTestEnv::WaitFor(
      [&] { return decode_->streams_open() == 1 && other->streams_open() == 1; }));
  decode_->Kill();
  ASSERT_TRUE(call.ReadUntil("[DONE]", 5000)) << call.received();
  EXPECT_THAT(call.received(), HasSubstr(R"("code":503)"));
  // The other prompt's request on the live worker is cancelled, long before its 200 tokens.
  EXPECT_TRUE(RouterTestEnv::WaitFor([&] { return other->streams_open() == 0; }, absl::Seconds(1)));
  decode_ = other;
  ExpectIdle();
}

TEST_F(RouterHttpTest, ReservationRefusedMovesToAnotherDecodeWorker) {
  FakeWorkerOptions full = Role("decode-full", WORKER_ROLE_DECODE);
  full.refuse_reservations = true;
  ASSERT_NE(env_.AddWorker(full), nullptr);
  StartPair();
  for (int i = 0; i < 4; ++i) {
    HttpResult r = Post(port(), "/v1/completions", R"({"prompt": "x", "max_tokens": 2})");
    EXPECT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(decode_->requests_served(), 4);
}

TEST_F(RouterHttpTest, TwoHundredConcurrentStreams) {
  StartPair(/*token_delay_ms=*/2);
  constexpr int kStreams = 200;
  std::vector<std::thread> clients;
  std::vector<int> ok(kStreams, 0);
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      const int max_tokens = 2 + i % 7;
      HttpResult r = Post(port(), "/v1/completions",
                          absl::StrCat(R"({"prompt": "p)", i, R"(", "max_tokens": )", max_tokens,
                                       R"(, "stream": true})"));
      std::vector<std::string> events = SseData(r.body);
      std::string text;
      for (const std::string& e : events) {
        if (e != "[DONE]") text += json::parse(e)["choices"][0].value("text", "");
      }
      ok[i] = r.status == 200 && !events.empty() && events.back() == "[DONE]" &&
              text == std::string("hello world! ").substr(0, max_tokens);
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(std::count(ok.begin(), ok.end(), 1), kStreams);
  ExpectIdle();
}

TEST(RouterRegistrationTest, MismatchedProtocolIsRefused) {
  RouterTestEnv env;
  ASSERT_TRUE(env.status().ok());
  FakeWorkerOptions old = Role("old", WORKER_ROLE_MIXED);
  old.protocol_version = 99;
  EXPECT_EQ(env.AddWorker(old), nullptr);
  EXPECT_EQ(env.last_error().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(env.last_error().message()), HasSubstr("protocol version 99"));
}

}  // namespace
}  // namespace tandem::router::testing
