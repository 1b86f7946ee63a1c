// Workers whose engine breaks mid-step: the model fails with Internal (the CUDA backend's sticky
// device error, faked with FakeModel::InjectFault), so Engine::Step() fails for good. In
// process, over gRPC: every client gets a terminal error, no page stays held, new work is
// refused with UNAVAILABLE, and the worker tells the router's registry it is unhealthy, which
// marks it down and routes nothing more to it. For the mixed role, the decode role (decoding,
// claimed and waiting for its KV, reserved and unclaimed) and the prefill role.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/check.h"
#include "comm/tcp_kv_sender.h"
#include "decode_worker/decode_service.h"
#include "decode_worker/mixed_service.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prefill_worker/prefill_service.h"
#include "router/registry_service.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"
#include "tests/engine/fake_model.h"
#include "worker/router_client.h"

namespace tandem {
namespace {

using tandem::v1::Worker;
using testing::FakeModel;
using ::testing::HasSubstr;

constexpr char kInjected[] = "illegal memory access (injected)";

bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 31 + seed * 7) % 101;
  return p;
}

tandem::v1::SamplingParams Greedy(int max_tokens) {
  tandem::v1::SamplingParams s;
  s.set_temperature(0);
  s.set_top_p(1);
  s.set_max_tokens(max_tokens);
  s.set_ignore_eos(true);
  return s;
}

