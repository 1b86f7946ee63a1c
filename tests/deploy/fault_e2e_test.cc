// Worker failures with real processes: a decode worker killed mid-request, a prefill worker
// killed mid-prefill. Their clients get a terminal error (not a hang) within a bounded time,
// the router stops routing to the dead worker, new requests succeed on the others, and a
// restarted worker registers again and takes traffic. No pages leak on the survivors. And a
// port picked for a process but taken before it binds it: the launcher starts it again on new
// ports (the router and a worker), or fails with the reason when the layout fixed that port.
#include <signal.h>

#include <atomic>
#include <thread>

#include "base/listen_error.h"
#include "comm/socket_io.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

// A terminal error must reach the client this fast after its worker dies.
constexpr absl::Duration kErrorBound = absl::Seconds(5);

// The prefill workers compute 16 prompt tokens per step, so a long prompt is mid-prefill for
// a while (many steps) and a kill reliably lands during it.
constexpr char kLayout[] = R"(
engine: {page_size: 16, num_pages: 1024}
groups:
  - {role: prefill, count: 2, args: [--max-num-batched-tokens, "16"]}
  - {role: decode, count: 2}
)";

struct Outcome {
  StreamResult result;
  absl::Time end;
};

// Starts `n` long generations in threads; each records its outcome and counts itself in
// `streaming` once it has received a few tokens.
std::vector<std::thread> StartLong(launcher::Cluster& c, int n, int prompt_len, int max_tokens,
                                   std::vector<Outcome>* out, std::atomic<int>* streaming) {
  out->resize(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&c, out, i, prompt_len, max_tokens, streaming] {
      GenerateArgs args;
      args.prompt = Prompt(prompt_len, 7000 + i);
      args.max_tokens = max_tokens;
      bool counted = false;
      args.on_message = [&](const StreamResult& r) {
        if (!counted && r.tokens.size() >= 3) {
          counted = true;
          (*streaming)++;
        }
        return true;
      };
      (*out)[i].result = Generate(c.router().grpc_address, args);
      (*out)[i].end = absl::Now();
    });
  }
  return threads;
}

void ExpectNewRequestsSucceed(launcher::Cluster& c, int n) {
  for (int i = 0; i < n; ++i) {
    GenerateArgs args;
    args.prompt = Prompt(20 + i, 9000 + i);
    args.max_tokens = 6;
    StreamResult r = Generate(c.router().grpc_address, args);
    EXPECT_TRUE(r.status.ok()) << i << ": " << r.status.error_message();
    EXPECT_EQ(r.tokens.size(), 6u);
  }
}

// Sends requests until `worker` has served some (its generated-token count grows).
bool TakesTraffic(launcher::Cluster& c, const std::string& worker_grpc, bool decode) {
  auto count = [&] {
    const tandem::v1::LoadReport l = GetLoad(c, worker_grpc);
    return decode ? l.num_generated_tokens_total() : l.num_prompt_tokens_total();
  };
  const int64_t before = count();
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  for (int i = 0; absl::Now() < deadline; ++i) {
    GenerateArgs args;
    args.prompt = Prompt(10, 500 + i);
    args.max_tokens = 4;
    Generate(c.router().grpc_address, args);  // may still land on the old, dead epoch
    if (count() > before) return true;
  }
  return false;
}

