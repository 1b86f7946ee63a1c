#include "tests/router/fake_worker.h"

#include "absl/strings/str_cat.h"
#include "rpc/cluster_auth.h"
#include "rpc/peer_fault.h"

namespace tandem::router::testing {
namespace {

using tandem::v1::FINISH_REASON_LENGTH;
using tandem::v1::FINISH_REASON_STOP;

constexpr int32_t kEos = 257;

}  // namespace

FakeWorker::FakeWorker(FakeWorkerOptions options) : options_(std::move(options)) {}

FakeWorker::~FakeWorker() { Kill(); }

absl::Status FakeWorker::Start(const std::string& router_address) {
  int port = 0;
  grpc::ServerBuilder builder;
  if (options_.control_plane_server_args) ApplyControlPlaneServerArgs(builder);
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) return absl::UnavailableError("fake worker: no port");
  address_ = absl::StrCat("127.0.0.1:", port);
  registry_ = tandem::v1::WorkerRegistry::NewStub(
      ClusterChannel(router_address, options_.cluster_token, ControlPlaneChannelArgs()));
  absl::Status status = Register();
  if (!status.ok()) return status;
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

absl::Status FakeWorker::Register() {
  tandem::v1::RegisterRequest request;
  request.set_protocol_version(static_cast<tandem::v1::ProtocolVersion>(options_.protocol_version));
  request.set_worker_id(options_.id);
  request.set_instance_id(options_.instance_id);
  request.set_role(options_.role);
  request.set_address(address_);
  request.set_kv_transfer_address(address_);
  request.mutable_model()->set_name("tiny");
  request.mutable_kv_pool()->set_page_size(16);
  request.mutable_kv_pool()->set_num_pages(options_.num_pages);
  tandem::v1::RegisterResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(Clock::Real()->Now() + absl::Seconds(5)));
  grpc::Status status = registry_->Register(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  absl::MutexLock lock(&mu_);
  epoch_ = response.epoch();
  return absl::OkStatus();
}

void FakeWorker::HeartbeatLoop() {
  while (!stop_) {
    Sleep(Clock::Real(), options_.heartbeat_ms);
    if (stop_) break;
    tandem::v1::HeartbeatRequest request;
    request.set_worker_id(options_.id);
    request.set_instance_id(options_.instance_id);
    {
      absl::MutexLock lock(&mu_);
      request.set_epoch(epoch_);
      request.mutable_load()->set_num_pages_total(options_.num_pages);
      request.mutable_load()->set_num_pages_free(options_.num_pages -
                                                 static_cast<int>(reserved_.size()));
    }
    request.mutable_load()->set_num_running(streams_open_);
    tandem::v1::HeartbeatResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(Clock::Real()->Now() + absl::Seconds(1)));
    if (registry_->Heartbeat(&context, request, &response).ok() && response.reregister()) {
      Register().IgnoreError();
    }
  }
}

grpc::Status FakeWorker::Authenticate(const grpc::ServerContext* context) const {
  return CheckClusterToken(*context, options_.cluster_token);
}

void FakeWorker::Sleep(Clock* clock, int ms) {
  if (ms <= 0) return;
  absl::MutexLock lock(&mu_);
  clock->AwaitWithTimeout(&mu_, absl::Condition(&dying_), absl::Milliseconds(ms));
}

void FakeWorker::Kill() {
  if (killed_.exchange(true)) return;
  stop_ = true;
  {
    absl::MutexLock lock(&mu_);
    dying_ = true;
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now());
}

int FakeWorker::aborts() const {
  absl::MutexLock lock(&mu_);
  return aborts_;
}

std::set<std::string> FakeWorker::aborted_ids() const {
  absl::MutexLock lock(&mu_);
  return aborted_;
}

std::vector<std::string> FakeWorker::request_ids() const {
  absl::MutexLock lock(&mu_);
  return request_ids_;
}

int FakeWorker::reservations_held() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(reserved_.size());
}

int32_t FakeWorker::TokenAt(int index) const {
  if (options_.eos_after >= 0 && index == options_.eos_after) return kEos;
  return static_cast<unsigned char>(options_.text[index % options_.text.size()]);
}

bool FakeWorker::Stopped(grpc::ServerContext* context, const std::string& id) {
  if (context->IsCancelled() || killed_) {
    ++cancelled_streams_;
    return true;
  }
  absl::MutexLock lock(&mu_);
  return aborted_.count(id) > 0;
}

grpc::Status FakeWorker::ReservePages(grpc::ServerContext* context,
                                      const tandem::v1::ReservePagesRequest* request,
                                      tandem::v1::ReservePagesResponse* response) {
  if (grpc::Status st = Authenticate(context); !st.ok()) return st;
  ++reservations_started_;
  if (options_.reserve_delay_ms > 0) Sleep(options_.clock, options_.reserve_delay_ms);
  if (options_.refuse_reservations) {
    ++reservations_refused_;
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no free pages");
  }
  absl::MutexLock lock(&mu_);
  reserved_.insert(request->request_id());
  request_ids_.push_back(request->request_id());
  const int pages = (request->num_prompt_tokens() + 1 + 15) / 16;
  for (int i = 0; i < pages; ++i) response->add_page_ids(i);
  response->set_kv_transfer_address(address_);
  response->set_decode_worker_id(options_.id);
  response->set_page_size(16);
  return grpc::Status::OK;
}

