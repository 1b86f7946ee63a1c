// Finding 1 of [hardening] (issue 27) with mutual TLS on (the layout's control_plane_tls): real
// processes on loopback, the tiny model, one prefill, one decode and one mixed worker. Callers
// that hold the cluster token but not a certificate of the deployment's CA — a plain (insecure)
// client, a TLS client without a certificate, a TLS client with a certificate of another CA —
// try every control-plane action: Register and Heartbeat at the router's registry port (and on
// its public gRPC port), and ReservePages, Prefill, GenerateFromPrefill, Generate, Abort and
// GetLoad at the workers. Each fails, nothing changes (the same three workers registered, no
// page reserved), and the deployment serves a greedy request with the reference's tokens. A
// caller with the certificate but a wrong token is still refused (the token stays checked).
// And a worker started with only part of the TLS flags, or with a missing file, exits with an
// error naming them.
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "deploy/launcher/deployment_ca.h"
#include "deploy/launcher/http_get.h"
#include "gtest/gtest.h"
#include "rpc/cluster_auth.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

using tandem::v1::Worker;
using tandem::v1::WorkerRegistry;

constexpr char kLayout[] = R"(
control_plane_tls: true
engine: {page_size: 16, num_pages: 256}
groups:
  - {role: prefill, count: 1}
  - {role: decode, count: 1}
  - {role: mixed, count: 1}
)";

std::unique_ptr<grpc::ClientContext> Context() {
  auto c = std::make_unique<grpc::ClientContext>();
  c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(3)));
  return c;
}

// The registered workers (every role and state) in the router's tandem_router_workers gauge.
int RegisteredWorkers(const launcher::Cluster& c) {
  absl::StatusOr<launcher::HttpResponse> r =
      launcher::HttpGet(c.http_address(), "/metrics", absl::Seconds(2));
  if (!r.ok() || r->status != 200) return -1;
  double total = 0;
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    if (!absl::StartsWith(line, "tandem_router_workers{")) continue;
    double n = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &n)) total += n;
  }
  return static_cast<int>(total);
}

struct Caller {
  std::string name;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};

std::shared_ptr<grpc::Channel> Channel(const Caller& caller, const std::string& address,
                                       const std::string& token) {
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(kControlPlaneTlsName);  // the name the servers' certificates hold
  // The token on every call, as a real worker sends it (ClusterChannel's interceptor).
  class TokenCredentials final : public grpc::MetadataCredentialsPlugin {
   public:
    explicit TokenCredentials(std::string token) : token_(std::move(token)) {}
    grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                             std::multimap<grpc::string, grpc::string>* metadata) override {
      metadata->insert({kClusterTokenMetadata, token_});
      return grpc::Status::OK;
    }
    bool IsBlocking() const override { return false; }

   private:
    std::string token_;
  };
  // Call credentials need a secure channel; the plain caller sends the token as workers do.
  if (caller.credentials == nullptr)
    return ClusterChannel(address, token, grpc::ChannelArguments());
  auto call_credentials =
      grpc::MetadataCredentialsFromPlugin(std::make_unique<TokenCredentials>(token));
  return grpc::CreateCustomChannel(
      address, grpc::CompositeChannelCredentials(caller.credentials, call_credentials), args);
}

tandem::v1::RegisterRequest Hello(const std::string& id) {
  tandem::v1::RegisterRequest r;
  r.set_protocol_version(tandem::v1::PROTOCOL_VERSION_CURRENT);
  r.set_worker_id(id);
  r.set_instance_id("impostor-instance");
  r.set_role(tandem::v1::WORKER_ROLE_DECODE);
  r.set_address("127.0.0.1:1");  // it would receive users' prompts
  r.set_kv_transfer_address("127.0.0.1:1");
  return r;
}

