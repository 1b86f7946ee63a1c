#include "rpc/cluster_auth.h"

#include <grpcpp/support/client_interceptor.h>

#include <utility>
#include <vector>

#include "base/cluster_token.h"

namespace tandem {
namespace {

using grpc::experimental::ClientInterceptorFactoryInterface;
using grpc::experimental::ClientRpcInfo;
using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::Interceptor;
using grpc::experimental::InterceptorBatchMethods;

class TokenInterceptor final : public Interceptor {
 public:
  explicit TokenInterceptor(const std::string* token) : token_(token) {}

  void Intercept(InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({kClusterTokenMetadata, *token_});
    }
    methods->Proceed();
  }

 private:
  const std::string* token_;  // owned by the factory, which the channel keeps
};

class TokenInterceptorFactory final : public ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::string token) : token_(std::move(token)) {}
  Interceptor* CreateClientInterceptor(ClientRpcInfo*) override {
    return new TokenInterceptor(&token_);
  }

 private:
  const std::string token_;
};

}  // namespace

grpc::ChannelArguments ControlPlaneChannelArgs() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 3000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // gRPC's defaults (1 s initial, x1.6, up to 120 s) leave a restarted peer unreached for many
  // seconds.
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays at its default: gRPC also takes it as the minimum
  // connect timeout, and at 100 ms connections to a busy worker were cut mid-handshake ("tcp
  // handshaker shutdown").
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return args;
}

void ApplyControlPlaneServerArgs(grpc::ServerBuilder& builder) {
  // The server's default refuses pings without calls and more than one per 5 minutes without
  // data: it answers the client's 5 s keepalive with GOAWAY "too_many_pings".
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

void ApplyServerKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kServerKeepaliveTimeMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kServerKeepaliveTimeoutMs);
  // Pings also while a stream is blocked on flow control (a frozen peer reads nothing, so no
  // data frame goes out): gRPC otherwise stops pinging after 2 pings without data.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS,
                             kServerKeepaliveTimeMs);
}

std::shared_ptr<grpc::Channel> ClusterChannel(const std::string& address, const std::string& token,
                                              const grpc::ChannelArguments& args,
                                              const ControlPlaneTls& tls) {
  grpc::ChannelArguments channel_args = args;
  ApplyControlPlaneTlsArgs(tls, channel_args);
  const std::shared_ptr<grpc::ChannelCredentials> credentials = ControlPlaneChannelCredentials(tls);
  if (token.empty()) return grpc::CreateCustomChannel(address, credentials, channel_args);
  std::vector<std::unique_ptr<ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<TokenInterceptorFactory>(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, channel_args,
                                                                 std::move(interceptors));
}

grpc::Status CheckClusterToken(const grpc::ServerContext& context, std::string_view token) {
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kClusterTokenMetadata);
  if (it != metadata.end() &&
      TokenMatches(token, std::string_view(it->second.data(), it->second.size()))) {
    return grpc::Status::OK;
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, it == metadata.end()
                                                             ? "this call needs the cluster token"
                                                             : "wrong cluster token");
}

grpc::Status CheckControlPlaneCall(const grpc::ServerContext& context, std::string_view token,
                                   bool require_certificate) {
  if (require_certificate && !PeerHasVerifiedCertificate(context)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this call needs mutual TLS with the deployment's certificate (the "
                        "router's worker registry is on its --control-plane-port)");
  }
  return CheckClusterToken(context, token);
}

}  // namespace tandem
