// What the fault-phase tests (fault_transfer_e2e_test, fault_admission_e2e_test) share: a set of
// gRPC clients of the router, each in its own thread, recording its one terminal answer and when
// it came; the check every cell makes of those answers; the router's admission gauges; and
// "serving again" after a fault (the launcher's supervisor restarts what died).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {

struct FaultClient {
  int max_tokens = 0;
  std::atomic<int> tokens{0};  // streamed so far
  absl::Mutex mu;
  grpc::ClientContext* context ABSL_GUARDED_BY(mu) = nullptr;  // while the call runs
  bool done ABSL_GUARDED_BY(mu) = false;
  StreamResult result;  // read after Join()
  absl::Time end;       // when the terminal answer came
};

// Thread-compatible: one test thread drives it (the clients run on threads of their own).
class FaultClients {
 public:
  // Starts client i with args_for(i) against the router's gRPC address.
  FaultClients(const std::string& router_grpc, int n,
               const std::function<GenerateArgs(int)>& args_for);
  ~FaultClients() { Join(); }

  int size() const { return static_cast<int>(clients_.size()); }
  FaultClient& operator[](int i) { return *clients_[i]; }
  // How many clients have streamed at least `tokens` tokens.
  int NumWithTokens(int tokens) const;
  void Cancel(int i);  // the client disconnects (TryCancel), if its call still runs
  void CancelAll();
  void Join();
  // After Join: the longest time from `since` to a client's terminal answer.
  absl::Duration Worst(absl::Time since) const;

 private:
  std::vector<std::unique_ptr<FaultClient>> clients_;
  std::vector<std::thread> threads_;
};

// After Join: every client got exactly one terminal answer: a complete stream (OK, a finish
// reason, max_tokens tokens) when `complete_ok`, otherwise an error whose code is in `codes`.
void ExpectTerminalAnswers(FaultClients& clients, const std::vector<grpc::StatusCode>& codes,
                           bool complete_ok);

// After Join: the answers by code, for the matrix's printout ("UNAVAILABLE x2, OK x1").
std::string Answers(FaultClients& clients);

// A sample of the router's /metrics: the first series named `name` whose labels contain `label`
// (`reason="queue_full"`; "" matches any); -1 when absent or unreadable.
double RouterMetric(const launcher::Cluster& c, const std::string& name,
                    const std::string& label = "");

// Supervises the cluster (restarting what died) until it serves again: every process running,
// `workers` registered and healthy, a short request answered OK. Returns the time from `since`,
// or InfiniteDuration if that did not happen by since + `bound`.
absl::Duration ServeAgain(launcher::Cluster& c, absl::Time since,
                          const std::vector<std::pair<std::string, int>>& workers,
                          absl::Duration bound);

}  // namespace tandem::e2e