// The router's registry (router/worker_registry.h) behind its gRPC service.
class RouterRegistry {
 public:
  RouterRegistry() : registry_(Options()), service_(&registry_, /*cluster_token=*/"") {
    registry_.SetDownListener([this](const std::string&, uint64_t) { ++downs_; });
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    CHECK(server_ != nullptr && port != 0);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  ~RouterRegistry() { server_->Shutdown(); }

  const std::string& address() const { return address_; }
  router::WorkerRegistry& registry() { return registry_; }
  int downs() const { return downs_; }
  bool Healthy(const std::string& id) const {
    for (const router::WorkerSnapshot& w : registry_.Snapshot()) {
      if (w.id == id) return w.healthy;
    }
    return false;
  }

 private:
  static router::RegistryOptions Options() {
    router::RegistryOptions o;
    o.heartbeat_interval = absl::Milliseconds(50);
    return o;
  }

  router::WorkerRegistry registry_;
  router::RegistryService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::atomic<int> downs_{0};
};

// One worker role in this process, as RunWorker assembles it: an engine over a FakeModel, the
// role's service, its engine loop and a gRPC server on a free port.
class InProcessWorker {
 public:
  explicit InProcessWorker(WorkerRole role, int max_num_batched_tokens = 64) {
    options_.role = role;
    options_.worker_id = RoleName(role);
    options_.host = options_.advertise_host = "127.0.0.1";
    options_.engine.page_size = 16;
    options_.engine.num_pages = 8192;
    options_.engine.max_num_batched_tokens = max_num_batched_tokens;
    FakeModel::Options model_options;
    model_options.max_position_embeddings = 32768;
    auto model = std::make_unique<FakeModel>(model_options);
    model_ = model.get();
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::CreateWithModel(options_.engine, std::move(model));
    CHECK_OK(engine.status());
    const WorkerEnv env{&options_, nullptr, engine->get()};
    if (role == WorkerRole::kMixed) {
      service_ = std::make_unique<MixedService>(env);
    } else if (role == WorkerRole::kDecode) {
      absl::StatusOr<std::unique_ptr<DecodeService>> decode = DecodeService::Create(env);
      CHECK_OK(decode.status());
      service_ = *std::move(decode);
    } else {
      service_ = std::make_unique<PrefillService>(env, std::make_unique<TcpKvSender>(), 2);
    }
    loop_ = std::make_unique<EngineLoop>(*std::move(engine), service_->Handlers(),
                                         absl::Milliseconds(10));
    service_->Attach(loop_.get());
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    CHECK(server_ != nullptr && port != 0);
    address_ = absl::StrCat("127.0.0.1:", port);
    loop_->Start();
    stub_ = Worker::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  ~InProcessWorker() {
    service_->SetUnhealthyListener(nullptr);
    router_client_.reset();
    server_->Shutdown(std::chrono::system_clock::now());
    service_->Stop();
    loop_.reset();
  }

  // Registers and heartbeats as RunWorker does (health in the heartbeat, woken on failure).
  void RegisterWith(const std::string& router_address) {
    tandem::v1::RegisterRequest hello;
    hello.set_protocol_version(tandem::v1::PROTOCOL_VERSION_CURRENT);
    hello.set_worker_id(options_.worker_id);
    hello.set_instance_id("in-process");
    hello.set_role(RoleProto(options_.role));
    hello.set_address(address_);
    WorkerService* svc = service_.get();
    router_client_ = std::make_unique<RouterClient>(RouterClient::Options{
        router_address, /*cluster_token=*/"", /*tls=*/{}, hello, [svc] { return svc->Load(); },
        [svc] { return svc->draining(); }, [svc] { return svc->health(); }});
    router_client_->Start();
    svc->SetUnhealthyListener([r = router_client_.get()] { r->Wake(); });
  }

  Worker::Stub& stub() { return *stub_; }
  WorkerService& service() { return *service_; }
  FakeModel& model() { return *model_; }
  RouterClient& router_client() { return *router_client_; }

  tandem::v1::LoadReport Load() {
    grpc::ClientContext ctx;
    tandem::v1::LoadReport load;
    CHECK(stub_->GetLoad(&ctx, tandem::v1::GetLoadRequest(), &load).ok());
    return load;
  }
  // Nothing queued, running or held: every page free or cached (evictable prefix-cache pages).
  void ExpectIdle() {
    EXPECT_TRUE(WaitFor([&] {
      const tandem::v1::LoadReport l = Load();
      return l.num_running() == 0 && l.num_waiting() == 0 &&
             l.num_pages_free() + l.num_pages_cached() == l.num_pages_total();
    }));
    const tandem::v1::LoadReport l = Load();
    EXPECT_EQ(l.num_pages_owned(), 0);
    EXPECT_EQ(l.num_pages_reserved(), 0);
    EXPECT_EQ(service_->NumLive(), 0);
  }

 private:
  WorkerOptions options_;
  FakeModel* model_ = nullptr;  // owned by the engine
  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<Worker::Stub> stub_;
  std::unique_ptr<RouterClient> router_client_;
};

// A stream of TokenEvents read to its end.
struct TokenStream {
  std::vector<int32_t> tokens;
  tandem::v1::TokenEvent last;
  grpc::Status status;
};
template <typename Request, typename Open>
TokenStream ReadTokens(const Request& request, Open open) {
  grpc::ClientContext ctx;
  auto reader = open(&ctx, request);
  TokenStream out;
  tandem::v1::TokenEvent ev;
  while (reader->Read(&ev)) {
    out.tokens.insert(out.tokens.end(), ev.token_ids().begin(), ev.token_ids().end());
    out.last = ev;
  }
  out.status = reader->Finish();
  return out;
}

// The terminal error a failed batch's requests get: an ERROR event, then a clean end.
void ExpectEngineFailureEvent(const TokenStream& s, int max_tokens) {
  EXPECT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(s.last.finish_reason(), tandem::v1::FINISH_REASON_ERROR);
  EXPECT_THAT(s.last.error_message(), HasSubstr(kInjected));
  EXPECT_LT(static_cast<int>(s.tokens.size()), max_tokens);
}

TEST(WorkerEngineFailureTest, MixedWorkerFailsEveryStreamAndTellsTheRouter) {
  RouterRegistry router;
  InProcessWorker w(WorkerRole::kMixed);
  w.RegisterWith(router.address());
  ASSERT_TRUE(WaitFor([&] { return router.Healthy("mixed"); }));
  constexpr int kStreams = 4, kMaxTokens = 4000;
  std::vector<TokenStream> got(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      tandem::v1::WorkerGenerateRequest req;
      req.set_request_id(absl::StrCat("m", i));
      const std::vector<int32_t> prompt = Prompt(5 + 9 * i, i);
      req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
      *req.mutable_sampling() = Greedy(kMaxTokens);
      got[i] = ReadTokens(
          req, [&](grpc::ClientContext* c, const auto& r) { return w.stub().Generate(c, r); });
    });
  }
  ASSERT_TRUE(WaitFor([&] { return w.Load().num_running() == kStreams; }));
  w.model().InjectFault(absl::InternalError(kInjected));
  for (std::thread& t : clients) t.join();
  for (const TokenStream& s : got) ExpectEngineFailureEvent(s, kMaxTokens);
  w.ExpectIdle();
  EXPECT_THAT(std::string(w.service().health().message()), HasSubstr(kInjected));

