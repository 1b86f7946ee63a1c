// The fault matrix of [hardening] (issue 27), with real processes on loopback and the tiny
// model: the prefill worker, the decode worker and the router are killed (SIGKILL) or frozen
// (SIGSTOP, then SIGCONT) while requests are queued and being prefilled (prefill worker) or
// decoding, and clients cancel at each of those phases. In every cell each client gets exactly
// one terminal answer within kAnswerBound of the fault, no worker holds a reserved or owned page
// afterwards, the launcher's supervisor (Cluster::Supervise) restarts what died, and service
// resumes within kResumeBound. Each cell prints its measured figures ("matrix: ...").
// And a process that crashes again and again is given up on, with a message naming it.
#include <signal.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "deploy/launcher/http_get.h"
#include "gtest/gtest.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

constexpr absl::Duration kAnswerBound = absl::Seconds(5);
constexpr absl::Duration kResumeBound = absl::Seconds(15);
constexpr absl::Duration kIdleBound = absl::Seconds(5);

// One prefill worker computing 16 prompt tokens per step, one sequence at a time: of three long
// prompts, one is being prefilled and two are queued in the worker for many steps.
constexpr char kLayout[] = R"(
engine: {page_size: 16, num_pages: 1024}
groups:
  - {role: prefill, count: 1, args: [--max-num-batched-tokens, "16", --max-num-seqs, "1"]}
  - {role: decode, count: 1}
)";

enum class Fault { kKill, kStop, kCancel };
enum class Phase { kPrefill, kDecode };  // prefill: queued and prefilling in the prefill worker

struct Client {
  StreamResult result;
  absl::Time end;
  absl::Mutex mu;
  grpc::ClientContext* context = nullptr;  // while the call runs (guarded by mu)
  std::atomic<int> tokens{0};
};

struct Cell {
  const char* victim;  // "prefill-0", "decode-0", "router"; or the phase's worker for kCancel
  Fault fault;
  Phase phase;
};

std::string Name(const Cell& c) {
  const char* f = c.fault == Fault::kKill   ? "SIGKILL"
                  : c.fault == Fault::kStop ? "SIGSTOP"
                                            : "cancel";
  return absl::StrCat(f, " ", c.fault == Fault::kCancel ? "" : c.victim,
                      c.fault == Fault::kCancel ? "" : " ", "while ",
                      c.phase == Phase::kPrefill ? "queued/prefilling" : "decoding");
}

