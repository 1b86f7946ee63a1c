// A bounded HTTP fuzz pass against a live router (fake workers behind it): 20,000 inputs, from a
// fixed seed, that mutate valid requests — JSON bodies (bytes flipped, inserted, cut; values
// swapped for extreme or wrongly typed ones; deep nesting), headers (lengths, duplicates,
// bad Content-Length), methods and paths. Every input must get an answer within 5 s (no hang),
// no answer may be a 5xx, every non-2xx answer must carry the OpenAI error envelope, and the
// router must answer /health at the end. The inputs go over keep-alive connections; a new one
// is opened where the router closed the last (as it does after a malformed request).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tests/router/http_test_client.h"
#include "tests/router/router_test_env.h"

namespace tandem::router::testing {
namespace {

using nlohmann::json;

constexpr int kInputs = 20000;

const std::vector<std::string>& SeedBodies() {
  static const std::vector<std::string> seeds = {
      R"({"model": "tiny", "prompt": "hi", "max_tokens": 3})",
      R"({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0, "top_p": 0.5, "top_k": 4,
          "seed": 7, "stop": ["x"], "stop_token_ids": [257], "stream": true,
          "stream_options": {"include_usage": true}})",
      R"({"messages": [{"role": "user", "content": "hey"}], "max_tokens": 2})",
      R"({"messages": [{"role": "system", "content": [{"type": "text", "text": "a"}]},
                       {"role": "user", "content": "b"}], "max_completion_tokens": 2,
          "stream": true})",
      R"({"prompt": "abc", "add_special_tokens": false})",
      R"({"tokens": [104, 105]})",
  };
  return seeds;
}

const std::vector<json>& OddValues() {
  static const std::vector<json> values = {
      nullptr,
      true,
      false,
      0,
      -1,
      1,
      9223372036854775807LL,
      -9223372036854775807LL - 1,
      18446744073709551615ULL,
      1e308,
      -1e308,
      0.5,
      1e-320,
      "",
      "x",
      std::string(3000, 'a'),
      "\xc3\xa9",
      json::array(),
      json::array({1, 2}),
      json::array({"a", "b"}),
      json::object(),
      json::object({{"a", 1}}),
      json::array({json::array({1}), json::array({2})}),
      json::array({json::object({{"role", "user"}, {"content", "x"}})})};
  return values;
}

