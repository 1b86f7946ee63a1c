#include "worker/worker_service.h"

namespace tandem {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

tandem::v1::LoadReport WorkerService::Load() const {
  const EngineStats s = loop_->stats();
  tandem::v1::LoadReport r;
  r.set_num_waiting(s.num_waiting);
  r.set_num_running(s.num_running);
  r.set_num_pages_total(s.num_pages_total);
  r.set_num_pages_free(s.num_pages_free);
  r.set_num_pages_reserved(s.num_pages_reserved);
  r.set_num_pages_owned(s.num_pages_owned);
  r.set_num_prompt_tokens_total(s.num_prompt_tokens_total);
  r.set_num_generated_tokens_total(s.num_generated_tokens_total);
  return r;
}

grpc::Status WorkerService::GetLoad(grpc::ServerContext*, const tandem::v1::GetLoadRequest*,
                                    tandem::v1::LoadReport* resp) {
  *resp = Load();
  return grpc::Status::OK;
}

grpc::Status WorkerService::Abort(grpc::ServerContext*, const tandem::v1::AbortRequest* req,
                                  tandem::v1::AbortResponse* resp) {
  bool found = false;
  loop_->RunSync([&](Engine& e) { found = AbortOnLoop(e, req->request_id(), req->reason()); });
  resp->set_found(found);
  return grpc::Status::OK;
}

grpc::Status WorkerService::AdmitNew() const {
  if (draining_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is draining");
  return grpc::Status::OK;
}

}  // namespace tandem
