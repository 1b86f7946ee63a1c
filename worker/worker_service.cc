#include "worker/worker_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "rpc/cluster_auth.h"

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
  r.set_num_pages_cached(s.num_pages_cached);
  r.set_prefix_cache_queries_total(s.prefix_cache_queries_total);
  r.set_prefix_cache_hits_total(s.prefix_cache_hits_total);
  return r;
}

grpc::Status WorkerService::Authenticate(const grpc::ServerContext* ctx) const {
  // With TLS on, the port takes no other connection; checked here too, so that a server set up
  // otherwise still refuses.
  return CheckControlPlaneCall(*ctx, env_.options->cluster_token, env_.options->tls.enabled());
}

void WorkerService::PrefixCache(tandem::v1::PrefixCacheSummary* out) const {
  const EngineLoop::PrefixCacheSnapshot snap = loop_->prefix_cache();
  out->set_version(snap.version);
  out->set_page_size(loop_->engine().kv_layout().page_size);
  const size_t n = std::min(snap.hashes->size(), static_cast<size_t>(kMaxPublishedHashes));
  out->mutable_page_hashes()->Reserve(static_cast<int>(n));
  for (size_t i = 0; i < n; ++i) out->add_page_hashes((*snap.hashes)[i]);
  out->set_truncated(n < snap.hashes->size());
}

uint64_t WorkerService::PrefixCacheVersion() const { return loop_->prefix_cache().version; }

grpc::Status WorkerService::GetLoad(grpc::ServerContext* ctx, const tandem::v1::GetLoadRequest*,
                                    tandem::v1::LoadReport* resp) {
  if (grpc::Status st = Authenticate(ctx); !st.ok()) return st;
  *resp = Load();
  return grpc::Status::OK;
}

grpc::Status WorkerService::Abort(grpc::ServerContext* ctx, const tandem::v1::AbortRequest* req,
                                  tandem::v1::AbortResponse* resp) {
  if (grpc::Status st = Authenticate(ctx); !st.ok()) return st;
  bool found = false;
  loop_->RunSync([&](Engine& e) {
    found = req->has_sequence() ? AbortSequenceOnLoop(e, req->request_id(), req->sequence())
                                : AbortOnLoop(e, req->request_id(), req->reason());
  });
  resp->set_found(found);
  return grpc::Status::OK;
}

grpc::Status WorkerService::AdmitNew() const {
  if (absl::Status h = health(); !h.ok()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("worker is unhealthy: ", h.message()));
  }
  if (draining_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is draining");
  return grpc::Status::OK;
}

absl::Status WorkerService::health() const {
  absl::MutexLock l(&health_mu_);
  return health_;
}

void WorkerService::SetUnhealthyListener(std::function<void()> listener) {
  absl::MutexLock l(&health_mu_);
  unhealthy_listener_ = std::move(listener);
}

std::string WorkerService::EngineFailureMessage(const absl::Status& error) {
  return absl::StrCat("the worker's engine failed and it stopped serving: ", error.message());
}

void WorkerService::OnEngineBroken(Engine& engine, const absl::Status& error) {
  LOG(ERROR) << "engine failed for good; failing " << NumLive()
             << " requests and reporting this worker unhealthy: " << error;
  std::function<void()> listener;
  {
    absl::MutexLock l(&health_mu_);
    if (health_.ok()) health_ = error.ok() ? absl::InternalError("engine failed") : error;
    listener = unhealthy_listener_;
  }
  FailAllOnLoop(engine, error);
  if (listener) listener();
}

}  // namespace tandem
