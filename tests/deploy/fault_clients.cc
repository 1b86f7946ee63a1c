#include "tests/deploy/fault_clients.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/http/http_connection.h"

namespace tandem::e2e {

FaultClients::FaultClients(const std::string& router_grpc, int n,
                           const std::function<GenerateArgs(int)>& args_for) {
  // Every call starts at once, on a channel already connected: calls that each connected first
  // started tens of milliseconds apart on a busy machine.
  auto go = std::make_shared<absl::Notification>();
  for (int i = 0; i < n; ++i) {
    clients_.push_back(std::make_unique<FaultClient>());
    FaultClient* cl = clients_.back().get();
    GenerateArgs args = args_for(i);
    cl->max_tokens = args.max_tokens;
    if (args.channel == nullptr) {
      args.channel = grpc::CreateChannel(router_grpc, grpc::InsecureChannelCredentials());
      EXPECT_TRUE(
          args.channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(5))))
          << "client " << i << " cannot reach the router";
    }
    args.on_start = [cl](grpc::ClientContext* ctx) {
      absl::MutexLock l(&cl->mu);
      cl->context = ctx;
    };
    args.on_message = [cl](const StreamResult& r) {
      cl->tokens = static_cast<int>(r.tokens.size());
      return true;
    };
    threads_.emplace_back([cl, router_grpc, go, args = std::move(args)] {
      go->WaitForNotification();
      StreamResult r = Generate(router_grpc, args);
      absl::MutexLock l(&cl->mu);
      cl->context = nullptr;
      cl->done = true;
      cl->result = std::move(r);
      cl->end = absl::Now();
    });
  }
  go->Notify();
}

int FaultClients::NumWithTokens(int tokens) const {
  int n = 0;
  for (const auto& cl : clients_) n += cl->tokens.load() >= tokens;
  return n;
}

void FaultClients::Cancel(int i) {
  FaultClient& cl = *clients_[i];
  absl::MutexLock l(&cl.mu);
  if (cl.context != nullptr) cl.context->TryCancel();
}

void FaultClients::CancelAll() {
  for (int i = 0; i < size(); ++i) Cancel(i);
}

void FaultClients::Join() {
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

absl::Duration FaultClients::Worst(absl::Time since) const {
  absl::Duration worst = absl::ZeroDuration();
  for (const auto& cl : clients_) worst = std::max(worst, cl->end - since);
  return worst;
}

void ExpectTerminalAnswers(FaultClients& clients, const std::vector<grpc::StatusCode>& codes,
                           bool complete_ok) {
  for (int i = 0; i < clients.size(); ++i) {
    FaultClient& cl = clients[i];
    absl::MutexLock l(&cl.mu);
    ASSERT_TRUE(cl.done) << "client " << i;
    const StreamResult& r = cl.result;
    if (r.status.ok()) {
      // Never a truncated OK: a stream that ends OK is complete.
      EXPECT_TRUE(complete_ok) << "client " << i << ": a faulted stream ended OK";
      EXPECT_NE(r.finish, tandem::v1::FINISH_REASON_UNSPECIFIED) << "client " << i;
      EXPECT_EQ(static_cast<int>(r.tokens.size()), cl.max_tokens) << "client " << i;
    } else {
      EXPECT_NE(std::find(codes.begin(), codes.end(), r.status.error_code()), codes.end())
          << "client " << i << ": code " << r.status.error_code() << ": "
          << r.status.error_message();
    }
  }
}

std::string Answers(FaultClients& clients) {
  std::map<std::string, int> by_code;
  for (int i = 0; i < clients.size(); ++i) {
    absl::MutexLock l(&clients[i].mu);
    const grpc::StatusCode code = clients[i].result.status.error_code();
    static const char* const kNames[] = {"OK",
                                         "CANCELLED",
                                         "UNKNOWN",
                                         "INVALID_ARGUMENT",
                                         "DEADLINE",
                                         "NOT_FOUND",
                                         "ALREADY_EXISTS",
                                         "PERMISSION_DENIED",
                                         "EXHAUSTED",
                                         "FAILED_PRECONDITION",
                                         "ABORTED",
                                         "OUT_OF_RANGE",
                                         "UNIMPLEMENTED",
                                         "INTERNAL",
                                         "UNAVAILABLE",
                                         "DATA_LOSS",
                                         "UNAUTHENTICATED"};
    const int c = static_cast<int>(code);
    ++by_code[c >= 0 && c <= 16 ? kNames[c] : "?"];
  }
  std::string out;
  for (const auto& [name, n] : by_code) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", name, " x", n);
  }
  return out;
}

double RouterMetric(const launcher::Cluster& c, const std::string& name, const std::string& label) {
  int port = 0;
  if (!absl::SimpleAtoi(c.http_address().substr(c.http_address().rfind(':') + 1), &port)) {
    return -1;
  }
  // The router's /metrics body is chunked (launcher::HttpGet does not de-chunk).
  std::optional<testing::HttpResult> r = testing::HttpGetOnce(port, "/metrics");
  if (!r.has_value() || r->status != 200) return -1;
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    if (!absl::StartsWith(line, name) || line.size() <= name.size() ||
        (line[name.size()] != ' ' && line[name.size()] != '{') || !absl::StrContains(line, label)) {
      continue;
    }
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

absl::Duration ServeAgain(launcher::Cluster& c, absl::Time since,
                          const std::vector<std::pair<std::string, int>>& workers,
                          absl::Duration bound) {
  const absl::Time give_up = since + bound;
  while (absl::Now() < give_up) {
    EXPECT_TRUE(c.Supervise().ok());
    bool all_running = c.router().child->Running();
    for (launcher::Process* w : c.workers()) all_running &= w->child->Running();
    if (all_running && c.WaitForWorkers(workers, absl::Milliseconds(300)).ok()) {
      GenerateArgs args;
      args.prompt = Prompt(12, 99);
      args.max_tokens = 3;
      args.deadline = absl::Seconds(5);
      if (Generate(c.router().grpc_address, args).status.ok()) return absl::Now() - since;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::InfiniteDuration();
}

}  // namespace tandem::e2e