const char* const kKeys[] = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                             "temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids",
                             "stream", "stream_options", "n",
                             // Not "logprobs" nor "best_of" (ranked by logprobs): the fake
                             // workers send none (a real worker that did not: rightly a 500).
                             "echo", "suffix", "min_tokens", "ignore_eos", "presence_penalty",
                             "tokens", "add_special_tokens", "skip_special_tokens"};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  int Uniform(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  std::string Body() {
    const std::string& seed = SeedBodies()[Uniform(SeedBodies().size())];
    switch (Uniform(4)) {
      case 0:
        return Bytes(seed);
      case 1:
      case 2:
        return Structured(seed);
      default:
        return Nested();
    }
  }

 private:
  // Byte-level: flip, insert, delete, cut, duplicate a range.
  std::string Bytes(std::string s) {
    for (int n = 1 + Uniform(4); n > 0 && !s.empty(); --n) {
      const size_t at = Uniform(s.size());
      switch (Uniform(5)) {
        case 0:
          s[at] = static_cast<char>(Uniform(256));
          break;
        case 1:
          s.insert(at, 1, "{}[]\",:\\0-e.\xff\x80 "[Uniform(17)]);
          break;
        case 2:
          s.erase(at, 1 + Uniform(8));
          break;
        case 3:
          s.resize(at);
          break;
        default:
          s.insert(at, s.substr(at, Uniform(32)));
      }
    }
    return s;
  }
  // JSON-level: a field set to an odd value, removed, or added.
  std::string Structured(const std::string& seed) {
    json j = json::parse(seed);
    for (int n = 1 + Uniform(3); n > 0; --n) {
      const std::string key = kKeys[Uniform(std::size(kKeys))];
      if (Uniform(5) == 0) {
        j.erase(key);
      } else {
        j[key] = OddValues()[Uniform(OddValues().size())];
      }
    }
    if (j.contains("messages") && j["messages"].is_array() && !j["messages"].empty() &&
        j["messages"][0].is_object() && Uniform(2) == 0) {
      j["messages"][0][Uniform(2) ? "role" : "content"] = OddValues()[Uniform(OddValues().size())];
    }
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  std::string Nested() {
    const int depth = 1 + Uniform(3000);
    return std::string(depth, '[') + std::string(Uniform(2) ? depth : depth / 2, ']');
  }

  std::mt19937_64 rng_;
};

struct Input {
  std::string bytes;
  bool head = false;
};

Input MakeInput(Mutator& m) {
  static const char* const kPaths[] = {"/v1/completions",
                                       "/v1/chat/completions",
                                       "/tokenize",
                                       "/detokenize",
                                       "/v1/models",
                                       "/health",
                                       "/metrics",
                                       "/nope",
                                       "/v1/",
                                       "/v1/completions?x=1&y"};
  static const char* const kMethods[] = {"GET", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"};
  Input input;
  // Mostly POST to the four POST routes (the bodies matter there), else anything.
  const bool post = m.Uniform(5) != 0;
  std::string method = post ? "POST" : kMethods[m.Uniform(std::size(kMethods))];
  std::string path = kPaths[m.Uniform(post ? 4 : std::size(kPaths))];
  std::string body = m.Body();
  std::string headers = "Host: localhost\r\nContent-Type: application/json\r\n";
  switch (m.Uniform(12)) {
    case 0:  // a header that is long, odd, or repeated
      headers += absl::StrCat("X-Fuzz: ", std::string(m.Uniform(6000), 'h'), "\r\n");
      break;
    case 1:
      headers += "Authorization: Bearer \r\nAuthorization: bearer x\r\n";
      break;
    case 2:  // a Content-Length smaller than the body: the rest reads as the next request
      headers += absl::StrCat("Content-Length: ", body.size() / 2, "\r\n");
      body.resize(body.size() / 2);
      break;
    case 3:
      method = "G\x01T";
      break;
    case 4:
      path = absl::StrCat("/", std::string(m.Uniform(9000), 'p'));
      break;
    case 5:
      headers += "Transfer-Encoding: chunked\r\n";
      body =
          body.empty() ? "0\r\n\r\n" : absl::StrFormat("%x\r\n%s\r\n0\r\n\r\n", body.size(), body);
      break;
    default:
      break;
  }
  if (headers.find("Content-Length") == std::string::npos &&
      headers.find("Transfer-Encoding") == std::string::npos) {
    absl::StrAppend(&headers, "Content-Length: ", body.size(), "\r\n");
  }
  input.head = method == "HEAD";
  input.bytes = absl::StrCat(method, " ", path, " HTTP/1.1\r\n", headers, "\r\n", body);
  return input;
}

// The OpenAI error envelope: {"error": {"message": string, "type": string, "param", "code"}}.
bool IsErrorEnvelope(const std::string& body, int status) {
  json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) return false;
  const json& e = j["error"];
  return e.contains("message") && e["message"].is_string() && e.contains("type") &&
         e["type"].is_string() && e.contains("param") && e.contains("code") && e["code"] == status;
}

TEST(HttpFuzzTest, TwentyThousandMutatedRequestsGetClientErrorsInTheEnvelope) {
  RouterConfig config = TestRouterConfig();
  config.max_body_bytes = 1 << 20;
  RouterTestEnv env(config);
  ASSERT_TRUE(env.status().ok());
  ASSERT_NE(env.AddWorker(Role("p", tandem::v1::WORKER_ROLE_PREFILL)), nullptr);
  ASSERT_NE(env.AddWorker(Role("d", tandem::v1::WORKER_ROLE_DECODE)), nullptr);
  ASSERT_TRUE(RouterTestEnv::WaitFor([&] { return env.server().service().HasUsableWorkers(); }));
  Mutator mutator(20261202);
  HttpConnection c;
  ASSERT_TRUE(c.Connect(env.http_port()));
  std::map<int, int> statuses;
  int reconnects = 0;
  for (int i = 0; i < kInputs; ++i) {
    const Input input = MakeInput(mutator);
    if (!c.Send(input.bytes)) {  // closed by the router after the last answer: a new one
      ASSERT_TRUE(c.Connect(env.http_port()));
      ++reconnects;
      ASSERT_TRUE(c.Send(input.bytes));
    }
    std::optional<HttpResult> r = c.Read(input.head);
    if (!r.has_value()) {
      // No answer: only acceptable if the router closed the connection first (a request it
      // could not frame may leave nothing to answer); it must not leave us hanging.
      ASSERT_TRUE(c.ClosedWithin(absl::Seconds(1))) << "input " << i << " hangs:\n"
                                                    << input.bytes.substr(0, 400);
      ASSERT_TRUE(c.Connect(env.http_port()));
      ++reconnects;
      ++statuses[0];
      std::cout << "closed without an answer: input " << i << ": "
                << absl::CEscape(input.bytes.substr(0, 200)) << "\n";
      continue;
    }
    ++statuses[r->status];
    ASSERT_LT(r->status, 500) << "input " << i << ":\n"
                              << input.bytes.substr(0, 300) << "\n...\n"
                              << input.bytes.substr(std::max<size_t>(input.bytes.size(), 300) - 300)
                              << "\n→ " << r->body.substr(0, 400);
    if (r->status >= 300 && !input.head) {
      ASSERT_TRUE(IsErrorEnvelope(r->body, r->status))
          << "input " << i << ":\n"
          << input.bytes.substr(0, 400) << "\n→ " << r->status << " " << r->body.substr(0, 400);
    }
    // Pipelined leftovers (a short Content-Length) are answered too; read and check them.
    while (!c.pending().empty()) {
      std::optional<HttpResult> extra = c.Read(false, absl::Milliseconds(200));
      if (!extra.has_value()) break;
      ASSERT_LT(extra->status, 500);
    }
    if (absl::StrContains(r->Header("connection"), "close")) {
      ASSERT_TRUE(c.Connect(env.http_port()));
      ++reconnects;
    }
  }
  std::string summary;
  for (const auto& [status, n] : statuses) absl::StrAppend(&summary, status, ": ", n, "  ");
  std::cout << "statuses of " << kInputs << " inputs: " << summary << "(" << reconnects
            << " new connections)\n";
  EXPECT_EQ(statuses[0], 0) << "inputs left without an answer";
  EXPECT_GT(statuses[400], kInputs / 4);  // the mutations reach validation
  EXPECT_GT(statuses[200], 100);          // and some still are valid requests
  HttpConnection health;
  ASSERT_TRUE(health.Connect(env.http_port()));
  ASSERT_TRUE(health.Send(KeepAliveRequest("GET", "/health")));
  std::optional<HttpResult> ok = health.Read();
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 200);
  EXPECT_TRUE(RouterTestEnv::WaitFor([&] { return env.server().service().num_live() == 0; }));
}

}  // namespace
}  // namespace tandem::router::testing
