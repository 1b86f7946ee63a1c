// A real prefill worker and a real decode worker (and a mixed one), driven directly over their
// gRPC control plane the way the router drives them: reserve on decode, prefill with the
// reservation as destination, then generate from the prefilled pages. Checks the answer against
// a single engine (chunked prefill with the layer-wise push, and the whole-prompt push), both
// orders of "KV landed" and "claimed", and that every way a request can
// end (abort while reserved, unclaimed reservation TTL, client cancel on prefill) frees pages.
#include <grpcpp/grpcpp.h>

#include <thread>

#include "base/check.h"
#include "base/cluster_token.h"
#include "comm/tcp_kv_sender.h"
#include "deploy/launcher/child_process.h"
#include "deploy/launcher/cluster.h"
#include "deploy/launcher/http_get.h"
#include "gtest/gtest.h"
#include "rpc/cluster_auth.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem::e2e {
namespace {

using tandem::v1::Worker;

// The workers run authenticated, as deployed; the stubs carry the token.
constexpr char kToken[] = "worker-pair-test-cluster-token";

struct RunningWorker {
  std::unique_ptr<launcher::ChildProcess> process;
  std::string address;
  std::string metrics;
  std::unique_ptr<Worker::Stub> stub;
};

RunningWorker StartWorker(const std::string& binary, std::vector<std::string> extra) {
  RunningWorker w;
  const int port = *launcher::PickFreePort("127.0.0.1");
  const int metrics_port = *launcher::PickFreePort("127.0.0.1");
  w.address = "127.0.0.1:" + std::to_string(port);
  w.metrics = "127.0.0.1:" + std::to_string(metrics_port);
  std::vector<std::string> argv = {std::string(std::getenv("TANDEM_BINARY_DIR")) + "/bin/" + binary,
                                   "--model",
                                   TinyModelDir(),
                                   "--port",
                                   std::to_string(port),
                                   "--metrics-port",
                                   std::to_string(metrics_port),
                                   "--num-pages",
                                   "256",
                                   "--page-size",
                                   "16"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  char tmpl[] = "/tmp/tandem-worker-log-XXXXXX";
  const int fd = mkstemp(tmpl);
  close(fd);
  auto p = launcher::ChildProcess::Start(argv, {{kClusterTokenEnv, kToken}}, tmpl);
  CHECK_OK(p.status());
  w.process = *std::move(p);
  w.stub = Worker::NewStub(ClusterChannel(w.address, kToken, grpc::ChannelArguments()));
  // Ready once GetLoad answers.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && GetLoad(w.address, kToken).num_waiting() < 0) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  return w;
}

class WorkerPairTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Chunked prefill (a 32-token budget) with the layer-wise push (the default), and a
    // second prefill worker that pushes the whole prompt after it is computed.
    prefill_ =
        new RunningWorker(StartWorker("tandem-prefill-worker", {"--max-num-batched-tokens", "32"}));
    prefill_whole_ =
        new RunningWorker(StartWorker("tandem-prefill-worker", {"--no-kv-layerwise-push"}));
    decode_ = new RunningWorker(StartWorker("tandem-decode-worker", {}));
  }
  static void TearDownTestSuite() {
    delete prefill_;
    delete prefill_whole_;
    delete decode_;
  }

  static tandem::v1::SamplingParams Greedy(int max_tokens) {
    tandem::v1::SamplingParams s;
    s.set_temperature(0);
    s.set_top_p(1);
    s.set_max_tokens(max_tokens);
    s.set_ignore_eos(true);
    return s;
  }

  static absl::StatusOr<tandem::v1::ReservePagesResponse> Reserve(const std::string& id, int n,
                                                                  int ttl_ms = 0) {
    tandem::v1::ReservePagesRequest req;
    req.set_request_id(id);
    req.set_num_prompt_tokens(n);
    req.set_max_tokens(8);
    req.set_ttl_ms(ttl_ms);
    tandem::v1::ReservePagesResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st = decode_->stub->ReservePages(&ctx, req, &resp);
    if (!st.ok()) return absl::Status(static_cast<absl::StatusCode>(st.error_code()), "reserve");
    return resp;
  }

