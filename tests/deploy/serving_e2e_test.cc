// End to end on loopback with real processes: router -> prefill -> KV transfer -> decode.
// Greedy output equals the single-engine reference token for token (2P + 2D and mixed); 200
// concurrent streams of mixed lengths all finish and leave no page or queue entry behind; a
// client that disconnects mid-stream (or right after its first token, while its KV is in
// flight) has its pages freed on both workers within a second; a stop string straddling the
// prefill worker's first token and the decode worker's second cuts the text there and frees the
// pages on both workers.
#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace tandem::e2e {
namespace {

constexpr char k2P2D[] = R"(
engine: {page_size: 16, num_pages: 4096}
groups:
  - {role: prefill, count: 2}
  - {role: decode, count: 2}
)";

constexpr char kMixed[] = R"(
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: mixed, count: 1}
)";

void ExpectSameAnswers(launcher::Cluster& cluster) {
  // Lengths around page boundaries; each prompt twice so both workers of a role serve some.
  for (int n : {1, 15, 16, 17, 40, 100}) {
    GenerateArgs args;
    args.prompt = Prompt(n, static_cast<uint32_t>(n));
    args.max_tokens = 12;
    const std::vector<int32_t> want = ReferenceGreedy(TinyModelDir(), args);
    ASSERT_EQ(want.size(), 12u);
    for (int rep = 0; rep < 2; ++rep) {
      StreamResult got = Generate(cluster.router().grpc_address, args);
      ASSERT_TRUE(got.status.ok()) << got.status.error_message();
      EXPECT_EQ(got.tokens, want) << "prompt length " << n << " rep " << rep;
      EXPECT_EQ(got.finish, tandem::v1::FINISH_REASON_LENGTH);
      EXPECT_GE(got.num_messages, 2);  // streamed, not one blob
    }
  }
  std::string why;
  EXPECT_TRUE(WaitForIdle(cluster, absl::Seconds(2), &why)) << why;
}

TEST(ServingE2E, DisaggregatedGreedyMatchesSingleEngine2P2D) {
  std::unique_ptr<launcher::Cluster> cluster = StartCluster(k2P2D);
  ASSERT_NE(cluster, nullptr);
  ExpectSameAnswers(*cluster);
  // Both decode workers took part.
  for (launcher::Process* w : cluster->workers()) {
    EXPECT_GT(GetLoad(*cluster, w->grpc_address).num_prompt_tokens_total(), 0) << w->name;
  }
  EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
}

TEST(ServingE2E, MixedGreedyMatchesSingleEngine) {
  std::unique_ptr<launcher::Cluster> cluster = StartCluster(kMixed);
  ASSERT_NE(cluster, nullptr);
  ExpectSameAnswers(*cluster);
  EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
}