void KillAndCheck(launcher::Cluster& c, const std::string& victim_name, bool decode) {
  launcher::Process* victim = c.Find(victim_name);
  ASSERT_NE(victim, nullptr);
  std::vector<Outcome> outcomes;
  std::atomic<int> streaming{0};
  // Decode: short prompts, long outputs; kill once every stream is mid-decode. Prefill: long
  // prompts computed 16 tokens per step; kill while they are still being prefilled.
  const int max_tokens = decode ? 1500 : 400;
  constexpr int kStreams = 6;
  std::vector<std::thread> threads =
      StartLong(c, kStreams, decode ? 20 : 1500, max_tokens, &outcomes, &streaming);
  if (decode) {
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (streaming.load() < kStreams && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  } else {
    // Kill as soon as the victim's engine holds prompts being prefilled.
    const absl::Time give_up = absl::Now() + absl::Seconds(20);
    while (absl::Now() < give_up) {
      const tandem::v1::LoadReport l = GetLoad(c, victim->grpc_address);
      if (l.num_running() + l.num_waiting() > 0) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  victim->child->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  for (std::thread& t : threads) t.join();
  int errors = 0;
  for (const Outcome& o : outcomes) {
    if (!o.result.status.ok()) {
      ++errors;
      EXPECT_EQ(o.result.status.error_code(), grpc::StatusCode::UNAVAILABLE)
          << o.result.status.error_message();
      EXPECT_LT(o.end - killed, kErrorBound);
    } else {
      EXPECT_EQ(static_cast<int>(o.result.tokens.size()), max_tokens);  // never truncated
    }
  }
  EXPECT_GT(errors, 0) << "the kill hit no request";
  ExpectNewRequestsSucceed(c, 8);
  std::string why;
  EXPECT_TRUE(WaitForIdle(c, absl::Seconds(3), &why)) << why;
  // The worker comes back on the same address, registers again and serves.
  ASSERT_TRUE(c.Restart(victim_name).ok());
  ASSERT_TRUE(c.WaitForWorkers({{"prefill", 2}, {"decode", 2}}, absl::Seconds(30)).ok());
  EXPECT_TRUE(TakesTraffic(c, victim->grpc_address, decode));
}

TEST(FaultE2E, DecodeWorkerKilledMidRequest) {
  std::unique_ptr<launcher::Cluster> c = StartCluster(kLayout);
  ASSERT_NE(c, nullptr);
  KillAndCheck(*c, "decode-0", /*decode=*/true);
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

TEST(FaultE2E, PrefillWorkerKilledMidPrefill) {
  std::unique_ptr<launcher::Cluster> c = StartCluster(kLayout);
  ASSERT_NE(c, nullptr);
  KillAndCheck(*c, "prefill-0", /*decode=*/false);
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

TEST(FaultE2E, PortTakenBeforeTheProcessBindsItIsPickedAgain) {
  // A port held open here, handed out as the router's HTTP port (the first pick) and as the
  // first worker's gRPC port (the first pick after the router's second start).
  absl::StatusOr<Socket> held = Listen("127.0.0.1", 0);
  ASSERT_TRUE(held.ok()) << held.status();
  const int taken = *LocalPort(*held);
  int picks = 0;
  std::unique_ptr<launcher::Cluster> c = StartCluster(
      R"(
engine: {page_size: 16, num_pages: 256}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
)",
      [&](launcher::Layout&, launcher::ClusterOptions& options) {
        options.pick_port = [&](const std::string& host) -> absl::StatusOr<int> {
          const int n = picks++;
          if (n == 0 || n == 6) return taken;
          return launcher::PickFreePort(host);
        };
      });
  ASSERT_NE(c, nullptr);
  // Router: http (taken), grpc, control plane (mutual TLS, on by default); again: http, grpc,
  // control plane. prefill-0: grpc (taken), metrics; then decode-0: grpc, metrics, kv; prefill-0
  // again: grpc, metrics.
  EXPECT_EQ(picks, 13);
  EXPECT_EQ(c->router().launches, 2);
  launcher::Process* prefill = c->Find("prefill-0");
  launcher::Process* decode = c->Find("decode-0");
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  EXPECT_EQ(prefill->launches, 2);
  EXPECT_EQ(decode->launches, 1);
  EXPECT_NE(prefill->grpc_address, "127.0.0.1:" + std::to_string(taken));
  GenerateArgs args;
  args.prompt = Prompt(20, 3);
  args.max_tokens = 4;
  StreamResult r = Generate(c->router().grpc_address, args);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, ReferenceGreedy(TinyModelDir(), args));
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());

  // A router port fixed by the layout is not moved (its gRPC port, picked, is: it is started a
  // few times), and the start fails and says why.
  absl::StatusOr<std::unique_ptr<launcher::Cluster>> fixed = TryStartCluster(
      "groups:\n  - {role: mixed, count: 1}\n",
      [&](launcher::Layout& layout, launcher::ClusterOptions&) { layout.router_port = taken; });
  ASSERT_FALSE(fixed.ok());
  EXPECT_NE(
      fixed.status().message().find(absl::StrCat("router exited with code ", kExitCannotListen)),
      absl::string_view::npos)
      << fixed.status();
  EXPECT_NE(fixed.status().message().find("cannot listen"), absl::string_view::npos)
      << fixed.status();
}

}  // namespace
}  // namespace tandem::e2e