  static tandem::v1::PrefillRequest PrefillFor(const std::string& id,
                                               const std::vector<int32_t>& prompt,
                                               const tandem::v1::ReservePagesResponse& r) {
    tandem::v1::PrefillRequest req;
    req.set_request_id(id);
    req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
    *req.mutable_sampling() = Greedy(8);
    auto* d = req.mutable_destination();
    d->set_decode_worker_id(r.decode_worker_id());
    d->set_kv_transfer_address(r.kv_transfer_address());
    *d->mutable_page_ids() = r.page_ids();
    d->set_transfer_id(id);
    return req;
  }

  static std::vector<int32_t> Decode(const std::string& id, const std::vector<int32_t>& prompt,
                                     int32_t first, grpc::Status* status) {
    tandem::v1::GenerateFromPrefillRequest req;
    req.set_request_id(id);
    req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
    *req.mutable_sampling() = Greedy(8);
    req.set_first_token(first);
    grpc::ClientContext ctx;
    auto reader = decode_->stub->GenerateFromPrefill(&ctx, req);
    std::vector<int32_t> tokens = {first};
    tandem::v1::TokenEvent ev;
    while (reader->Read(&ev))
      tokens.insert(tokens.end(), ev.token_ids().begin(), ev.token_ids().end());
    *status = reader->Finish();
    return tokens;
  }

  // The worker's load report once it shows reserved pages (the engine loop publishes its stats
  // after the task that reserved them, so a report read right after ReservePages may be a
  // step old), or the last report after `timeout`.
  static tandem::v1::LoadReport LoadOnceReserved(const RunningWorker& w,
                                                 absl::Duration timeout = absl::Seconds(2)) {
    const absl::Time deadline = absl::Now() + timeout;
    tandem::v1::LoadReport l = GetLoad(w.address, kToken);
    while (l.num_pages_reserved() == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      l = GetLoad(w.address, kToken);
    }
    return l;
  }

  static bool Idle(const RunningWorker& w, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    do {
      const auto l = GetLoad(w.address, kToken);
      if (l.num_waiting() == 0 && l.num_running() == 0 && l.num_pages_reserved() == 0 &&
          l.num_pages_owned() == 0) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    } while (absl::Now() < deadline);
    return false;
  }

  static RunningWorker* prefill_;
  static RunningWorker* prefill_whole_;
  static RunningWorker* decode_;
};

RunningWorker* WorkerPairTest::prefill_ = nullptr;
RunningWorker* WorkerPairTest::prefill_whole_ = nullptr;
RunningWorker* WorkerPairTest::decode_ = nullptr;

TEST_F(WorkerPairTest, PrefillTransferDecodeMatchesSingleEngine) {
  for (RunningWorker* prefill : {prefill_, prefill_whole_})
    for (bool claim_early : {false, true}) {
      for (int n : {3, 16, 33, 120}) {
        const std::string id = "pair-" + std::to_string(n) + (claim_early ? "-early" : "") +
                               (prefill == prefill_ ? "" : "-whole");
        const std::vector<int32_t> prompt = Prompt(n, n);
        GenerateArgs ref_args;
        ref_args.prompt = prompt;
        ref_args.max_tokens = 8;
        const std::vector<int32_t> want = ReferenceGreedy(TinyModelDir(), ref_args);
        auto r = Reserve(id, n);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_GE(r->page_ids_size(), (n + 1 + 15) / 16);
        grpc::ClientContext pctx;
        auto preader = prefill->stub->Prefill(&pctx, PrefillFor(id, prompt, *r));
        tandem::v1::PrefillEvent ev;
        ASSERT_TRUE(preader->Read(&ev));
        ASSERT_TRUE(ev.has_first_token());
        const int32_t first = ev.first_token().token_id();
        std::vector<int32_t> got;
        grpc::Status dstatus;
        std::thread early;
        if (claim_early) {
          early = std::thread([&] { got = Decode(id, prompt, first, &dstatus); });
        }
        ASSERT_TRUE(preader->Read(&ev));
        ASSERT_TRUE(ev.has_transfer_done());
        EXPECT_GT(ev.transfer_done().bytes(), 0);
        EXPECT_FALSE(preader->Read(&ev));
        ASSERT_TRUE(preader->Finish().ok());
        if (claim_early) {
          early.join();
        } else {
          got = Decode(id, prompt, first, &dstatus);
        }
        EXPECT_TRUE(dstatus.ok()) << dstatus.error_message();
        EXPECT_EQ(got, want) << id;
      }
    }
  EXPECT_TRUE(Idle(*prefill_, absl::Seconds(1)));
  EXPECT_TRUE(Idle(*prefill_whole_, absl::Seconds(1)));
  EXPECT_TRUE(Idle(*decode_, absl::Seconds(1)));
  // The transfer is visible in the decode worker's metrics.
  auto m = launcher::HttpGet(decode_->metrics, "/metrics", absl::Seconds(2));
  ASSERT_TRUE(m.ok());
  EXPECT_NE(m->body.find("tandem_worker_kv_receive_bytes_count"), std::string::npos);
  EXPECT_NE(m->body.find("tandem_worker_first_decode_step_seconds"), std::string::npos);
}