// Every method of the two control-plane services, called by `caller`; the codes they ended with
// (each must be an error), by method name.
std::map<std::string, grpc::StatusCode> TryEverything(const Caller& caller,
                                                      const launcher::Cluster& c,
                                                      const std::string& token) {
  std::map<std::string, grpc::StatusCode> codes;
  auto registry = WorkerRegistry::NewStub(Channel(caller, c.control_plane_address(), token));
  tandem::v1::RegisterResponse reg;
  codes["Register"] = registry->Register(Context().get(), Hello("impostor"), &reg).error_code();
  codes["Register (decode-0's id)"] =
      registry->Register(Context().get(), Hello("decode-0"), &reg).error_code();
  tandem::v1::HeartbeatRequest hb;
  hb.set_worker_id("decode-0");
  hb.set_instance_id("impostor-instance");
  hb.set_draining(true);
  hb.set_unhealthy_reason("forged");
  tandem::v1::HeartbeatResponse hbr;
  codes["Heartbeat"] = registry->Heartbeat(Context().get(), hb, &hbr).error_code();

  auto worker = [&](const std::string& name) {
    const launcher::Process* p = const_cast<launcher::Cluster&>(c).Find(name);
    EXPECT_NE(p, nullptr) << name;
    return Worker::NewStub(Channel(caller, p->grpc_address, token));
  };
  auto decode = worker("decode-0");
  tandem::v1::ReservePagesRequest reserve;
  reserve.set_request_id("r-impostor");
  reserve.set_num_prompt_tokens(1024);
  reserve.set_max_tokens(1024);
  tandem::v1::ReservePagesResponse reserved;
  codes["ReservePages"] = decode->ReservePages(Context().get(), reserve, &reserved).error_code();
  tandem::v1::AbortRequest abort;
  abort.set_request_id("r-impostor");
  tandem::v1::AbortResponse aborted;
  codes["Abort"] = decode->Abort(Context().get(), abort, &aborted).error_code();
  tandem::v1::LoadReport load;
  codes["GetLoad"] =
      decode->GetLoad(Context().get(), tandem::v1::GetLoadRequest(), &load).error_code();
  {
    tandem::v1::GenerateFromPrefillRequest req;
    req.set_request_id("r-impostor");
    auto ctx = Context();
    auto reader = decode->GenerateFromPrefill(ctx.get(), req);
    tandem::v1::TokenEvent event;
    while (reader->Read(&event)) {
    }
    codes["GenerateFromPrefill"] = reader->Finish().error_code();
  }
  {
    tandem::v1::WorkerGenerateRequest req;
    req.set_request_id("r-impostor");
    req.add_prompt_tokens(17);
    req.mutable_sampling()->set_max_tokens(4);
    auto ctx = Context();
    auto reader = worker("mixed-0")->Generate(ctx.get(), req);
    tandem::v1::TokenEvent event;
    int events = 0;
    while (reader->Read(&event)) ++events;
    EXPECT_EQ(events, 0) << caller.name << " got tokens from the mixed worker";
    codes["Generate"] = reader->Finish().error_code();
  }
  {
    tandem::v1::PrefillRequest req;
    req.set_request_id("r-impostor");
    req.add_prompt_tokens(17);
    auto ctx = Context();
    auto reader = worker("prefill-0")->Prefill(ctx.get(), req);
    tandem::v1::PrefillEvent event;
    while (reader->Read(&event)) {
    }
    codes["Prefill"] = reader->Finish().error_code();
  }
  return codes;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ControlPlaneTlsE2E, OnlyCertifiedCallersReachTheControlPlane) {
  std::unique_ptr<launcher::Cluster> c = StartCluster(kLayout);
  ASSERT_NE(c, nullptr);
  const std::vector<std::pair<std::string, int>> roles = {
      {"prefill", 1}, {"decode", 1}, {"mixed", 1}};
  // The registry listens apart from the public gRPC API; the key files are the owner's only.
  ASSERT_NE(c->control_plane_address(), c->router().grpc_address);
  const launcher::TlsFiles& client = c->client_tls();
  ASSERT_FALSE(client.ca.empty());
  std::vector<const launcher::Process*> processes = {&c->router()};
  for (const launcher::Process* w : c->workers()) processes.push_back(w);
  for (const launcher::Process* p : processes) {
    struct stat st;
    ASSERT_EQ(stat(p->tls.key.c_str(), &st), 0) << p->name;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << p->name;
  }

  // Another deployment's CA: its certificates are well-formed, but not of this deployment.
  absl::StatusOr<launcher::DeploymentCa> other =
      launcher::DeploymentCa::Create("another deployment", absl::Hours(1));
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<launcher::DeploymentCa::Issued> foreign = other->Issue("router");
  ASSERT_TRUE(foreign.ok()) << foreign.status();
  const std::string ca_pem = Slurp(client.ca);
  grpc::SslCredentialsOptions no_cert;
  no_cert.pem_root_certs = ca_pem;  // it trusts the right servers, but has no certificate
  grpc::SslCredentialsOptions other_ca = no_cert;
  other_ca.pem_private_key = foreign->key_pem;
  other_ca.pem_cert_chain = foreign->cert_pem;
  const Caller callers[] = {{"plain", nullptr},
                            {"TLS without a certificate", grpc::SslCredentials(no_cert)},
                            {"TLS with another CA's certificate", grpc::SslCredentials(other_ca)}};
  for (const Caller& caller : callers) {
    SCOPED_TRACE(caller.name);
    for (const auto& [method, code] : TryEverything(caller, *c, c->cluster_token())) {
      // The handshake fails: the call never reaches a handler.
      EXPECT_EQ(code, grpc::StatusCode::UNAVAILABLE) << method;
    }
  }
  // The registry on the public gRPC port (no TLS there), with the right token: refused.
  {
    auto registry = WorkerRegistry::NewStub(
        ClusterChannel(c->router().grpc_address, c->cluster_token(), grpc::ChannelArguments()));
    tandem::v1::RegisterResponse reg;
    const grpc::Status st = registry->Register(Context().get(), Hello("impostor"), &reg);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), "mutual TLS")) << st.error_message();
    tandem::v1::HeartbeatRequest hb;
    hb.set_worker_id("decode-0");
    hb.set_instance_id("impostor-instance");
    hb.set_draining(true);
    tandem::v1::HeartbeatResponse hbr;
    EXPECT_EQ(registry->Heartbeat(Context().get(), hb, &hbr).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // The deployment's certificate with a wrong token: the handlers still refuse.
  {
    absl::StatusOr<ControlPlaneTls> tls = LoadControlPlaneTls(client.ca, client.cert, client.key);
    ASSERT_TRUE(tls.ok()) << tls.status();
    const std::string wrong = "not-this-deployments-token";
    auto registry = WorkerRegistry::NewStub(
        ClusterChannel(c->control_plane_address(), wrong, ControlPlaneChannelArgs(), *tls));
    tandem::v1::RegisterResponse reg;
    EXPECT_EQ(registry->Register(Context().get(), Hello("impostor"), &reg).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    auto decode = Worker::NewStub(
        ClusterChannel(c->Find("decode-0")->grpc_address, wrong, grpc::ChannelArguments(), *tls));
    tandem::v1::ReservePagesRequest reserve;
    reserve.set_request_id("r-impostor");
    reserve.set_num_prompt_tokens(64);
    tandem::v1::ReservePagesResponse reserved;
    EXPECT_EQ(decode->ReservePages(Context().get(), reserve, &reserved).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }

  // Nothing changed: the three workers, healthy, no page reserved; and the legitimate client
  // certificate works (GetLoad answers).
  EXPECT_EQ(RegisteredWorkers(*c), 3);
  EXPECT_TRUE(c->WaitForWorkers(roles, absl::Seconds(2)).ok());
  for (launcher::Process* w : c->workers()) {
    const tandem::v1::LoadReport l = GetLoad(*c, w->grpc_address);
    EXPECT_EQ(l.num_waiting(), 0) << w->name << ": " << l.ShortDebugString();
    EXPECT_GT(l.num_pages_total(), 0) << w->name;
    EXPECT_EQ(l.num_pages_reserved(), 0) << w->name;
  }
  // And the deployment serves, over mutual TLS between its processes.
  GenerateArgs args;
  args.prompt = Prompt(40, 7);
  args.max_tokens = 12;
  for (int i = 0; i < 3; ++i) {
    StreamResult r = Generate(c->router().grpc_address, args);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, ReferenceGreedy(TinyModelDir(), args));
  }
  std::string why;
  EXPECT_TRUE(WaitForIdle(*c, absl::Seconds(5), &why)) << why;
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

// Part of the TLS flags, or a file that is not there: the worker exits at once naming them.
TEST(ControlPlaneTlsE2E, IncompleteOrMissingCertificatesAreClearErrors) {
  const char* bin = std::getenv("TANDEM_BINARY_DIR");
  const std::string worker = absl::StrCat(bin != nullptr ? bin : ".", "/bin/tandem-decode-worker");
  const std::string dir = ::testing::TempDir();
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const Case cases[] = {
      {{"--tls-ca", dir + "/ca.crt"}, "missing: --tls-cert, --tls-key"},
      {{"--tls-ca", dir + "/no-such-ca.crt", "--tls-cert", dir + "/x.crt", "--tls-key",
        dir + "/x.key"},
       "cannot read --tls-ca " + dir + "/no-such-ca.crt: No such file or directory"},
  };
  for (const Case& k : cases) {
    std::vector<std::string> argv = {
        worker, "--model", TinyModelDir(), "--insecure-no-cluster-token", "--metrics-port", "-1"};
    argv.insert(argv.end(), k.flags.begin(), k.flags.end());
    absl::StatusOr<std::unique_ptr<launcher::ChildProcess>> child = launcher::ChildProcess::Start(
        argv, {}, absl::StrCat(dir, "/tls-flags-", &k - cases, ".log"));
    ASSERT_TRUE(child.ok()) << child.status();
    EXPECT_EQ((*child)->Wait(absl::Seconds(20)), 2);
    EXPECT_TRUE(absl::StrContains((*child)->LogTail(), k.message)) << (*child)->LogTail();
  }
}

}  // namespace
}  // namespace tandem::e2e