  // New work is refused.
  tandem::v1::WorkerGenerateRequest late;
  late.set_request_id("late");
  late.add_prompt_tokens(1);
  *late.mutable_sampling() = Greedy(4);
  TokenStream refused = ReadTokens(
      late, [&](grpc::ClientContext* c, const auto& r) { return w.stub().Generate(c, r); });
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.status.error_message(), HasSubstr("unhealthy"));

  // The router marks it down, routes nothing to it, and it does not register again.
  EXPECT_TRUE(WaitFor([&] { return !router.Healthy("mixed"); }, absl::Seconds(1)));
  EXPECT_EQ(router.downs(), 1);
  EXPECT_TRUE(router::Candidates(router.registry().Snapshot(), tandem::v1::WORKER_ROLE_MIXED,
                                 router::RouteQuery())
                  .empty());
  absl::SleepFor(absl::Milliseconds(300));  // six heartbeat intervals
  EXPECT_FALSE(router.Healthy("mixed"));
  EXPECT_EQ(w.router_client().registrations(), 1);
}

TEST(WorkerEngineFailureTest, DecodeWorkerFailsDecodingClaimedAndReservedRequests) {
  InProcessWorker prefill(WorkerRole::kPrefill);
  InProcessWorker decode(WorkerRole::kDecode);
  constexpr int kMaxTokens = 4000;
  auto reserve = [&](const std::string& id, int n) {
    tandem::v1::ReservePagesRequest req;
    req.set_request_id(id);
    req.set_num_prompt_tokens(n);
    req.set_max_tokens(kMaxTokens);
    tandem::v1::ReservePagesResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(decode.stub().ReservePages(&ctx, req, &resp).ok());
    return resp;
  };
  auto claim = [&](const std::string& id, const std::vector<int32_t>& prompt, int32_t first) {
    tandem::v1::GenerateFromPrefillRequest req;
    req.set_request_id(id);
    req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
    *req.mutable_sampling() = Greedy(kMaxTokens);
    req.set_first_token(first);
    return ReadTokens(req, [&](grpc::ClientContext* c, const auto& r) {
      return decode.stub().GenerateFromPrefill(c, r);
    });
  };
  // One claimed whose KV never comes (claimed first, so that its claim has surely reached the
  // loop by the time the others decode), one never claimed.
  std::vector<TokenStream> got(4);
  std::vector<std::thread> clients;
  const std::vector<int32_t> prompt = Prompt(8, 9);
  reserve("claimed", 8);
  clients.emplace_back([&] { got[3] = claim("claimed", prompt, 1); });
  reserve("unclaimed", 8);
  // Three requests decoding: reserved, prefilled into the reservation, claimed.
  for (int i = 0; i < 3; ++i) {
    const std::string id = absl::StrCat("d", i);
    const std::vector<int32_t> prompt = Prompt(10 + 17 * i, i);
    const tandem::v1::ReservePagesResponse reservation =
        reserve(id, static_cast<int>(prompt.size()));
    tandem::v1::PrefillRequest req;
    req.set_request_id(id);
    req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
    *req.mutable_sampling() = Greedy(kMaxTokens);
    tandem::v1::KvDestination* dest = req.mutable_destination();
    dest->set_kv_transfer_address(reservation.kv_transfer_address());
    *dest->mutable_page_ids() = reservation.page_ids();
    dest->set_transfer_id(id);
    grpc::ClientContext ctx;
    auto reader = prefill.stub().Prefill(&ctx, req);
    tandem::v1::PrefillEvent first, done;
    ASSERT_TRUE(reader->Read(&first) && first.has_first_token());
    ASSERT_TRUE(reader->Read(&done) && done.has_transfer_done());
    ASSERT_TRUE(reader->Finish().ok());
    clients.emplace_back([&, i, id, prompt, token = first.first_token().token_id()] {
      got[i] = claim(id, prompt, token);
    });
  }
  ASSERT_TRUE(WaitFor([&] { return decode.Load().num_running() == 3; }));
  ASSERT_EQ(decode.service().NumLive(), 5);

  decode.model().InjectFault(absl::InternalError(kInjected));
  for (std::thread& t : clients) t.join();
  for (int i = 0; i < 3; ++i) ExpectEngineFailureEvent(got[i], kMaxTokens);
  // The claim waiting for its KV gets the same event; had its claim reached the loop only after
  // the failure (not expected: it was sent well before), the same error as a stream status.
  if (got[3].status.ok()) {
    ExpectEngineFailureEvent(got[3], kMaxTokens);
  } else {
    EXPECT_EQ(got[3].status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(got[3].status.error_message(), HasSubstr(kInjected));
  }
  // The unclaimed reservation's claim learns why, rather than "not found".
  TokenStream late = claim("unclaimed", prompt, 1);
  EXPECT_EQ(late.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(late.status.error_message(), HasSubstr(kInjected));
  decode.ExpectIdle();
  tandem::v1::ReservePagesRequest more;
  more.set_request_id("more");
  more.set_num_prompt_tokens(4);
  more.set_max_tokens(4);
  tandem::v1::ReservePagesResponse resp;
  grpc::ClientContext ctx;
  EXPECT_EQ(decode.stub().ReservePages(&ctx, more, &resp).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // The prefill worker is untouched.
  EXPECT_TRUE(prefill.service().health().ok());
  prefill.ExpectIdle();
}

TEST(WorkerEngineFailureTest, PrefillWorkerFailsQueuedAndRunningPrefills) {
  constexpr int kPrefills = 3;
  std::atomic<bool> armed{false};
  // A 4-token budget: each 20000-token prompt takes 5000 steps. Steps of the fake model take
  // microseconds, so the first prompt could be prefilled before the others arrive: until the
  // load report shows all three in the engine (one prefilling, two queued), every step waits
  // 1 ms; then the fault is armed for the step under way.
  InProcessWorker prefill(WorkerRole::kPrefill, /*max_num_batched_tokens=*/4);
  prefill.model().SetBeforeEachCall([&] {
    if (armed) return;
    const tandem::v1::LoadReport l = prefill.service().Load();
    if (l.num_running() + l.num_waiting() < kPrefills) {
      absl::SleepFor(absl::Milliseconds(1));
      return;
    }
    armed = true;
    prefill.model().InjectFault(absl::InternalError(kInjected));
  });
  std::vector<grpc::Status> status(kPrefills);
  std::vector<int> events(kPrefills, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kPrefills; ++i) {
    clients.emplace_back([&, i] {
      tandem::v1::PrefillRequest req;
      req.set_request_id(absl::StrCat("p", i));
      const std::vector<int32_t> prompt = Prompt(20000, i);
      req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
      *req.mutable_sampling() = Greedy(2);
      grpc::ClientContext ctx;
      auto reader = prefill.stub().Prefill(&ctx, req);
      tandem::v1::PrefillEvent ev;
      while (reader->Read(&ev)) ++events[i];
      status[i] = reader->Finish();
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_TRUE(armed);
  for (int i = 0; i < kPrefills; ++i) {
    EXPECT_EQ(events[i], 0) << i;  // no first token
    EXPECT_EQ(status[i].error_code(), grpc::StatusCode::INTERNAL) << i;
    EXPECT_THAT(status[i].error_message(), HasSubstr(kInjected));
  }
  prefill.ExpectIdle();
  EXPECT_FALSE(prefill.service().health().ok());
  tandem::v1::PrefillRequest late;
  late.set_request_id("late");
  late.add_prompt_tokens(1);
  *late.mutable_sampling() = Greedy(2);
  grpc::ClientContext ctx;
  auto reader = prefill.stub().Prefill(&ctx, late);
  tandem::v1::PrefillEvent ev;
  EXPECT_FALSE(reader->Read(&ev));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace tandem
