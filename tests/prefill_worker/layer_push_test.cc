// Layer-wise KV push, in one process: a prefill and a decode service (each its own engine loop
// and gRPC server on loopback, the real TCP KV transport between them) over a real tiny
// checkpoint on the CPU backend. The prefill engine's model is wrapped so that the test sees
// each layer's hook and can hold the forward pass; the sender is wrapped so that it sees each
// SendLayer. What is checked:
//   - tokens equal a single engine's (the mixed path), for single-chunk and chunked prompts;
//   - the recorded order: layer l is stored, then sent, before layer l + 1 is stored and before
//     the step ends (the model waits after layer l until the send of layer l is recorded: with
//     an after-the-step push that wait could never end, and the test fails on its bound);
//   - only the final chunk's step pushes (no page moves during earlier chunks);
//   - a first token that ends the request, an abort mid-transfer, and the decode side giving up
//     mid-transfer each end the streams and leave every page of both workers free.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/check.h"
#include "base/status_macros.h"
#include "comm/tcp_kv_sender.h"
#include "decode_worker/decode_service.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "gtest/gtest.h"
#include "prefill_worker/prefill_service.h"
#include "tests/deploy/e2e_harness.h"

namespace tandem {
namespace {

// Upper bound for a wait that a correct implementation ends at once; only a bug reaches it.
constexpr absl::Duration kBound = absl::Seconds(20);

// What happened, in order, across the engine thread and the transfer threads.
class EventLog {
 public:
  void Add(const std::string& event) {
    absl::MutexLock l(&mu_);
    events_.push_back(event);
  }
  void Sent(int layer) {
    absl::MutexLock l(&mu_);
    events_.push_back("sent " + std::to_string(layer));
    ++sent_[layer];
  }
  int SentCount(int layer) {
    absl::MutexLock l(&mu_);
    return sent_[layer];
  }
  // Waits until layer `layer` has been sent more than `before` times; false at the bound.
  bool AwaitSent(int layer, int before) {
    absl::MutexLock l(&mu_);
    auto sent = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return sent_[layer] > before; };
    return mu_.AwaitWithTimeout(absl::Condition(&sent), kBound);
  }
  std::vector<std::string> Take() {
    absl::MutexLock l(&mu_);
    std::vector<std::string> out;
    out.swap(events_);
    return out;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> sent_ ABSL_GUARDED_BY(mu_);
};

// The real model, with each layer hook recorded and (gate on) held until that layer was sent.
class RecordingModel : public Model {
 public:
  RecordingModel(std::unique_ptr<Model> inner, EventLog* log)
      : inner_(std::move(inner)), log_(log) {}
  void set_gate(bool on) { gate_ = on; }

  const ModelConfig& config() const override { return inner_->config(); }
  Backend backend() const override { return inner_->backend(); }
  absl::StatusOr<StepOutput> Step(const StepInputs& in, const KvLayout& layout,
                                  void* pool) override {
    log_->Add("plain step");
    return inner_->Step(in, layout, pool);
  }
  absl::StatusOr<StepOutput> StepWithLayerHook(const StepInputs& in, const KvLayout& layout,
                                               void* pool, const LayerStoredHook& hook) override {
    log_->Add("push step begin");
    std::vector<int> before(static_cast<size_t>(layout.num_layers));
    for (int l = 0; l < layout.num_layers; ++l) before[l] = log_->SentCount(l);
    auto out = inner_->StepWithLayerHook(in, layout, pool, [&](int layer, void* event) {
      log_->Add("stored " + std::to_string(layer));  // before the hook lets the send start
      hook(layer, event);
      if (gate_ && !log_->AwaitSent(layer, before[layer])) {
        log_->Add("layer " + std::to_string(layer) + " was not sent during the step");
      }
    });
    log_->Add("push step end");
    return out;
  }
  absl::Status ComputeLogits(const StepInputs& in, const KvLayout& layout, void* pool,
                             float* logits) override {
    return inner_->ComputeLogits(in, layout, pool, logits);
  }
  absl::Status ReserveStep(const StepCapacity& c) override { return inner_->ReserveStep(c); }
  absl::Status Prepare(const ModelPrepareOptions& o, const KvLayout& layout, void* pool) override {
    return inner_->Prepare(o, layout, pool);
  }

