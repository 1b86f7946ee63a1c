#include "worker/run_worker.h"

#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "base/clock.h"
#include "base/listen_error.h"
#include "base/logging.h"
#include "engine/kv_budget.h"
#include "rpc/cluster_auth.h"
#include "worker/router_client.h"

namespace tandem {
namespace {

std::string KvDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kF32:
      return "f32";
    case DType::kF8E4M3:
      return "fp8_e4m3";
    default:
      return "other";
  }
}

tandem::v1::RegisterRequest MakeHello(const WorkerOptions& o, const Engine& engine, int port,
                                      const std::string& kv_address) {
  tandem::v1::RegisterRequest r;
  r.set_protocol_version(tandem::v1::PROTOCOL_VERSION_CURRENT);
  r.set_worker_id(o.worker_id);
  r.set_role(RoleProto(o.role));
  r.set_address(absl::StrCat(o.advertise_host, ":", port));
  r.set_kv_transfer_address(kv_address);
  const ModelConfig& c = engine.model_config();
  auto* m = r.mutable_model();
  m->set_name(o.served_model_name);
  m->set_vocab_size(c.vocab_size);  // config.json's, as the router reads it
  m->set_num_layers(c.num_layers);
  m->set_num_kv_heads(c.num_kv_heads);
  m->set_head_dim(c.head_dim);
  m->set_max_model_len(engine.max_model_len());
  m->set_kv_dtype(KvDtypeName(engine.kv_layout().dtype));
  auto* pool = r.mutable_kv_pool();
  pool->set_page_size(engine.kv_layout().page_size);
  pool->set_num_pages(engine.kv_layout().num_pages);
  pool->set_tp_size(1);
  pool->set_pp_size(1);
  r.set_build_version(TANDEM_VERSION);
  r.set_instance_id(o.instance_id);
  return r;
}

// Blocks until SIGTERM or SIGINT, calling `idle` about every 100 ms. The signals must already
// be blocked in every thread (done before any thread starts).
void WaitForSignal(const std::function<void()>& idle) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  const timespec timeout{0, 100 * 1000 * 1000};
  while (sigtimedwait(&set, nullptr, &timeout) < 0) idle();
}

void BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace

