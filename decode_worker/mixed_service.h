// MixedService: the mixed (colocated) role, `tandem-decode-worker --role mixed`: one engine runs
// both phases of a request, with no reservation and no KV transfer; the baseline every
// disaggregated layout is compared with. Generate(prompt) adds the request to the engine and
// streams its tokens; the first event carries the prefill timings (queue, prefill), the
// terminal one the finish reason. ReservePages / GenerateFromPrefill / Prefill are not served
// (UNIMPLEMENTED, the gRPC default).
//
// Siblings (n / best_of, worker.proto "Sibling sequences"): the engine forks them from the
// request's prompt KV; each sequence's events carry its index, each ends with its own terminal
// event, and the stream ends after the last.
//
// Per-request state (loop thread only): in the engine from Generate until its terminal output,
// an Abort, or a client that went away (→ Engine::Abort, then kAbort); if the engine breaks,
// every stream gets the error event a failed batch gets (FailAllOnLoop).
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "worker/sequence_set.h"
#include "worker/worker_service.h"

namespace tandem {

class MixedService : public WorkerService {
 public:
  explicit MixedService(const WorkerEnv& env) : WorkerService(env) {}

  EngineLoop::Handlers Handlers() override;

  grpc::Status Generate(grpc::ServerContext* ctx, const tandem::v1::WorkerGenerateRequest* req,
                        grpc::ServerWriter<tandem::v1::TokenEvent>* writer) override;

 protected:
  bool AbortOnLoop(Engine& engine, const std::string& request_id,
                   tandem::v1::AbortReason reason) override;
  bool AbortSequenceOnLoop(Engine& engine, const std::string& request_id, int sequence) override;

 private:
  using Channel = EventChannel<tandem::v1::TokenEvent>;
  struct Request {
    std::shared_ptr<Channel> channel;
    absl::Time arrival;
    int num_outputs = 0;
    SequenceSet sequences;
  };

  void GenerateOnLoop(Engine& engine, EngineRequest request, std::shared_ptr<Channel> channel);
  void OnOutput(Engine& engine, const RequestOutput& out, absl::Time step_start);
  void Finish(const std::string& id, absl::Status status);
  void FailAllOnLoop(Engine& engine, const absl::Status& error) override;

  absl::flat_hash_map<std::string, Request> requests_;  // loop thread only
  SequenceOwners owners_;                               // loop thread only
};

}  // namespace tandem