 private:
  std::unique_ptr<Model> inner_;
  EventLog* log_;
  std::atomic<bool> gate_{true};
};

// Holds SendLayer(hold_layer) until released (hold_layer -1: never holds).
struct SendHold {
  absl::Mutex mu;
  int hold_layer ABSL_GUARDED_BY(mu) = -1;
  bool held ABSL_GUARDED_BY(mu) = false;  // a send is waiting at hold_layer
  bool released ABSL_GUARDED_BY(mu) = false;
  // Device mode (set before Start): the op orders its copies after events, as CUDA IPC does;
  // a copy "lands" only when the op ends (Finish), and Abort waits 50 ms for copies in flight,
  // then asks `pages_held` whether the prefill engine still holds the source pages.
  std::atomic<bool> device{false};
  std::function<bool()> pages_held;
  bool held_at_copy_end ABSL_GUARDED_BY(mu) = false;
  int enqueued_at_abort ABSL_GUARDED_BY(mu) = -1;  // -1: no Abort with copies in flight
};

class RecordingOp : public KvSendOp {
 public:
  RecordingOp(std::unique_ptr<KvSendOp> inner, EventLog* log, SendHold* hold)
      : inner_(std::move(inner)), log_(log), hold_(hold) {}
  absl::Status SendLayer(int layer, const void* pool, absl::Span<const int32_t> pages,
                         int first) override {
    {
      absl::MutexLock l(&hold_->mu);
      if (hold_->hold_layer == layer) {
        hold_->held = true;
        auto go = [this]() ABSL_SHARED_LOCKS_REQUIRED(hold_->mu) { return hold_->released; };
        hold_->mu.AwaitWithTimeout(absl::Condition(&go), kBound);
      }
    }
    absl::Status st = inner_->SendLayer(layer, pool, pages, first);
    if (st.ok()) log_->Sent(layer);
    return st;
  }
  bool OrdersAfterEvents() const override { return hold_->device; }
  absl::Status SendLayerAfterEvent(int layer, const void* pool, absl::Span<const int32_t> pages,
                                   int first, void* ready_event) override {
    if (!hold_->device) {
      return KvSendOp::SendLayerAfterEvent(layer, pool, pages, first, ready_event);
    }
    EXPECT_EQ(ready_event, nullptr);  // the CPU backend stores each layer before reporting it
    pending_.push_back({layer, pool, std::vector<int32_t>(pages.begin(), pages.end()), first});
    log_->Sent(layer);  // enqueued: the copy itself lands when the op ends
    return absl::OkStatus();
  }
  absl::StatusOr<KvTransferStats> Finish() override {
    for (const Pending& p : pending_) {  // the copies land (the source pages must be intact)
      RETURN_IF_ERROR(inner_->SendLayer(p.layer, p.pool, p.pages, p.first));
    }
    pending_.clear();
    return inner_->Finish();
  }
  void Abort(absl::string_view reason) override {
    if (!pending_.empty()) {
      absl::SleepFor(absl::Milliseconds(50));  // the copies in flight end
      const bool held = hold_->pages_held();
      absl::MutexLock l(&hold_->mu);
      hold_->held_at_copy_end = held;
      hold_->enqueued_at_abort = static_cast<int>(pending_.size());
    }
    pending_.clear();
    inner_->Abort(reason);
  }

 private:
  struct Pending {
    int layer;
    const void* pool;
    std::vector<int32_t> pages;
    int first;
  };
  std::unique_ptr<KvSendOp> inner_;
  EventLog* log_;
  SendHold* hold_;
  std::vector<Pending> pending_;  // device mode: enqueued, not landed
};

class RecordingSender : public KvSender {
 public:
  RecordingSender(EventLog* log, SendHold* hold) : log_(log), hold_(hold) {}
  absl::StatusOr<std::unique_ptr<KvSendOp>> Begin(const std::string& peer, const std::string& id,
                                                  const KvLayout& layout, int num_pages,
                                                  absl::Duration timeout,
                                                  std::function<bool()> cancelled) override {
    auto op = inner_.Begin(peer, id, layout, num_pages, timeout, std::move(cancelled));
    if (!op.ok()) return op.status();
    return std::unique_ptr<KvSendOp>(new RecordingOp(*std::move(op), log_, hold_));
  }