TEST(ServingE2E, TwoHundredConcurrentStreamsFinishAndLeaveNothingBehind) {
  std::unique_ptr<launcher::Cluster> cluster = StartCluster(k2P2D);
  ASSERT_NE(cluster, nullptr);
  constexpr int kRequests = 200;
  std::atomic<int> finished{0};
  std::vector<std::string> failures(kRequests);
  std::vector<std::thread> clients;
  for (int i = 0; i < kRequests; ++i) {
    clients.emplace_back([&, i] {
      GenerateArgs args;
      args.prompt = Prompt(1 + (i * 37) % 150, 1000 + i);
      args.max_tokens = 1 + (i * 13) % 24;
      StreamResult r = Generate(cluster->router().grpc_address, args);
      if (r.status.ok() && r.finish == tandem::v1::FINISH_REASON_LENGTH &&
          static_cast<int>(r.tokens.size()) == args.max_tokens) {
        finished++;
      } else {
        failures[i] = r.status.error_message() + " tokens " + std::to_string(r.tokens.size());
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(finished.load(), kRequests);
  for (int i = 0; i < kRequests; ++i) EXPECT_TRUE(failures[i].empty()) << i << ": " << failures[i];
  std::string why;
  EXPECT_TRUE(WaitForIdle(*cluster, absl::Seconds(2), &why)) << why;
  EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
}

TEST(ServingE2E, ClientDisconnectFreesPagesOnBothWorkersWithinOneSecond) {
  std::unique_ptr<launcher::Cluster> cluster = StartCluster(R"(
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
)");
  ASSERT_NE(cluster, nullptr);
  // Mid-stream: after a few decode tokens.
  GenerateArgs args;
  args.prompt = Prompt(90, 5);
  args.max_tokens = 1000;
  args.on_message = [](const StreamResult& r) { return r.tokens.size() < 4; };
  StreamResult r = Generate(cluster->router().grpc_address, args);
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
  absl::Time cancelled = absl::Now();
  std::string why;
  EXPECT_TRUE(WaitForIdle(*cluster, absl::Seconds(1), &why)) << why;
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(1));
  // Right after the first token: the KV is being pushed to decode at that moment.
  for (int i = 0; i < 5; ++i) {
    args.prompt = Prompt(300, 50 + i);
    args.on_message = [](const StreamResult&) { return false; };
    r = Generate(cluster->router().grpc_address, args);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_TRUE(WaitForIdle(*cluster, absl::Seconds(1), &why)) << i << ": " << why;
  }
  // The server keeps serving.
  args.on_message = nullptr;
  args.max_tokens = 5;
  r = Generate(cluster->router().grpc_address, args);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens.size(), 5u);
  const absl::Status shutdown = cluster->Shutdown(absl::Seconds(20));
  EXPECT_TRUE(shutdown.ok()) << shutdown;
}

// The first token comes from the prefill worker, the rest from the decode worker: a stop string
// made of the first token's last character and the second token's first one is found across
// that boundary, the text ends before it, and the decode worker is stopped and holds no page.
TEST(ServingE2E, StopStringAcrossTheFirstTokenOfADisaggregatedRequest) {
  std::unique_ptr<launcher::Cluster> cluster = StartCluster(R"(
engine: {page_size: 16, num_pages: 512}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
)");
  ASSERT_NE(cluster, nullptr);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::Load(TinyModelDir());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // A prompt whose first two tokens each have text, with no earlier occurrence of the stop.
  GenerateArgs args;
  args.max_tokens = 12;
  std::string stop, want;
  std::vector<int32_t> free_tokens;
  for (uint32_t seed = 1; seed < 200 && stop.empty(); ++seed) {
    args.prompt = Prompt(20, seed);
    StreamResult free_running = Generate(cluster->router().grpc_address, args);
    ASSERT_TRUE(free_running.status.ok()) << free_running.status.error_message();
    ASSERT_EQ(free_running.tokens.size(), 12u);
    const std::string first = (*tokenizer)->Decode({free_running.tokens[0]}, true);
    const std::string two =
        (*tokenizer)->Decode({free_running.tokens[0], free_running.tokens[1]}, true);
    if (first.empty() || !utf8::IsValid(first) || two.size() <= first.size() ||
        two.compare(0, first.size(), first) != 0 || !utf8::IsValid(two.substr(first.size()))) {
      continue;
    }
    const std::vector<std::string_view> a = utf8::SplitChars(first);
    const std::vector<std::string_view> b = utf8::SplitChars(two.substr(first.size()));
    const std::string candidate = std::string(a.back()) + std::string(b.front());
    const size_t at = free_running.text.find(candidate);
    if (at == first.size() - a.back().size()) {
      stop = candidate;
      want = free_running.text.substr(0, at);
      free_tokens = free_running.tokens;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no prompt gave two tokens with text";
  args.stop = {stop};
  StreamResult got = Generate(cluster->router().grpc_address, args);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.finish, tandem::v1::FINISH_REASON_STOP);
  EXPECT_EQ(got.text, want) << "stop '" << stop << "'";
  EXPECT_EQ(got.tokens, std::vector<int32_t>(free_tokens.begin(), free_tokens.begin() + 2));
  std::string why;
  EXPECT_TRUE(WaitForIdle(*cluster, absl::Seconds(1), &why)) << why;
  EXPECT_TRUE(cluster->Shutdown(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace tandem::e2e
