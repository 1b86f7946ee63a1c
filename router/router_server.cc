#include "router/router_server.h"

#include "absl/strings/str_cat.h"
#include "base/listen_error.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "rpc/cluster_auth.h"

namespace tandem::router {

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterConfig& config) {
  ASSIGN_OR_RETURN(ServedModel model, LoadServedModel(config.model_dir, config.served_model_name,
                                                      config.max_model_len));
  return Start(config, std::move(model));
}

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterConfig& config,
                                                                  ServedModel model) {
  std::unique_ptr<RouterServer> s(new RouterServer());
  s->model_ = std::move(model);
  s->metrics_ = std::make_unique<RouterMetrics>(s->model_.context.served_name,
                                                s->model_.context.max_model_len);
  RegistryOptions registry_options;
  registry_options.heartbeat_interval = absl::Milliseconds(config.heartbeat_interval_ms);
  registry_options.missed_heartbeats_limit = config.missed_heartbeats;
  registry_options.expected_model = s->model_.identity;
  // Workers may be started with another served name; the shape is what must match.
  registry_options.expected_model.clear_name();
  registry_options.clock = config.clock;
  registry_options.cluster_token = config.cluster_token;
  registry_options.tls = config.control_plane_tls;
  s->registry_ = std::make_unique<WorkerRegistry>(registry_options);
  ASSIGN_OR_RETURN(s->policy_, MakeRoutingPolicy(config.routing_policy));
  AdmissionOptions admission_options;
  admission_options.max_running = config.max_running;
  admission_options.max_waiting = config.max_waiting;
  admission_options.max_queue_time = config.max_queue_time;
  admission_options.clock = config.clock;
  s->admission_ = std::make_unique<AdmissionController>(admission_options);
  FlowOptions flow = config.flow;
  flow.clock = config.clock;
  s->service_ =
      std::make_unique<GenerationService>(flow, s->model_.tokenizer.get(), s->registry_.get(),
                                          s->policy_.get(), s->admission_.get(), s->metrics_.get());
  ApiOptions api_options;
  api_options.api_key = config.api_key;
  api_options.model_root = s->model_.dir;
  api_options.clock = config.clock;
  s->api_ = std::make_unique<OpenAiApi>(api_options, s->model_.context, s->service_.get(),
                                        s->registry_.get(), s->metrics_.get());

  const bool tls = config.control_plane_tls.enabled();
  s->registry_service_ =
      std::make_unique<RegistryService>(s->registry_.get(), config.cluster_token, tls);
  s->generation_service_ =
      std::make_unique<GenerationGrpcService>(s->model_.context, s->service_.get(), config.api_key);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // as the workers (run_worker.cc)
  ApplyControlPlaneServerArgs(builder);
  const std::string& grpc_host = config.grpc_host.empty() ? config.host : config.grpc_host;
  builder.AddListeningPort(absl::StrCat(grpc_host, ":", config.grpc_port),
                           grpc::InsecureServerCredentials(), &s->grpc_port_);
  // One server, two ports: the registry's handlers tell them apart by the caller's certificate.
  if (tls) {
    builder.AddListeningPort(absl::StrCat(grpc_host, ":", config.control_plane_port),
                             ControlPlaneServerCredentials(config.control_plane_tls),
                             &s->control_plane_port_);
  }
  builder.RegisterService(s->registry_service_.get());
  builder.RegisterService(s->generation_service_.get());
  s->grpc_server_ = builder.BuildAndStart();
  if (s->grpc_server_ == nullptr || s->grpc_port_ == 0 || (tls && s->control_plane_port_ == 0)) {
    // gRPC does not say why: taken as a port in use (a launcher retries a few times only).
    return PortTakenError(
        absl::StrCat("cannot listen for gRPC on ", grpc_host, ":", config.grpc_port,
                     tls ? absl::StrCat(" and ", config.control_plane_port) : ""));
  }

  HttpServerOptions http_options;
  http_options.address = config.host;
  http_options.port = config.http_port;
  http_options.num_threads = config.http_threads;
  http_options.max_body_bytes = config.max_body_bytes;
  http_options.idle_timeout = config.http_idle_timeout;
  s->http_ = std::make_unique<HttpServer>(http_options, s->api_->Handler());
  RETURN_IF_ERROR(s->http_->Start());
  return s;
}

void RouterServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  service_->SetDraining(true);
  if (!service_->AwaitIdle(grace)) {
    LOG(WARNING) << "cancelling " << service_->num_live() << " requests still running";
  }
  service_->CancelAll();
  service_->WaitForFlows(absl::Seconds(5));
  http_->Stop();
  grpc_server_->Shutdown(absl::ToChronoTime(Clock::Real()->Now() + absl::Seconds(1)));
}

RouterServer::~RouterServer() { Shutdown(absl::ZeroDuration()); }

}  // namespace tandem::router
