#include "loadgen/grpc_target.h"

#include <grpcpp/grpcpp.h>

#include <boost/asio.hpp>
#include <unordered_set>
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded

#include "absl/strings/str_cat.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::loadgen {

namespace asio = boost::asio;
namespace v1 = tandem::v1;

namespace {

constexpr auto kAwait = asio::use_awaitable;

std::chrono::system_clock::time_point Deadline(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

ServerTiming FromProto(const v1::PhaseTimings& t) {
  ServerTiming s;
  s.queue_ms = (t.queue_s() + t.prefill_queue_s()) * 1e3;
  s.prefill_ms = t.prefill_s() * 1e3;
  s.kv_transfer_ms = t.kv_transfer_s() * 1e3;
  s.first_decode_ms = t.first_decode_step_s() * 1e3;
  return s;
}

// One Generate stream. gRPC threads run OnReadDone/OnDone and write the record; OnDone posts
// completion to the io thread, which owns the call and frees it after `done`.
class GenerateCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateCall(asio::io_context& io, const BenchClock* clock, RequestRecord* rec, bool keep_text)
      : wake(io), io_(io), clock_(clock), rec_(rec), keep_text_(keep_text) {}

  void Start(v1::Generation::Stub* stub, const v1::GenerateRequest& request) {
    request_ = request;
    stub->async()->Generate(&context, &request_, this);
    StartRead(&response_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    int64_t now = clock_->Now();
    if (response_.token_ids_size() > 0 || !response_.text().empty()) {
      rec_->chunk_ns.push_back(now);
      if (keep_text_) rec_->generated_text += response_.text();
    }
    if (response_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      rec_->prompt_len = response_.usage().prompt_tokens();
      rec_->output_tokens = response_.usage().completion_tokens();
      if (response_.has_timings()) rec_->server_timing = FromProto(response_.timings());
      if (response_.finish_reason() == v1::FINISH_REASON_ERROR) {
        stream_error = response_.error_message().empty() ? "error" : response_.error_message();
      }
    }
    StartRead(&response_);
  }
  void OnDone(const grpc::Status& s) override {
    status = s;
    asio::post(io_, [this] {
      done = true;
      wake.cancel();
    });
  }

  grpc::ClientContext context;
  grpc::Status status;
  std::optional<std::string> stream_error;
  bool done = false;  // io thread only
  asio::steady_timer wake;

 private:
  asio::io_context& io_;
  const BenchClock* clock_;
  RequestRecord* rec_;
  bool keep_text_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
};

}  // namespace

struct GrpcTarget::Impl {
  asio::io_context& io;
  const BenchClock* clock;
  GrpcTargetOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Generation::Stub> stub;
  std::unordered_set<GenerateCall*> active;  // io thread only
  bool cancelling = false;

  v1::GenerateRequest Request(const RequestSpec& spec) const {
    v1::GenerateRequest r;
    r.set_model(options.model);
    if (options.chat) {
      v1::ChatMessage* m = r.mutable_messages()->add_messages();
      m->set_role("user");
      m->set_content(spec.prompt);
    } else {
      r.set_prompt(spec.prompt);
    }
    v1::SamplingOptions* s = r.mutable_sampling();
    s->set_max_tokens(spec.output_len);
    s->set_ignore_eos(options.ignore_eos);
    if (options.temperature) s->set_temperature(static_cast<float>(*options.temperature));
    return r;
  }
  void Finish(const GenerateCall& call, RequestRecord* rec) const;
};

void GrpcTarget::Impl::Finish(const GenerateCall& call, RequestRecord* rec) const {
  if (rec->output_tokens < 0) rec->output_tokens = static_cast<int>(rec->chunk_ns.size());
  const grpc::Status& s = call.status;
  rec->success = false;
  if (s.error_code() == grpc::StatusCode::CANCELLED && cancelling) {
    rec->cause = FailureCause::kCancelled;
    rec->error = "cancelled";
  } else if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    rec->cause = FailureCause::kTimeout;
    rec->error = "request timed out";
  } else if (!s.ok()) {
    bool connect = s.error_code() == grpc::StatusCode::UNAVAILABLE && rec->chunk_ns.empty();
    rec->cause = connect ? FailureCause::kConnect : FailureCause::kGrpcStatus;
    rec->error =
        absl::StrCat("gRPC status ", static_cast<int>(s.error_code()), ": ", s.error_message());
  } else if (call.stream_error) {
    rec->cause = FailureCause::kStreamError;
    rec->error = *call.stream_error;
  } else if (rec->chunk_ns.empty()) {
    rec->cause = FailureCause::kNoToken;
    rec->error = "Never received a valid chunk to calculate TTFT.";
  } else {
    rec->success = true;
  }
}

GrpcTarget::GrpcTarget(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrpcTarget::~GrpcTarget() = default;

absl::StatusOr<std::unique_ptr<GrpcTarget>> GrpcTarget::Create(asio::io_context& io,
                                                               const BenchClock* clock,
                                                               GrpcTargetOptions options) {
  auto impl = std::unique_ptr<Impl>(new Impl{io, clock, std::move(options), nullptr, nullptr, {}});
  impl->channel = grpc::CreateChannel(impl->options.address, grpc::InsecureChannelCredentials());
  impl->stub = v1::Generation::NewStub(impl->channel);
  return std::unique_ptr<GrpcTarget>(new GrpcTarget(std::move(impl)));
}

void GrpcTarget::CancelAll() {
  impl_->cancelling = true;
  for (GenerateCall* call : impl_->active) call->context.TryCancel();
}

asio::awaitable<void> GrpcTarget::Send(const RequestSpec& spec, RequestRecord* rec) {
  auto call =
      std::make_unique<GenerateCall>(impl_->io, impl_->clock, rec, impl_->options.keep_text);
  call->context.set_deadline(Deadline(impl_->options.request_timeout_s));
  if (!impl_->options.api_key.empty()) {
    call->context.AddMetadata("authorization", "Bearer " + impl_->options.api_key);
  }
  impl_->active.insert(call.get());
  rec->send_ns = impl_->clock->Now();
  call->Start(impl_->stub.get(), impl_->Request(spec));
  boost::system::error_code ec;
  while (!call->done) {
    call->wake.expires_at(asio::steady_timer::time_point::max());
    co_await call->wake.async_wait(asio::redirect_error(kAwait, ec));
  }
  impl_->active.erase(call.get());
  if (rec->prompt_len <= 0) rec->prompt_len = spec.prompt_len;
  impl_->Finish(*call, rec);
}

absl::StatusOr<std::string> FetchFirstGrpcModelId(const std::string& address) {
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(Deadline(10));
  v1::ListModelsResponse response;
  grpc::Status s = stub->ListModels(&context, v1::ListModelsRequest(), &response);
  if (!s.ok() || response.models_size() == 0) {
    return absl::UnavailableError(
        absl::StrCat("ListModels on ", address, " failed: ", s.error_message(), "; pass --model"));
  }
  return response.models(0).id();
}

}  // namespace tandem::loadgen