TEST_F(WorkerPairTest, AbortWhileReservedFreesBothSides) {
  const std::vector<int32_t> prompt = Prompt(40, 3);
  auto r = Reserve("abort-1", 40);
  ASSERT_TRUE(r.ok());
  EXPECT_GT(LoadOnceReserved(*decode_).num_pages_reserved(), 0);
  tandem::v1::AbortRequest abort;
  abort.set_request_id("abort-1");
  tandem::v1::AbortResponse aresp;
  grpc::ClientContext actx;
  ASSERT_TRUE(decode_->stub->Abort(&actx, abort, &aresp).ok());
  EXPECT_TRUE(aresp.found());
  EXPECT_TRUE(Idle(*decode_, absl::Seconds(1)));
  // A prefill pushing to the aborted reservation fails cleanly and frees its own pages.
  grpc::ClientContext pctx;
  auto preader = prefill_->stub->Prefill(&pctx, PrefillFor("abort-1", prompt, *r));
  tandem::v1::PrefillEvent ev;
  while (preader->Read(&ev)) {
  }
  EXPECT_EQ(preader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(Idle(*prefill_, absl::Seconds(1)));
  grpc::Status dstatus;
  Decode("abort-1", prompt, 5, &dstatus);
  EXPECT_FALSE(dstatus.ok());
}

TEST_F(WorkerPairTest, UnclaimedReservationExpires) {
  auto r = Reserve("ttl-1", 50, /*ttl_ms=*/200);
  ASSERT_TRUE(r.ok());
  EXPECT_GT(LoadOnceReserved(*decode_).num_pages_reserved(), 0);
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(Idle(*decode_, absl::Seconds(1)));
}

TEST_F(WorkerPairTest, PrefillClientCancelFreesPrefillPages) {
  auto r = Reserve("cancel-1", 500);
  ASSERT_TRUE(r.ok());
  {
    grpc::ClientContext pctx;
    auto preader = prefill_->stub->Prefill(&pctx, PrefillFor("cancel-1", Prompt(500, 9), *r));
    pctx.TryCancel();
    tandem::v1::PrefillEvent ev;
    while (preader->Read(&ev)) {
    }
    EXPECT_EQ(preader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(Idle(*prefill_, absl::Seconds(1)));
  tandem::v1::AbortRequest abort;
  abort.set_request_id("cancel-1");
  tandem::v1::AbortResponse aresp;
  grpc::ClientContext actx;
  ASSERT_TRUE(decode_->stub->Abort(&actx, abort, &aresp).ok());
  EXPECT_TRUE(Idle(*decode_, absl::Seconds(1)));
}

// Each role serves its own RPCs only (worker.proto): a decode worker is no mixed one.
TEST_F(WorkerPairTest, EachRoleRefusesTheOtherRolesRpcs) {
  tandem::v1::WorkerGenerateRequest gen;
  gen.set_request_id("not-here");
  gen.add_prompt_tokens(1);
  *gen.mutable_sampling() = Greedy(2);
  grpc::ClientContext gctx;
  tandem::v1::TokenEvent ev;
  auto reader = decode_->stub->Generate(&gctx, gen);
  EXPECT_FALSE(reader->Read(&ev));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
  tandem::v1::ReservePagesRequest rreq;
  tandem::v1::ReservePagesResponse rresp;
  grpc::ClientContext rctx;
  EXPECT_EQ(prefill_->stub->ReservePages(&rctx, rreq, &rresp).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_TRUE(Idle(*decode_, absl::Seconds(1)));
}

// Finding 1 of [hardening]: a client without the cluster token (none, or a wrong one) can do
// nothing on a worker. Every Worker RPC answers UNAUTHENTICATED and has no effect: the victim's
// reservation stays reserved (not aborted, not claimed, not filled), no pages are reserved, no
// prompt is computed; the KV port refuses the handshake before naming the transfer. The victim
// request then completes normally with the real token.
TEST_F(WorkerPairTest, EveryRpcAndTheKvHandshakeNeedTheClusterToken) {
  // Every method of the Worker service is tried below; a new one must be added here.
  ASSERT_EQ(Worker::service_full_name(), std::string("tandem.v1.Worker"));
  ASSERT_EQ(tandem::v1::ReservePagesRequest::descriptor()
                ->file()
                ->FindServiceByName("Worker")
                ->method_count(),
            6);
  RunningWorker mixed = StartWorker("tandem-decode-worker", {"--role", "mixed"});
  const std::vector<int32_t> prompt = Prompt(40, 5);
  auto victim = Reserve("victim", static_cast<int>(prompt.size()));
  ASSERT_TRUE(victim.ok()) << victim.status();
  const tandem::v1::LoadReport decode_before = LoadOnceReserved(*decode_);
  const tandem::v1::LoadReport prefill_before = GetLoad(prefill_->address, kToken);
  ASSERT_GT(decode_before.num_pages_reserved(), 0);

  for (const std::string& token : {std::string(), std::string("wrong-token-of-the-right-size")}) {
    SCOPED_TRACE(token.empty() ? "no token" : "wrong token");
    auto stub = [&](const RunningWorker& w) {
      return Worker::NewStub(ClusterChannel(w.address, token, grpc::ChannelArguments()));
    };
    auto decode = stub(*decode_), prefill = stub(*prefill_), mix = stub(mixed);
    auto ctx = [] {
      auto c = std::make_unique<grpc::ClientContext>();
      c->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      return c;
    };
    // ReservePages: the pool does not shrink.
    tandem::v1::ReservePagesRequest rreq;
    rreq.set_request_id("intruder");
    rreq.set_num_prompt_tokens(1000);
    tandem::v1::ReservePagesResponse rresp;
    EXPECT_EQ(decode->ReservePages(ctx().get(), rreq, &rresp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    // Abort of another user's request: it stays.
    tandem::v1::AbortRequest areq;
    areq.set_request_id("victim");
    tandem::v1::AbortResponse aresp;
    for (auto* s : {decode.get(), prefill.get(), mix.get()}) {
      EXPECT_EQ(s->Abort(ctx().get(), areq, &aresp).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
      tandem::v1::LoadReport load;
      EXPECT_EQ(s->GetLoad(ctx().get(), tandem::v1::GetLoadRequest(), &load).error_code(),
                grpc::StatusCode::UNAUTHENTICATED);
    }
    // Claiming the victim's reservation (GenerateFromPrefill), prefilling into it, and
    // inference with no admission (Generate on the mixed worker).
    {
      tandem::v1::GenerateFromPrefillRequest req;
      req.set_request_id("victim");
      req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
      *req.mutable_sampling() = Greedy(8);
      auto c = ctx();
      auto reader = decode->GenerateFromPrefill(c.get(), req);
      tandem::v1::TokenEvent ev;
      EXPECT_FALSE(reader->Read(&ev));
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      auto c = ctx();
      auto reader = prefill->Prefill(c.get(), PrefillFor("victim", prompt, *victim));
      tandem::v1::PrefillEvent ev;
      EXPECT_FALSE(reader->Read(&ev));
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    {
      tandem::v1::WorkerGenerateRequest req;
      req.set_request_id("free-inference");
      req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
      *req.mutable_sampling() = Greedy(4);
      auto c = ctx();
      auto reader = mix->Generate(c.get(), req);
      tandem::v1::TokenEvent ev;
      EXPECT_FALSE(reader->Read(&ev));
      EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
    // The KV handshake, naming the victim's transfer: refused before it is looked up (a
    // mismatched layout would otherwise fail the victim's transfer).
    TcpKvSender sender({}, token);
    absl::StatusOr<std::unique_ptr<KvSendOp>> op =
        sender.Begin(victim->kv_transfer_address(), "victim", KvLayout{}, 1, absl::Seconds(5));
    EXPECT_TRUE(absl::IsUnauthenticated(op.status())) << op.status();
  }
  // Nothing changed: the victim's pages are still reserved, nothing else is, no prompt ran.
  const tandem::v1::LoadReport decode_after = GetLoad(decode_->address, kToken);
  const tandem::v1::LoadReport prefill_after = GetLoad(prefill_->address, kToken);
  EXPECT_EQ(decode_after.num_pages_reserved(), decode_before.num_pages_reserved());
  EXPECT_EQ(decode_after.num_pages_owned(), 0);
  EXPECT_EQ(prefill_after.num_prompt_tokens_total(), prefill_before.num_prompt_tokens_total());
  EXPECT_EQ(GetLoad(mixed.address, kToken).num_prompt_tokens_total(), 0);
  // And the victim's request completes with the real token.
  GenerateArgs ref_args;
  ref_args.prompt = prompt;
  ref_args.max_tokens = 8;
  grpc::ClientContext pctx;
  auto preader = prefill_->stub->Prefill(&pctx, PrefillFor("victim", prompt, *victim));
  tandem::v1::PrefillEvent ev;
  ASSERT_TRUE(preader->Read(&ev));
  ASSERT_TRUE(ev.has_first_token());
  const int32_t first = ev.first_token().token_id();
  while (preader->Read(&ev)) {
  }
  ASSERT_TRUE(preader->Finish().ok());
  grpc::Status dstatus;
  EXPECT_EQ(Decode("victim", prompt, first, &dstatus), ReferenceGreedy(TinyModelDir(), ref_args));
  EXPECT_TRUE(dstatus.ok()) << dstatus.error_message();
  EXPECT_TRUE(Idle(*decode_, absl::Seconds(1)));
  EXPECT_TRUE(Idle(*prefill_, absl::Seconds(1)));
}

TEST(MixedWorker, GenerateMatchesSingleEngine) {
  RunningWorker mixed = StartWorker("tandem-decode-worker", {"--role", "mixed"});
  const std::vector<int32_t> prompt = Prompt(37, 11);
  GenerateArgs ref_args;
  ref_args.prompt = prompt;
  ref_args.max_tokens = 10;
  const std::vector<int32_t> want = ReferenceGreedy(TinyModelDir(), ref_args);
  tandem::v1::WorkerGenerateRequest req;
  req.set_request_id("mixed-1");
  req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
  req.mutable_sampling()->set_max_tokens(10);
  req.mutable_sampling()->set_top_p(1);
  req.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = mixed.stub->Generate(&ctx, req);
  std::vector<int32_t> got;
  tandem::v1::TokenEvent ev;
  tandem::v1::FinishReason finish = tandem::v1::FINISH_REASON_UNSPECIFIED;
  while (reader->Read(&ev)) {
    got.insert(got.end(), ev.token_ids().begin(), ev.token_ids().end());
    if (ev.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) finish = ev.finish_reason();
  }
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ(finish, tandem::v1::FINISH_REASON_LENGTH);
  tandem::v1::ReservePagesRequest rreq;
  tandem::v1::ReservePagesResponse rresp;
  grpc::ClientContext rctx;
  EXPECT_EQ(mixed.stub->ReservePages(&rctx, rreq, &rresp).error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
}

}  // namespace
}  // namespace tandem::e2e