 private:
  TcpKvSender inner_;
  EventLog* log_;
  SendHold* hold_;
};

struct Worker {
  WorkerOptions options;
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<tandem::v1::Worker::Stub> stub;

  void Serve(std::unique_ptr<Engine> engine) {
    loop = std::make_unique<EngineLoop>(std::move(engine), service->Handlers());
    service->Attach(loop.get());
    loop->Start();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service.get());
    server = builder.BuildAndStart();
    CHECK(server != nullptr && port > 0);
    stub = tandem::v1::Worker::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                           grpc::InsecureChannelCredentials()));
  }
  void Shutdown() {
    if (server) server->Shutdown();
    if (service) service->Stop();
    loop.reset();
    service.reset();
  }
  // Nothing queued or running and no page reserved or owned (as of the loop's last pass).
  bool AwaitIdle() {
    const absl::Time deadline = absl::Now() + kBound;
    while (absl::Now() < deadline) {
      const EngineStats s = loop->stats();
      if (s.num_running == 0 && s.num_waiting == 0 && s.num_pages_reserved == 0 &&
          s.num_pages_owned == 0 && s.num_pages_free + s.num_pages_cached == s.num_pages_total) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }
};

EngineOptions Options(int budget) {
  EngineOptions o;
  o.model_dir = e2e::TinyModelDir();
  o.page_size = 16;
  o.num_pages = 128;
  o.max_num_batched_tokens = budget;
  return o;
}

tandem::v1::SamplingParams Greedy(int max_tokens) {
  tandem::v1::SamplingParams s;
  s.set_temperature(0);
  s.set_top_p(1);
  s.set_max_tokens(max_tokens);
  s.set_ignore_eos(true);
  return s;
}

class LayerPushTest : public ::testing::Test {
 protected:
  // Prefill engine with a token budget of `budget` (prompts beyond it are chunked).
  void Start(int budget) {
    prefill_.options.role = WorkerRole::kPrefill;
    prefill_.options.worker_id = "prefill-0";
    prefill_.options.kv_transfer_timeout_ms = 20000;
    EngineOptions po = Options(budget);
    absl::StatusOr<std::unique_ptr<Model>> inner = LoadModel(po.model_dir, Backend::kCpu);
    ASSERT_TRUE(inner.ok()) << inner.status();
    auto model = std::make_unique<RecordingModel>(*std::move(inner), &log_);
    model_ = model.get();
    absl::StatusOr<std::unique_ptr<Engine>> pe = Engine::CreateWithModel(po, std::move(model));
    ASSERT_TRUE(pe.ok()) << pe.status();
    WorkerEnv penv{&prefill_.options, nullptr, pe->get(), Clock::Real()};
    prefill_.service = std::make_unique<PrefillService>(
        penv, std::make_unique<RecordingSender>(&log_, &hold_), /*num_transfer_threads=*/2);
    prefill_.Serve(*std::move(pe));

    decode_.options.role = WorkerRole::kDecode;
    decode_.options.host = decode_.options.advertise_host = "127.0.0.1";
    decode_.options.worker_id = "decode-0";
    decode_.options.kv_transfer_timeout_ms = 20000;
    absl::StatusOr<std::unique_ptr<Engine>> de = Engine::Create(Options(2048));
    ASSERT_TRUE(de.ok()) << de.status();
    WorkerEnv denv{&decode_.options, nullptr, de->get(), Clock::Real()};
    auto ds = DecodeService::Create(denv);
    ASSERT_TRUE(ds.ok()) << ds.status();
    decode_.service = *std::move(ds);
    decode_.Serve(*std::move(de));
  }
  void TearDown() override {
    prefill_.Shutdown();
    decode_.Shutdown();
  }

