// FakeWorker: an in-process gRPC server implementing worker.proto for router tests. It
// registers with the router, heartbeats, and "generates" the bytes of a fixed text as token
// ids (so with ByteTokenizer the client sees that text): the prefill role samples text[0], the
// decode role continues with text[1], text[2], ... and the mixed role does both. It records
// aborts, cancelled streams and reservations so tests can check cleanup, and can be killed
// mid-stream.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::router::testing {

struct FakeWorkerOptions {
  std::string id = "worker";
  tandem::v1::WorkerRole role = tandem::v1::WORKER_ROLE_MIXED;
  std::string text = "hello world! ";  // generated text, repeated as needed
  int token_delay_ms = 0;              // before each token (and the prefill / transfer)
  int eos_after = -1;                  // >= 0: emit EOS (id 257, STOP) as token number eos_after
  int num_pages = 1000;
  bool refuse_reservations = false;  // ReservePages → RESOURCE_EXHAUSTED
  // ReservePages waits this long before it reserves (an Abort sent meanwhile overtakes it, as
  // calls on other server threads can).
  int reserve_delay_ms = 0;
  // The KV transfer fails and this worker blames its peer (rpc/peer_fault.h): the prefill role
  // ends Prefill after the first token, the decode role ends GenerateFromPrefill before any
  // token, with UNAVAILABLE and the peer-fault trailer, as the real workers do.
  bool transfer_fails = false;
  int protocol_version = tandem::v1::PROTOCOL_VERSION_CURRENT;
  int heartbeat_ms = 100;  // real time
  // Sent with every registry call and required on every call it serves (rpc/cluster_auth.h);
  // empty: none. RouterTestEnv::AddWorker fills in the router's.
  std::string cluster_token;
  std::string instance_id = "fake-instance";  // RegisterRequest.instance_id
  Clock* clock = Clock::Real();  // token delays sleep on it (tests of the router's timings)
  int cached_tokens = 0;         // prefill: reported with the first token as a prefix-cache hit
  int prefill_delay_ms = 0;      // prefill: before the first token, beside token_delay_ms
  // The server takes the control plane's keepalive policy (ApplyControlPlaneServerArgs, as the
  // real workers' servers do); false: gRPC's default server policy.
  bool control_plane_server_args = false;
};

class FakeWorker final : public tandem::v1::Worker::Service {
 public:
  explicit FakeWorker(FakeWorkerOptions options);
  ~FakeWorker() override;

  // Starts the server on a free port and registers with the router at `router_address`.
  absl::Status Start(const std::string& router_address);
  // Simulates a crash: no more heartbeats, the server goes away, open streams break.
  void Kill();

  std::string address() const { return address_; }
  int aborts() const;
  std::set<std::string> aborted_ids() const;
  int cancelled_streams() const { return cancelled_streams_; }
  int reservations_held() const;
  // The request ids of every ReservePages / Prefill / Generate it served, in arrival order.
  std::vector<std::string> request_ids() const;
  int reservations_refused() const { return reservations_refused_; }
  int reservations_started() const { return reservations_started_; }  // ReservePages calls begun
  int streams_open() const { return streams_open_; }
  int requests_served() const { return requests_served_; }

  grpc::Status ReservePages(grpc::ServerContext* context,
                            const tandem::v1::ReservePagesRequest* request,
                            tandem::v1::ReservePagesResponse* response) override;
  grpc::Status GenerateFromPrefill(grpc::ServerContext* context,
                                   const tandem::v1::GenerateFromPrefillRequest* request,
                                   grpc::ServerWriter<tandem::v1::TokenEvent>* writer) override;
  grpc::Status Prefill(grpc::ServerContext* context, const tandem::v1::PrefillRequest* request,
                       grpc::ServerWriter<tandem::v1::PrefillEvent>* writer) override;
  grpc::Status Generate(grpc::ServerContext* context,
                        const tandem::v1::WorkerGenerateRequest* request,
                        grpc::ServerWriter<tandem::v1::TokenEvent>* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const tandem::v1::AbortRequest* request,
                     tandem::v1::AbortResponse* response) override;
  grpc::Status GetLoad(grpc::ServerContext* context, const tandem::v1::GetLoadRequest* request,
                       tandem::v1::LoadReport* response) override;

 private:
  int32_t TokenAt(int index) const;
  // Streams tokens [from, max_tokens); false if the stream was cancelled or aborted.
  // Every sequence (the request and its `num_siblings` siblings) gets the same tokens, events
  // one sequence after the other; `skip_first`: sequence 0 ended at prefill.
  grpc::Status StreamTokens(grpc::ServerContext* context, const std::string& id, int from,
                            int num_siblings, bool skip_first,
                            const tandem::v1::SamplingParams& sampling,
                            grpc::ServerWriter<tandem::v1::TokenEvent>* writer);
  bool Stopped(grpc::ServerContext* context, const std::string& id);
  // Sleeps `ms` on `clock`; Kill() ends the sleep early.
  void Sleep(Clock* clock, int ms);
  void HeartbeatLoop();
  grpc::Status Authenticate(const grpc::ServerContext* context) const;
  absl::Status Register();

  const FakeWorkerOptions options_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<tandem::v1::WorkerRegistry::Stub> registry_;
  std::thread heartbeat_thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> killed_{false};
  std::atomic<int> cancelled_streams_{0};
  std::atomic<int> streams_open_{0};
  std::atomic<int> requests_served_{0};
  std::atomic<int> reservations_refused_{0};
  std::atomic<int> reservations_started_{0};
  mutable absl::Mutex mu_;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<std::string> reserved_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> request_ids_ ABSL_GUARDED_BY(mu_);
  int aborts_ ABSL_GUARDED_BY(mu_) = 0;
  bool dying_ ABSL_GUARDED_BY(mu_) = false;  // wakes sleeps (a fake clock may never get there)
};

}  // namespace tandem::router::testing