// Supervises the cluster until it serves again: every process running, every worker healthy, a
// request answered. Returns how long that took (or kResumeBound + 1 s if it never did).
absl::Duration Resume(launcher::Cluster& c, absl::Time since) {
  const absl::Time give_up = since + kResumeBound + absl::Seconds(5);
  while (absl::Now() < give_up) {
    EXPECT_TRUE(c.Supervise().ok());
    bool all_running = c.router().child->Running();
    for (launcher::Process* w : c.workers()) all_running &= w->child->Running();
    if (all_running &&
        c.WaitForWorkers({{"prefill", 1}, {"decode", 1}}, absl::Milliseconds(300)).ok()) {
      GenerateArgs args;
      args.prompt = Prompt(12, 99);
      args.max_tokens = 3;
      args.deadline = absl::Seconds(5);
      if (Generate(c.router().grpc_address, args).status.ok()) return absl::Now() - since;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return kResumeBound + absl::Seconds(1);
}

void RunCell(launcher::Cluster& c, const Cell& cell) {
  SCOPED_TRACE(Name(cell));
  constexpr int kClients = 3;
  const bool prefill_phase = cell.phase == Phase::kPrefill;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<Client>());
    Client* cl = clients.back().get();
    threads.emplace_back([&c, cl, i, prefill_phase] {
      GenerateArgs args;
      args.prompt = Prompt(prefill_phase ? 1200 : 16, 4000 + i);
      args.max_tokens = prefill_phase ? 8 : 1500;
      args.deadline = absl::Seconds(60);
      args.on_start = [cl](grpc::ClientContext* ctx) {
        absl::MutexLock l(&cl->mu);
        cl->context = ctx;
      };
      args.on_message = [cl](const StreamResult& r) {
        cl->tokens = static_cast<int>(r.tokens.size());
        return true;
      };
      StreamResult r = Generate(c.router().grpc_address, args);
      absl::MutexLock l(&cl->mu);
      cl->context = nullptr;
      cl->result = std::move(r);
      cl->end = absl::Now();
    });
  }
  // Wait for the phase: the prefill worker holds the prompts (one prefilling, the others
  // queued), or every stream has decoded a few tokens.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  launcher::Process* prefill = c.Find("prefill-0");
  while (absl::Now() < give_up) {
    if (prefill_phase) {
      const tandem::v1::LoadReport l = GetLoad(c, prefill->grpc_address);
      if (l.num_running() >= 1 && l.num_waiting() >= 1) break;
    } else {
      int decoding = 0;
      for (auto& cl : clients) decoding += cl->tokens.load() >= 3;
      if (decoding == kClients) break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_LT(absl::Now(), give_up) << "the phase was never reached";
  launcher::Process* victim = c.Find(cell.victim);
  ASSERT_NE(victim, nullptr);
  const absl::Time fault_at = absl::Now();
  switch (cell.fault) {
    case Fault::kKill:
      victim->child->Signal(SIGKILL);
      break;
    case Fault::kStop:
      victim->child->Signal(SIGSTOP);
      break;
    case Fault::kCancel:
      for (auto& cl : clients) {
        absl::MutexLock l(&cl->mu);
        if (cl->context != nullptr) cl->context->TryCancel();
      }
      break;
  }
  for (std::thread& t : threads) t.join();
  absl::Duration worst;
  for (auto& cl : clients) {
    // One terminal answer: an error status (never a truncated OK), within the bound.
    EXPECT_FALSE(cl->result.status.ok()) << "a faulted stream ended OK";
    const grpc::StatusCode want =
        cell.fault == Fault::kCancel ? grpc::StatusCode::CANCELLED : grpc::StatusCode::UNAVAILABLE;
    EXPECT_EQ(cl->result.status.error_code(), want) << cl->result.status.error_message();
    worst = std::max(worst, cl->end - fault_at);
  }
  EXPECT_LT(worst, kAnswerBound);
  if (cell.fault == Fault::kStop) victim->child->Signal(SIGCONT);
  // The launcher restarts what died and the service resumes; then no page stays reserved or
  // owned on any worker (reservations a dead router made are dropped when the workers register
  // with the restarted one).
  const absl::Duration resumed = Resume(c, fault_at);
  EXPECT_LT(resumed, kResumeBound);
  std::string why;
  EXPECT_TRUE(WaitForIdle(c, kIdleBound, &why)) << why;
  const absl::Duration idle = absl::Now() - fault_at;
  std::cout << absl::StrFormat(
      "matrix: %-36s last terminal answer %6.0f ms, serving again %6.0f ms, "
      "no page held %6.0f ms after the fault\n",
      Name(cell), absl::ToDoubleMilliseconds(worst), absl::ToDoubleMilliseconds(resumed),
      absl::ToDoubleMilliseconds(idle));
}

std::string ReadProcFile(pid_t pid, const char* name) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/", name));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(FaultMatrixE2E, EachClientGetsOneTerminalAnswerNoPageLeaksServiceResumes) {
  std::unique_ptr<launcher::Cluster> c = StartCluster(kLayout);
  ASSERT_NE(c, nullptr);
  // The launcher's token reaches every child in its environment, never on its command line.
  ASSERT_GE(c->cluster_token().size(), 64u);
  const launcher::Process* processes[] = {&c->router(), c->workers()[0], c->workers()[1]};
  for (const launcher::Process* p : processes) {
    EXPECT_EQ(ReadProcFile(p->child->pid(), "cmdline").find(c->cluster_token()), std::string::npos)
        << p->name;
    EXPECT_NE(ReadProcFile(p->child->pid(), "environ").find(c->cluster_token()), std::string::npos)
        << p->name;
  }
  const Cell cells[] = {
      {"prefill-0", Fault::kKill, Phase::kPrefill},   {"prefill-0", Fault::kStop, Phase::kPrefill},
      {"decode-0", Fault::kKill, Phase::kDecode},     {"decode-0", Fault::kStop, Phase::kDecode},
      {"router", Fault::kKill, Phase::kDecode},       {"router", Fault::kKill, Phase::kPrefill},
      {"prefill-0", Fault::kCancel, Phase::kPrefill}, {"decode-0", Fault::kCancel, Phase::kDecode},
  };
  for (const Cell& cell : cells) {
    RunCell(*c, cell);
    if (HasFatalFailure()) break;
  }
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

// After a router restart the workers register again within a bound (gRPC's default reconnect
// backoff made it 6-11 s).
TEST(FaultMatrixE2E, WorkersReregisterSoonAfterARouterRestart) {
  std::unique_ptr<launcher::Cluster> c = StartCluster(kLayout);
  ASSERT_NE(c, nullptr);
  const launcher::Process& router = c->router();
  router.child->Signal(SIGKILL);
  ASSERT_TRUE(router.child->Wait(absl::Seconds(5)).has_value());
  absl::SleepFor(absl::Seconds(2));  // the workers' channels back off meanwhile
  ASSERT_TRUE(c->Restart("router").ok());
  // From the router answering HTTP to both workers registered.
  absl::Time up;
  while (true) {
    auto r = launcher::HttpGet(c->http_address(), "/metrics", absl::Milliseconds(200));
    if (r.ok() && r->status == 200) {
      up = absl::Now();
      break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(c->WaitForWorkers({{"prefill", 1}, {"decode", 1}}, absl::Seconds(15)).ok());
  const absl::Duration reregistered = absl::Now() - up;
  std::cout << "matrix: workers registered again " << absl::ToDoubleMilliseconds(reregistered)
            << " ms after the restarted router listened\n";
  EXPECT_LT(reregistered, absl::Seconds(2));
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

// A process that dies right after each start is restarted with backoff, then given up on.
TEST(FaultMatrixE2E, ACrashLoopingWorkerIsGivenUpOnWithAClearMessage) {
  std::unique_ptr<launcher::Cluster> c =
      StartCluster(kLayout, [](launcher::Layout&, launcher::ClusterOptions& o) {
        o.restart.initial_backoff = absl::Milliseconds(50);
        o.restart.max_rapid_crashes = 3;
      });
  ASSERT_NE(c, nullptr);
  launcher::Process* decode = c->Find("decode-0");
  int restarts = 0;
  absl::Status verdict;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  pid_t last_pid = decode->child->pid();
  decode->child->Signal(SIGKILL);
  while (verdict.ok() && absl::Now() < give_up) {
    verdict = c->Supervise();
    if (decode->child->pid() != last_pid) {  // restarted: crash it again
      ++restarts;
      last_pid = decode->child->pid();
      decode->child->Signal(SIGKILL);
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(restarts, 2);
  EXPECT_TRUE(decode->given_up);
  EXPECT_NE(verdict.message().find("decode-0 crashed 3 times in a row"), std::string::npos)
      << verdict;
  EXPECT_TRUE(c->Supervise().ok());                   // said once
  EXPECT_FALSE(c->Shutdown(absl::Seconds(20)).ok());  // decode-0 did not exit cleanly
}

}  // namespace
}  // namespace tandem::e2e