  tandem::v1::ReservePagesResponse Reserve(const std::string& id, int n) {
    tandem::v1::ReservePagesRequest req;
    req.set_request_id(id);
    req.set_num_prompt_tokens(n);
    req.set_max_tokens(8);
    tandem::v1::ReservePagesResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st = decode_.stub->ReservePages(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }
  tandem::v1::PrefillRequest PrefillFor(const std::string& id, const std::vector<int32_t>& prompt,
                                        const tandem::v1::ReservePagesResponse& r,
                                        int max_tokens = 8) {
    tandem::v1::PrefillRequest req;
    req.set_request_id(id);
    req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
    *req.mutable_sampling() = Greedy(max_tokens);
    auto* d = req.mutable_destination();
    d->set_decode_worker_id(r.decode_worker_id());
    d->set_kv_transfer_address(r.kv_transfer_address());
    *d->mutable_page_ids() = r.page_ids();
    d->set_transfer_id(id);
    return req;
  }
  std::vector<int32_t> Decode(const std::string& id, const std::vector<int32_t>& prompt,
                              int32_t first, grpc::Status* status) {
    tandem::v1::GenerateFromPrefillRequest req;
    req.set_request_id(id);
    req.mutable_prompt_tokens()->Assign(prompt.begin(), prompt.end());
    *req.mutable_sampling() = Greedy(8);
    req.set_first_token(first);
    grpc::ClientContext ctx;
    auto reader = decode_.stub->GenerateFromPrefill(&ctx, req);
    std::vector<int32_t> tokens = {first};
    tandem::v1::TokenEvent ev;
    while (reader->Read(&ev))
      tokens.insert(tokens.end(), ev.token_ids().begin(), ev.token_ids().end());
    *status = reader->Finish();
    return tokens;
  }
  bool Abort(Worker& w, const std::string& id) {
    tandem::v1::AbortRequest req;
    req.set_request_id(id);
    tandem::v1::AbortResponse resp;
    grpc::ClientContext ctx;
    return w.stub->Abort(&ctx, req, &resp).ok() && resp.found();
  }
  void HoldSendOfLayer(int layer) {
    absl::MutexLock l(&hold_.mu);
    hold_.hold_layer = layer;
    hold_.held = hold_.released = false;
  }
  bool AwaitHeld() {
    absl::MutexLock l(&hold_.mu);
    auto held = [this]() ABSL_SHARED_LOCKS_REQUIRED(hold_.mu) { return hold_.held; };
    return hold_.mu.AwaitWithTimeout(absl::Condition(&held), kBound);
  }
  void ReleaseSend() {
    absl::MutexLock l(&hold_.mu);
    hold_.released = true;
  }
  int num_layers() const { return prefill_.loop->engine().kv_layout().num_layers; }

  EventLog log_;
  SendHold hold_;
  RecordingModel* model_ = nullptr;
  Worker prefill_;
  Worker decode_;
};

// Index of `event` in `events`, or -1.
int IndexOf(const std::vector<std::string>& events, const std::string& event) {
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i] == event) return static_cast<int>(i);
  }
  return -1;
}

