// DecodeService: the decode role. ReservePages reserves the request's pages and tells the KV
// receiver to expect them; GenerateFromPrefill claims the reservation, and once the KV has
// landed commits it (Engine::AddPrefilledRequest) and streams tokens. The two may complete in
// either order. Generate is not served (UNIMPLEMENTED): the mixed role is MixedService.
//
// Per-request state machine (loop thread only):
//   kReserved   pages reserved, KV receiving     --KV ok + claimed--> kRunning
//               (unclaimed past its TTL, KV failure, Abort: receiver cancelled, pages released)
//   kRunning    in the engine's batch            --terminal output / Abort--> gone
// If the engine breaks, every request ends at once (FailAllOnLoop): a claimed one with the error
// event a failed batch gets, an unclaimed reservation with that error for its claim.
// Page safety: pages are released only after KvReceiver::Cancel() returned (or the transfer
// ended), so a late transfer can never write into pages that a new request reuses.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "comm/kv_transport.h"
#include "worker/sequence_set.h"
#include "worker/worker_service.h"

namespace tandem {

class DecodeService : public WorkerService {
 public:
  // Creates the TCP KV receiver on the worker's host and --kv-port.
  static absl::StatusOr<std::unique_ptr<DecodeService>> Create(const WorkerEnv& env);
  ~DecodeService() override;

  EngineLoop::Handlers Handlers() override;
  std::string kv_transfer_address() const override;
  // Drops the reservations still waiting for their KV and stops the KV receiver (on the loop,
  // which must be running).
  void Stop() override;
  void ForgetRouterStateBefore(absl::Time cutoff) override;

  grpc::Status ReservePages(grpc::ServerContext* ctx, const tandem::v1::ReservePagesRequest* req,
                            tandem::v1::ReservePagesResponse* resp) override;
  grpc::Status GenerateFromPrefill(grpc::ServerContext* ctx,
                                   const tandem::v1::GenerateFromPrefillRequest* req,
                                   grpc::ServerWriter<tandem::v1::TokenEvent>* writer) override;

 protected:
  bool AbortOnLoop(Engine& engine, const std::string& request_id,
                   tandem::v1::AbortReason reason) override;
  bool AbortSequenceOnLoop(Engine& engine, const std::string& request_id, int sequence) override;

 private:
  using Channel = EventChannel<tandem::v1::TokenEvent>;
  enum class State { kReserved, kRunning };
  struct Request {
    State state = State::kReserved;
    std::shared_ptr<Channel> channel;      // set once claimed
    std::optional<EngineRequest> pending;  // claimed, waiting for the KV
    int32_t first_token = 0;
    bool first_token_finished = false;  // only the siblings decode (worker.proto)
    SequenceSet sequences;              // set at the commit
    bool kv_ready = false;
    KvTransferStats kv_stats;
    absl::Time arrival;
    absl::Time ttl_deadline;  // unclaimed reservation lifetime
    absl::Time joined;        // entered the running batch
    int num_outputs = 0;
  };

  explicit DecodeService(const WorkerEnv& env);
  absl::StatusOr<std::vector<int32_t>> ReserveOnLoop(Engine& engine,
                                                     const tandem::v1::ReservePagesRequest& req);
  void ClaimOnLoop(Engine& engine, EngineRequest request, int32_t first_token,
                   bool first_token_finished, std::shared_ptr<Channel> channel);
  void OnKvDone(Engine& engine, const std::string& id, const absl::Status& status,
                const KvTransferStats& stats);
  void Commit(Engine& engine, const std::string& id, Request& r);
  void OnOutput(Engine& engine, const RequestOutput& out, absl::Time step_start);
  void OnTick(Engine& engine);
  // Cancels the transfer, releases the pages (at once, or once a CUDA IPC sender's write grant
  // ended: the id is in lent_ until then) and ends the stream (if any) with `status`.
  void DropReservation(Engine& engine, const std::string& id, const absl::Status& status);
  void ReleaseLent(Engine& engine, const std::string& id);
  void Finish(const std::string& id, absl::Status status);
  void FailAllOnLoop(Engine& engine, const absl::Status& error) override;

  std::unique_ptr<KvReceiver> receiver_;  // reset by Stop(), on the loop
  std::string kv_transfer_address_;
  absl::flat_hash_map<std::string, Request> requests_;  // loop thread only
  SequenceOwners owners_;                               // siblings of running requests
  // Reservations whose transfer failed before they were claimed: the claim gets this error
  // rather than NOT_FOUND. Expire with the reservation TTL. Loop thread only.
  absl::flat_hash_map<std::string, std::pair<absl::Status, absl::Time>> failed_;
  // Dropped reservations whose pages a CUDA IPC sender may still write (KvReceiver::Cancel's
  // `released` not run yet): the engine keeps them reserved; the id cannot be reserved again.
  // Loop thread only.
  absl::flat_hash_set<std::string> lent_;
};

}  // namespace tandem