int RunWorker(int argc, char** argv, WorkerRole default_role, const ServiceFactory& make_service) {
  BlockStopSignals();
  absl::StatusOr<WorkerOptions> parsed = ParseWorkerOptions(argc, argv, default_role);
  if (!parsed.ok()) {
    std::cerr << parsed.status().message() << "\n";
    return absl::IsCancelled(parsed.status()) ? 0 : 2;
  }
  WorkerOptions o = *std::move(parsed);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(o.engine);
  if (!engine.ok()) {
    LOG(ERROR) << "cannot start the engine: " << engine.status();
    return 1;
  }
  // Bind the gRPC port first: the worker id defaults to "<role>-<port>".
  grpc::ServerBuilder builder;
  // No SO_REUSEPORT (gRPC's default on Linux): a second server on this port would silently share
  // its connections; instead the bind fails and the launcher picks another port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The router pings every 5 s (rpc/cluster_auth.h); gRPC's server default refuses that.
  ApplyControlPlaneServerArgs(builder);
  // And it pings the router: a frozen router's requests are cancelled (their pages freed)
  // within about 4 s instead of running to their end.
  ApplyServerKeepalive(builder);
  int port = 0;
  // Mutual TLS when the worker has certificates: only the deployment's processes connect.
  builder.AddListeningPort(absl::StrCat(o.host, ":", o.port), ControlPlaneServerCredentials(o.tls),
                           &port);
  std::unique_ptr<WorkerMetrics> metrics;
  if (o.metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<WorkerMetrics>> m = WorkerMetrics::Create(
        o.host, o.metrics_port, RoleName(o.role),
        o.worker_id.empty() ? RoleName(o.role) : o.worker_id, o.served_model_name);
    if (!m.ok()) {
      LOG(ERROR) << m.status();
      return IsPortTaken(m.status()) ? kExitCannotListen : 1;
    }
    metrics = *std::move(m);
    if (o.role != WorkerRole::kMixed) metrics->SetKvTransport(KvTransportKindName(o.kv_transport));
    const KvLayout& kv = (*engine)->kv_layout();
    metrics->SetKvCache(std::string(KvCacheDtypeName(kv.dtype)), kv.page_size, kv.num_pages);
  }
  Clock* const clock = Clock::Real();  // a process runs on real time
  WorkerEnv env{&o, metrics.get(), engine->get(), clock};
  absl::StatusOr<std::unique_ptr<WorkerService>> service = make_service(env);
  if (!service.ok()) {
    LOG(ERROR) << "cannot start the " << RoleName(o.role) << " service: " << service.status();
    return IsPortTaken(service.status()) ? kExitCannotListen : 1;
  }
  EngineLoop loop(*std::move(engine), (*service)->Handlers(), absl::Milliseconds(50), clock);
  (*service)->Attach(&loop);
  builder.RegisterService(service->get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    LOG(ERROR) << "cannot listen on " << o.host << ":" << o.port;
    return kExitCannotListen;
  }
  if (o.worker_id.empty()) o.worker_id = absl::StrCat(RoleName(o.role), "-", port);
  loop.Start();
  std::unique_ptr<RouterClient> router;
  if (!o.router.empty()) {
    WorkerService* svc = service->get();
    router = std::make_unique<RouterClient>(
        RouterClient::Options{o.router, o.cluster_token, o.tls,
                              MakeHello(o, loop.engine(), port, svc->kv_transfer_address()),
                              [svc] { return svc->Load(); }, [svc] { return svc->draining(); },
                              [svc] { return svc->health(); }, clock,
                              [svc](absl::Time cutoff) { svc->ForgetRouterStateBefore(cutoff); }});
    // A decode worker keeps no prefix cache (its pages all arrive by transfer).
    if (o.engine.enable_prefix_caching && o.role != WorkerRole::kDecode) {
      router->PublishPrefixCache(
          [svc] { return svc->PrefixCacheVersion(); },
          [svc](tandem::v1::PrefixCacheSummary* out) { svc->PrefixCache(out); });
    }
    router->Start();
    // An engine that breaks is reported at once, not at the next heartbeat.
    svc->SetUnhealthyListener([r = router.get()] { r->Wake(); });
  }
  if (metrics) {
    // Liveness: the engine is usable. Readiness: also not draining, and registered with the
    // router (when there is one to register with).
    WorkerService* svc = service->get();
    metrics->SetProbes([svc] { return svc->health(); },
                       [svc, r = router.get()] {
                         return svc->health().ok() && !svc->draining() &&
                                (r == nullptr || r->registered());
                       });
  }
  std::printf(
      "tandem %s worker %s: grpc %s:%d kv %s metrics %s\n", RoleName(o.role), o.worker_id.c_str(),
      o.host.c_str(), port,
      (*service)->kv_transfer_address().empty() ? "-" : (*service)->kv_transfer_address().c_str(),
      metrics ? absl::StrCat(o.host, ":", metrics->port(), "/metrics").c_str() : "-");
  std::fflush(stdout);
  auto update_metrics = [&] {
    if (metrics) {
      metrics->UpdateEngine(loop.stats(), (*service)->NumLive(), loop.output_handling_ns_total());
    }
  };
  WaitForSignal(update_metrics);
  LOG(INFO) << o.worker_id << ": draining (" << (*service)->NumLive() << " requests in flight)";
  (*service)->StartDraining();
  if (router) router->Wake();
  const absl::Time drain_deadline = clock->Now() + absl::Milliseconds(o.drain_timeout_ms);
  while ((*service)->NumLive() > 0 && clock->Now() < drain_deadline) {
    clock->SleepFor(absl::Milliseconds(20));
  }
  server->Shutdown(absl::ToChronoTime(clock->Now() + absl::Milliseconds(500)));
  (*service)->SetUnhealthyListener(nullptr);
  if (metrics) metrics->SetProbes(nullptr, nullptr);  // before what they read goes away
  router.reset();
  (*service)->Stop();
  LOG(INFO) << o.worker_id << ": stopped";
  return 0;
}

}  // namespace tandem