TEST_F(LayerPushTest, EachLayerIsSentDuringTheFinalChunkAndTokensMatchOneEngine) {
  Start(/*budget=*/32);
  const int layers = num_layers();
  ASSERT_GE(layers, 2);
  // 5 and 32 tokens: one chunk; 33, 90, 161: two to six chunks of the 32-token budget.
  for (int n : {5, 32, 33, 90, 161}) {
    const std::string id = "push-" + std::to_string(n);
    const std::vector<int32_t> prompt = e2e::Prompt(n, 1000 + n);
    e2e::GenerateArgs ref;
    ref.prompt = prompt;
    ref.max_tokens = 8;
    ref.ignore_eos = true;
    const std::vector<int32_t> want = e2e::ReferenceGreedy(e2e::TinyModelDir(), ref);
    log_.Take();
    const auto r = Reserve(id, n);
    grpc::ClientContext pctx;
    auto preader = prefill_.stub->Prefill(&pctx, PrefillFor(id, prompt, r));
    tandem::v1::PrefillEvent ev;
    ASSERT_TRUE(preader->Read(&ev));
    ASSERT_TRUE(ev.has_first_token());
    const int32_t first = ev.first_token().token_id();
    ASSERT_TRUE(preader->Read(&ev));
    ASSERT_TRUE(ev.has_transfer_done());
    EXPECT_FALSE(preader->Read(&ev));
    ASSERT_TRUE(preader->Finish().ok());
    grpc::Status dstatus;
    EXPECT_EQ(Decode(id, prompt, first, &dstatus), want) << id;
    EXPECT_TRUE(dstatus.ok()) << dstatus.error_message();

    const std::vector<std::string> events = log_.Take();
    std::string all;
    for (const std::string& e : events) all += e + "; ";
    // Chunks before the last run plainly and move no page; exactly one step pushes.
    const int chunks = (n + 31) / 32;
    int plain = 0, pushes = 0;
    for (const std::string& e : events) {
      plain += e == "plain step";
      pushes += e == "push step begin";
      EXPECT_EQ(e.find("was not sent"), std::string::npos) << all;
    }
    EXPECT_EQ(plain, chunks - 1) << all;
    EXPECT_EQ(pushes, 1) << all;
    const int begin = IndexOf(events, "push step begin");
    const int end = IndexOf(events, "push step end");
    for (int i = 0; i < begin; ++i) EXPECT_EQ(events[i].rfind("sent", 0), std::string::npos) << all;
    for (int l = 0; l < layers; ++l) {
      const int stored = IndexOf(events, "stored " + std::to_string(l));
      const int sent = IndexOf(events, "sent " + std::to_string(l));
      ASSERT_GE(stored, 0) << all;
      ASSERT_GE(sent, 0) << all;
      EXPECT_LT(begin, stored) << all;
      EXPECT_LT(stored, sent) << all;
      EXPECT_LT(sent, end) << "layer " << l << " sent after the step: " << all;
      if (l + 1 < layers) {
        EXPECT_LT(sent, IndexOf(events, "stored " + std::to_string(l + 1))) << all;
      }
    }
  }
  EXPECT_TRUE(prefill_.AwaitIdle());
  EXPECT_TRUE(decode_.AwaitIdle());
}

// Device mode (CUDA IPC's contract: SendLayerAfterEvent enqueues, the copies land by the op's
// end): the layer-wise push gives one engine's tokens, and when the first token ends the
// request the engine frees the source pages only after the op's Abort waited for the copies in
// flight (the prefill loop's stats still show the pages held when they end; with BeforeFree not
// waiting for them the step would have freed the pages during that wait).
TEST_F(LayerPushTest, DeviceCopiesAreEnqueuedPerLayerAndTheSourcePagesOutliveThem) {
  hold_.device = true;
  hold_.pages_held = [this] { return prefill_.loop->stats().num_pages_owned > 0; };
  Start(/*budget=*/32);
  for (int n : {5, 33, 90}) {
    const std::string id = "device-" + std::to_string(n);
    const std::vector<int32_t> prompt = e2e::Prompt(n, 2000 + n);
    e2e::GenerateArgs ref;
    ref.prompt = prompt;
    ref.max_tokens = 8;
    ref.ignore_eos = true;
    const auto r = Reserve(id, n);
    grpc::ClientContext pctx;
    auto preader = prefill_.stub->Prefill(&pctx, PrefillFor(id, prompt, r));
    tandem::v1::PrefillEvent ev;
    ASSERT_TRUE(preader->Read(&ev));
    ASSERT_TRUE(ev.has_first_token());
    const int32_t first = ev.first_token().token_id();
    ASSERT_TRUE(preader->Read(&ev));
    ASSERT_TRUE(ev.has_transfer_done());
    EXPECT_FALSE(preader->Read(&ev));
    ASSERT_TRUE(preader->Finish().ok());
    grpc::Status dstatus;
    EXPECT_EQ(Decode(id, prompt, first, &dstatus), e2e::ReferenceGreedy(e2e::TinyModelDir(), ref))
        << id;
    EXPECT_TRUE(dstatus.ok()) << dstatus.error_message();
  }
  // max_tokens 1: the first token ends the request in the step that enqueued every layer.
  const std::vector<int32_t> prompt = e2e::Prompt(70, 7);
  const auto r = Reserve("stop-1", 70);
  grpc::ClientContext pctx;
  auto preader = prefill_.stub->Prefill(&pctx, PrefillFor("stop-1", prompt, r, 1));
  tandem::v1::PrefillEvent ev;
  ASSERT_TRUE(preader->Read(&ev));
  EXPECT_EQ(ev.first_token().finish_reason(), tandem::v1::FINISH_REASON_LENGTH);
  EXPECT_FALSE(preader->Read(&ev));
  EXPECT_TRUE(preader->Finish().ok());
  {
    absl::MutexLock l(&hold_.mu);
    EXPECT_EQ(hold_.enqueued_at_abort, num_layers());  // every layer was in flight
    EXPECT_TRUE(hold_.held_at_copy_end) << "the source pages were freed under their copies";
  }
  Abort(decode_, "stop-1");
  EXPECT_TRUE(prefill_.AwaitIdle());
  EXPECT_TRUE(decode_.AwaitIdle());
}

