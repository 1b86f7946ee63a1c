// The fault matrix's router-side phases ([hardening], issue 27; the worker phases are in
// fault_matrix_e2e_test and fault_transfer_e2e_test), with real processes on loopback and the
// tiny model, the router admitting one request at a time (--max-running 1) and queueing two:
// - a fault while requests wait in the router's admission queue: the router or the decode
//   worker is killed, or the clients disconnect;
// - overload: more HTTP clients than admission holds: the excess gets 429 with Retry-After in
//   the OpenAI error envelope at once, nobody hangs, and afterwards the queue is empty and the
//   cluster serves;
// - the router frozen (SIGSTOP) under load: clients time out cleanly at their own deadline, and
//   after SIGCONT the router aborts their requests on the workers (no page stays held) and serves
//   again; with many long requests on the decode worker, the worker's keepalive pings notice the
//   frozen router and free every page while it is still frozen.
// Every client gets one terminal answer within a bound, no worker holds a reserved or owned page
// afterwards, and service resumes. Each cell prints its figures ("matrix: ...").
#include <signal.h>

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/deploy/fault_clients.h"
#include "tests/http/http_connection.h"

namespace tandem::e2e {
namespace {

constexpr absl::Duration kAnswerBound = absl::Seconds(5);
constexpr absl::Duration kResumeBound = absl::Seconds(20);
constexpr absl::Duration kIdleBound = absl::Seconds(5);
constexpr int kMaxWaiting = 2;
// How long after the freeze the workers may hold the frozen router's pages: its one running
// request must end on its own (it is already past the clients' 4 s deadline then).
constexpr absl::Duration kFrozenPeerBound = absl::Seconds(10);
const std::vector<std::pair<std::string, int>> kWorkers = {{"prefill", 1}, {"decode", 1}};

constexpr char kLayout[] = R"(
engine: {page_size: 16, num_pages: 1024}
router: {args: [--max-running, "1", --max-waiting, "2"]}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
)";

// Client 0 runs a long generation; clients 1 .. kMaxWaiting wait behind it in the router.
GenerateArgs LongRequest(int i) {
  GenerateArgs args;
  args.prompt = Prompt(16, 5200 + i);
  args.max_tokens = 1500;
  args.deadline = absl::Seconds(60);
  return args;
}

// Waits until client 0 streams and the others wait for admission; false if that never happens.
bool QueueFilled(const launcher::Cluster& c, FaultClients& clients) {
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (absl::Now() < give_up) {
    if (clients.NumWithTokens(2) >= 1 &&
        RouterMetric(c, "tandem_router_requests_waiting") == kMaxWaiting) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

void ExpectRecovered(launcher::Cluster& c, const std::string& name, absl::Time fault_at,
                     absl::Duration worst, const std::string& answers) {
  const absl::Duration resumed = ServeAgain(c, fault_at, kWorkers, kResumeBound);
  EXPECT_LT(resumed, kResumeBound);
  std::string why;
  EXPECT_TRUE(WaitForIdle(c, kIdleBound, &why)) << why;
  // The router's own books are empty too: nothing running, nothing queued.
  EXPECT_EQ(RouterMetric(c, "tandem_router_requests_waiting"), 0);
  EXPECT_EQ(RouterMetric(c, "tandem_router_requests_running"), 0);
  const absl::Duration idle = absl::Now() - fault_at;
  std::cout << absl::StrFormat(
      "matrix: %-38s last terminal answer %6.0f ms, serving again %6.0f ms, "
      "no page held %6.0f ms after the fault (%s)\n",
      name, absl::ToDoubleMilliseconds(worst), absl::ToDoubleMilliseconds(resumed),
      absl::ToDoubleMilliseconds(idle), answers);
}

enum class QueuedFault { kKillRouter, kKillDecode, kCancel };

void RunQueuedCell(launcher::Cluster& c, QueuedFault fault) {
  const std::string name = fault == QueuedFault::kKillRouter   ? "SIGKILL router while queued"
                           : fault == QueuedFault::kKillDecode ? "SIGKILL decode-0 while queued"
                                                               : "cancel while queued";
  SCOPED_TRACE(name);
  FaultClients clients(c.router().grpc_address, 1 + kMaxWaiting, LongRequest);
  ASSERT_TRUE(QueueFilled(c, clients)) << "requests never queued in the router";
  const absl::Time fault_at = absl::Now();
  std::vector<grpc::StatusCode> codes = {grpc::StatusCode::UNAVAILABLE};
  switch (fault) {
    case QueuedFault::kKillRouter:
      c.router().child->Signal(SIGKILL);
      break;
    case QueuedFault::kKillDecode:
      // The running request fails; the queued ones are admitted in turn and find no decode
      // worker (503), unless the restarted one is back by then.
      c.Find("decode-0")->child->Signal(SIGKILL);
      break;
    case QueuedFault::kCancel:
      // The queued clients leave first (they must leave the queue, not be admitted), then the
      // running one.
      for (int i = clients.size() - 1; i >= 0; --i) clients.Cancel(i);
      codes = {grpc::StatusCode::CANCELLED};
      break;
  }
  if (fault == QueuedFault::kKillDecode) {
    // Supervise while the queued requests drain, so a restarted decode worker may serve them.
    const absl::Time until = absl::Now() + kAnswerBound;
    while (absl::Now() < until) {
      bool all_done = true;
      for (int i = 0; i < clients.size(); ++i) {
        absl::MutexLock l(&clients[i].mu);
        all_done &= clients[i].done;
      }
      if (all_done) break;
      EXPECT_TRUE(c.Supervise().ok());
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  clients.Join();
  ExpectTerminalAnswers(clients, codes, /*complete_ok=*/fault == QueuedFault::kKillDecode);
  const absl::Duration worst = clients.Worst(fault_at);
  EXPECT_LT(worst, kAnswerBound);
  // A cancel too: the slot freed by one cancelled request admits the next, which is cancelled
  // while its ReservePages is in flight; that late reservation is released when ReservePages
  // answers (router_http_test's CancelRacingReservePagesReleasesTheLateReservation), not left to
  // the decode worker's 30 s TTL.
  ExpectRecovered(c, name, fault_at, worst, Answers(clients));
}

TEST(FaultAdmissionE2E, FaultsWhileQueuedInTheRouter) {
  std::unique_ptr<launcher::Cluster> c = StartCluster(kLayout);
  ASSERT_NE(c, nullptr);
  for (QueuedFault f : {QueuedFault::kCancel, QueuedFault::kKillDecode, QueuedFault::kKillRouter}) {
    RunQueuedCell(*c, f);
    if (HasFatalFailure()) break;
  }
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

int PortOf(const std::string& host_port) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(host_port.substr(host_port.rfind(':') + 1), &port)) << host_port;
  return port;
}

// More HTTP clients than admission holds (1 running + 2 waiting): the rest are refused at once
// with 429, Retry-After and the OpenAI error envelope; every client gets its answer (each read
// has a timeout: a hang fails); afterwards nothing is queued or held and the cluster serves.
TEST(FaultAdmissionE2E, OverloadIsAnswered429InTheEnvelopeAndRecovers) {
  std::unique_ptr<launcher::Cluster> c = StartCluster(kLayout);
  ASSERT_NE(c, nullptr);
  const int port = PortOf(c->http_address());
  constexpr int kClients = 8;
  constexpr int kTokens = 300;
  const std::string body = nlohmann::json({{"model", "tiny"},
                                           {"prompt", "overload"},
                                           {"max_tokens", kTokens},
                                           {"ignore_eos", true},
                                           {"temperature", 0}})
                               .dump();
  std::vector<::tandem::testing::HttpConnection> connections(kClients);
  for (auto& conn : connections) ASSERT_TRUE(conn.Connect(port));
  const absl::Time start = absl::Now();
  for (auto& conn : connections) {
    ASSERT_TRUE(conn.Send(::tandem::testing::KeepAliveRequest("POST", "/v1/completions", body)));
  }
  int ok = 0, refused = 0;
  for (int i = 0; i < kClients; ++i) {
    // The two waiters wait behind one or two whole generations: 60 s is far beyond that.
    std::optional<::tandem::testing::HttpResult> r = connections[i].Read(false, absl::Seconds(60));
    ASSERT_TRUE(r.has_value()) << "client " << i << " got no answer";
    if (r->status == 200) {
      ++ok;
      const nlohmann::json j = r->Json();
      EXPECT_EQ(j["usage"]["completion_tokens"], kTokens) << r->body;
      continue;
    }
    ASSERT_EQ(r->status, 429) << r->body;
    ++refused;
    int retry_after = 0;
    EXPECT_TRUE(absl::SimpleAtoi(r->Header("retry-after"), &retry_after)) << r->headers;
    EXPECT_GE(retry_after, 1);
    const nlohmann::json j = r->Json();
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    EXPECT_TRUE(j["error"]["message"].is_string()) << r->body;
    EXPECT_TRUE(j["error"]["type"].is_string()) << r->body;
    EXPECT_TRUE(j["error"].contains("code")) << r->body;
  }
  // At most 1 + kMaxWaiting are held at once; the others were refused (all arrived before the
  // first generation could end, unless the machine is very slow: then more are served).
  EXPECT_GE(ok, 1);
  EXPECT_EQ(ok + refused, kClients);
  EXPECT_GE(refused, 1);
  const absl::Duration worst = absl::Now() - start;
  std::cout << "matrix: overload (" << kClients << " clients, 1 running + " << kMaxWaiting
            << " queued): " << ok << " served, " << refused << " refused with 429, all answered in "
            << absl::ToDoubleMilliseconds(worst) << " ms\n";
  // Refused at the door (the queue was full), each counted once.
  EXPECT_EQ(RouterMetric(*c, "tandem_requests_rejected_total", "reason=\"queue_full\""), refused);
  ExpectRecovered(*c, "overload", start, worst, absl::StrCat("200 x", ok, ", 429 x", refused));
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

// The router frozen with requests decoding and queued: each client times out cleanly at its own
// deadline (DEADLINE_EXCEEDED, nothing after it); after SIGCONT the router notices the
// abandoned calls and aborts them on the workers (no page stays held) and serves again.
TEST(FaultAdmissionE2E, AFrozenRouterLetsClientsTimeOutAndRecoversOnSigcont) {
  std::unique_ptr<launcher::Cluster> c = StartCluster(kLayout);
  ASSERT_NE(c, nullptr);
  constexpr absl::Duration kDeadline = absl::Seconds(4);
  const absl::Time start = absl::Now();
  FaultClients clients(c->router().grpc_address, 1 + kMaxWaiting, [&](int i) {
    GenerateArgs args = LongRequest(i);
    args.deadline = kDeadline;
    return args;
  });
  ASSERT_TRUE(QueueFilled(*c, clients)) << "requests never queued in the router";
  const launcher::Process& router = c->router();
  router.child->Signal(SIGSTOP);
  const absl::Time fault_at = absl::Now();
  clients.Join();
  ExpectTerminalAnswers(clients, {grpc::StatusCode::DEADLINE_EXCEEDED}, /*complete_ok=*/false);
  // Each at its deadline (start + 4 s), give or take scheduling.
  EXPECT_LT(clients.Worst(start), kDeadline + absl::Seconds(2));
  const absl::Duration worst = clients.Worst(fault_at);
  // The workers do not need the router to free their pages: the running request ends on its
  // own (the tiny model's 1500 tokens take about a second) or is cancelled by the decode
  // worker's keepalive, and the queued ones never reached them. (Requests that outlive the
  // freeze: AFrozenRoutersRequestsLoseTheirPagesOnTheWorkers.)
  std::string why;
  const bool idle_while_frozen = WaitForIdle(*c, kFrozenPeerBound, &why);
  const absl::Duration idle_frozen = absl::Now() - fault_at;
  router.child->Signal(SIGCONT);
  EXPECT_TRUE(idle_while_frozen) << why;
  std::cout << "matrix: SIGSTOP router: the workers held no page "
            << absl::ToDoubleMilliseconds(idle_frozen)
            << " ms after the freeze (router still frozen)\n";
  ExpectRecovered(*c, "SIGSTOP router while decoding/queued", fault_at, worst, Answers(clients));
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

// The router frozen (SIGSTOP) while the decode worker holds far more work than kFrozenRouterBound
// of decoding: one sequence at a time (--max-num-seqs 1), kLongClients requests of 2000 tokens
// each (the tiny model decodes about 1500 tokens a second alone: at least 14 s of work). The
// workers' servers ping the router (rpc/cluster_auth.h ApplyServerKeepalive): the frozen peer's
// connection is closed, its calls are cancelled and their requests aborted, so every page is
// free within kFrozenRouterBound while the router is still frozen (before the pings, the pages
// were held until the last request had decoded its 2000 tokens). After SIGCONT each client gets
// one terminal answer and the cluster serves again.
TEST(FaultAdmissionE2E, AFrozenRoutersRequestsLoseTheirPagesOnTheWorkers) {
  constexpr int kLongClients = 12;
  constexpr int kLongTokens = 2000;
  constexpr absl::Duration kFrozenRouterBound = absl::Seconds(10);
  std::unique_ptr<launcher::Cluster> c = StartCluster(R"(
engine: {page_size: 16, num_pages: 2048}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1, args: [--max-num-seqs, "1"]}
)");
  ASSERT_NE(c, nullptr);
  launcher::Process* decode = c->Find("decode-0");
  ASSERT_NE(decode, nullptr);
  FaultClients clients(c->router().grpc_address, kLongClients, [](int i) {
    GenerateArgs args;
    args.prompt = Prompt(16, 5300 + i);
    args.max_tokens = kLongTokens;
    args.deadline = absl::Seconds(90);
    return args;
  });
  // Every request is on the decode worker (one decoding, the others queued with their KV) and
  // the first has streamed a few tokens.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  tandem::v1::LoadReport l;
  while (absl::Now() < give_up) {
    l = GetLoad(*c, decode->grpc_address);
    if (l.num_running() + l.num_waiting() == kLongClients && clients.NumWithTokens(3) >= 1) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_LT(absl::Now(), give_up) << "the requests never reached the decode worker together: "
                                  << l.ShortDebugString();
  ASSERT_EQ(clients.NumWithTokens(kLongTokens), 0) << "a request finished before the freeze";
  const launcher::Process& router = c->router();
  router.child->Signal(SIGSTOP);
  const absl::Time fault_at = absl::Now();
  std::string why;
  const bool idle_while_frozen = WaitForIdle(*c, kFrozenRouterBound, &why);
  const absl::Duration idle_frozen = absl::Now() - fault_at;
  const tandem::v1::LoadReport frozen_load = GetLoad(*c, decode->grpc_address);
  router.child->Signal(SIGCONT);
  EXPECT_TRUE(idle_while_frozen) << why;
  std::cout << "matrix: SIGSTOP router with " << kLongClients << " x " << kLongTokens
            << " tokens on decode-0: no page held " << absl::ToDoubleMilliseconds(idle_frozen)
            << " ms after the freeze (router still frozen; load then "
            << frozen_load.ShortDebugString() << ")\n";
  clients.Join();
  // The router's streams to the workers were closed under it: each client gets one error.
  ExpectTerminalAnswers(clients, {grpc::StatusCode::UNAVAILABLE}, /*complete_ok=*/false);
  const absl::Duration worst = clients.Worst(fault_at);
  ExpectRecovered(*c, "SIGSTOP router, long requests", fault_at, worst, Answers(clients));
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace tandem::e2e