grpc::Status FakeWorker::Prefill(grpc::ServerContext* context,
                                 const tandem::v1::PrefillRequest* request,
                                 grpc::ServerWriter<tandem::v1::PrefillEvent>* writer) {
  if (grpc::Status st = Authenticate(context); !st.ok()) return st;
  ++streams_open_;
  ++requests_served_;
  Sleep(options_.clock, options_.prefill_delay_ms + options_.token_delay_ms);
  grpc::Status result = grpc::Status::OK;
  tandem::v1::PrefillEvent first;
  first.mutable_first_token()->set_token_id(TokenAt(0));
  first.mutable_first_token()->set_prefill_s(0.001);
  first.mutable_first_token()->set_num_cached_tokens(options_.cached_tokens);
  const bool eos = TokenAt(0) == kEos && !request->sampling().ignore_eos();
  if (eos) first.mutable_first_token()->set_finish_reason(FINISH_REASON_STOP);
  if (request->sampling().max_tokens() == 1) {
    first.mutable_first_token()->set_finish_reason(FINISH_REASON_LENGTH);
  }
  if (Stopped(context, request->request_id())) {
    result = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  } else if (!writer->Write(first)) {
    result = grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
  } else if ((first.first_token().finish_reason() == tandem::v1::FINISH_REASON_UNSPECIFIED ||
              request->keep_kv_when_finished()) &&
             options_.transfer_fails) {
    AddPeerFaultTrailer(context, MarkPeerFault(absl::UnavailableError("x"), "decode"));
    result = grpc::Status(grpc::StatusCode::UNAVAILABLE, "KV transfer to decode failed: refused");
  } else if (first.first_token().finish_reason() == tandem::v1::FINISH_REASON_UNSPECIFIED ||
             request->keep_kv_when_finished()) {
    Sleep(options_.clock, options_.token_delay_ms);  // the "transfer"
    tandem::v1::PrefillEvent done;
    done.mutable_transfer_done()->set_bytes(4096);
    done.mutable_transfer_done()->set_kv_transfer_s(0.002);
    if (Stopped(context, request->request_id())) {
      result = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    } else {
      writer->Write(done);
    }
  }
  --streams_open_;
  return result;
}

grpc::Status FakeWorker::StreamTokens(grpc::ServerContext* context, const std::string& id, int from,
                                      int num_siblings, bool skip_first,
                                      const tandem::v1::SamplingParams& sampling,
                                      grpc::ServerWriter<tandem::v1::TokenEvent>* writer) {
  for (int s = skip_first ? 1 : 0; s <= num_siblings; ++s) {
    // Siblings sample their own first token here (from 0); sequence 0's came from prefill.
    for (int i = s == 0 ? from : 0; i < sampling.max_tokens(); ++i) {
      Sleep(options_.clock, options_.token_delay_ms);
      if (Stopped(context, id)) return grpc::Status(grpc::StatusCode::CANCELLED, "stopped");
      tandem::v1::TokenEvent event;
      event.set_sequence(s);
      const int32_t token = TokenAt(i);
      event.add_token_ids(token);
      if (i == 0 || i == from) event.mutable_timings()->set_first_decode_step_s(0.003);
      if (token == kEos && !sampling.ignore_eos()) {
        event.set_finish_reason(FINISH_REASON_STOP);
      } else if (i + 1 == sampling.max_tokens()) {
        event.set_finish_reason(FINISH_REASON_LENGTH);
      }
      if (!writer->Write(event)) return grpc::Status(grpc::StatusCode::CANCELLED, "client gone");
      if (event.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) break;
    }
  }
  return grpc::Status::OK;
}

grpc::Status FakeWorker::GenerateFromPrefill(grpc::ServerContext* context,
                                             const tandem::v1::GenerateFromPrefillRequest* request,
                                             grpc::ServerWriter<tandem::v1::TokenEvent>* writer) {
  if (grpc::Status st = Authenticate(context); !st.ok()) return st;
  {
    absl::MutexLock lock(&mu_);
    if (reserved_.count(request->request_id()) == 0) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no reservation");
    }
    if (options_.transfer_fails) {
      reserved_.erase(request->request_id());
      AddPeerFaultTrailer(context, MarkPeerFault(absl::UnavailableError("x"), "prefill"));
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "KV transfer from prefill failed");
    }
  }
  ++streams_open_;
  ++requests_served_;
  grpc::Status status = StreamTokens(context, request->request_id(), 1, request->siblings_size(),
                                     request->first_token_finished(), request->sampling(), writer);
  {
    absl::MutexLock lock(&mu_);
    reserved_.erase(request->request_id());
  }
  --streams_open_;
  return status;
}

grpc::Status FakeWorker::Generate(grpc::ServerContext* context,
                                  const tandem::v1::WorkerGenerateRequest* request,
                                  grpc::ServerWriter<tandem::v1::TokenEvent>* writer) {
  if (grpc::Status st = Authenticate(context); !st.ok()) return st;
  {
    absl::MutexLock lock(&mu_);
    request_ids_.push_back(request->request_id());
  }
  ++streams_open_;
  ++requests_served_;
  grpc::Status status = StreamTokens(context, request->request_id(), 0, request->siblings_size(),
                                     /*skip_first=*/false, request->sampling(), writer);
  --streams_open_;
  return status;
}

grpc::Status FakeWorker::Abort(grpc::ServerContext* context,
                               const tandem::v1::AbortRequest* request,
                               tandem::v1::AbortResponse* response) {
  if (grpc::Status st = Authenticate(context); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  ++aborts_;
  aborted_.insert(request->request_id());
  response->set_found(reserved_.erase(request->request_id()) > 0);
  return grpc::Status::OK;
}

grpc::Status FakeWorker::GetLoad(grpc::ServerContext* context, const tandem::v1::GetLoadRequest*,
                                 tandem::v1::LoadReport* response) {
  if (grpc::Status st = Authenticate(context); !st.ok()) return st;
  response->set_num_running(streams_open_);
  return grpc::Status::OK;
}

}  // namespace tandem::router::testing