TEST_F(LayerPushTest, FirstTokenEndingTheRequestAbandonsThePushAndFreesBothSides) {
  Start(/*budget=*/32);
  model_->set_gate(false);  // no layer is waited for: the push may be anywhere when it ends
  const std::vector<int32_t> prompt = e2e::Prompt(70, 7);
  const auto r = Reserve("stop-1", 70);
  grpc::ClientContext pctx;
  // max_tokens 1: the first token is the last (kLength): the pages are freed in that step.
  auto preader = prefill_.stub->Prefill(&pctx, PrefillFor("stop-1", prompt, r, 1));
  tandem::v1::PrefillEvent ev;
  ASSERT_TRUE(preader->Read(&ev));
  ASSERT_TRUE(ev.has_first_token());
  EXPECT_EQ(ev.first_token().finish_reason(), tandem::v1::FINISH_REASON_LENGTH);
  EXPECT_FALSE(preader->Read(&ev));  // no transfer_done
  EXPECT_TRUE(preader->Finish().ok());
  // The router releases the reservation (the transfer itself was aborted or never finished).
  Abort(decode_, "stop-1");
  EXPECT_TRUE(prefill_.AwaitIdle());
  EXPECT_TRUE(decode_.AwaitIdle());
}

TEST_F(LayerPushTest, AbortMidTransferFreesBothSides) {
  Start(/*budget=*/32);
  model_->set_gate(false);
  HoldSendOfLayer(1);
  const std::vector<int32_t> prompt = e2e::Prompt(50, 9);
  const auto r = Reserve("abort-1", 50);
  grpc::ClientContext pctx;
  auto preader = prefill_.stub->Prefill(&pctx, PrefillFor("abort-1", prompt, r));
  tandem::v1::PrefillEvent ev;
  ASSERT_TRUE(preader->Read(&ev));  // the first token: the prompt is computed, layer 1 held
  ASSERT_TRUE(ev.has_first_token());
  ASSERT_TRUE(AwaitHeld());
  EXPECT_TRUE(Abort(prefill_, "abort-1"));
  EXPECT_TRUE(Abort(decode_, "abort-1"));  // the router aborts both sides
  ReleaseSend();
  EXPECT_FALSE(preader->Read(&ev));
  const grpc::Status st = preader->Finish();
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(prefill_.AwaitIdle());
  EXPECT_TRUE(decode_.AwaitIdle());
}

TEST_F(LayerPushTest, DecodeGivingUpMidTransferFailsThePrefillAndFreesBothSides) {
  Start(/*budget=*/32);
  model_->set_gate(false);
  HoldSendOfLayer(1);
  const std::vector<int32_t> prompt = e2e::Prompt(40, 11);
  const auto r = Reserve("gone-1", 40);
  grpc::ClientContext pctx;
  auto preader = prefill_.stub->Prefill(&pctx, PrefillFor("gone-1", prompt, r));
  tandem::v1::PrefillEvent ev;
  ASSERT_TRUE(preader->Read(&ev));
  ASSERT_TRUE(AwaitHeld());
  EXPECT_TRUE(Abort(decode_, "gone-1"));  // the receiver cancels: the next page write fails
  ReleaseSend();
  EXPECT_FALSE(preader->Read(&ev));
  const grpc::Status st = preader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_TRUE(prefill_.AwaitIdle());
  EXPECT_TRUE(decode_.AwaitIdle());
}

}  // namespace
}  // namespace tandem
