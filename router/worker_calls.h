// Asynchronous calls to workers on gRPC's callback API: no thread is held per in-flight request.
// Callbacks run on gRPC's threads and must not block.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <utility>

#include "absl/time/time.h"
#include "base/clock.h"

namespace tandem::router {

// Reads a server stream. The reactor owns the request (gRPC serializes it lazily) and deletes
// itself after on_done. Cancel through the ClientContext (TryCancel), which the caller keeps
// alive (shared) at least until on_done has run.
template <typename Request, typename Response>
class StreamReader : public grpc::ClientReadReactor<Response> {
 public:
  using MessageFn = std::function<void(const Response&)>;
  using DoneFn = std::function<void(const grpc::Status&)>;

  // `start(context, request, reactor)` binds the call, e.g.
  //   [stub](auto* c, auto* r, auto* x) { stub->async()->Prefill(c, r, x); }
  template <typename StartFn>
  static void Start(std::shared_ptr<grpc::ClientContext> context, Request request, StartFn start,
                    MessageFn on_message, DoneFn on_done) {
    auto* reactor = new StreamReader(std::move(context), std::move(request), std::move(on_message),
                                     std::move(on_done));
    start(reactor->context_.get(), &reactor->request_, reactor);
    reactor->StartRead(&reactor->response_);
    reactor->StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    on_message_(response_);
    this->StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    on_done_(status);
    delete this;
  }

 private:
  StreamReader(std::shared_ptr<grpc::ClientContext> context, Request request, MessageFn on_message,
               DoneFn on_done)
      : context_(std::move(context)),
        request_(std::move(request)),
        on_message_(std::move(on_message)),
        on_done_(std::move(on_done)) {}

  std::shared_ptr<grpc::ClientContext> context_;
  Request request_;
  Response response_;
  MessageFn on_message_;
  DoneFn on_done_;
};

// A unary call whose request, response and context live until `done` has run.
template <typename Request, typename Response>
struct UnaryCall {
  grpc::ClientContext context;
  Request request;
  Response response;

  // `start(context, request, response, callback)` binds the call, e.g.
  //   [stub](auto* c, auto* q, auto* r, auto cb) { stub->async()->Abort(c, q, r, cb); }
  template <typename StartFn>
  static void Start(Request request, absl::Duration timeout, StartFn start,
                    std::function<void(const grpc::Status&, const Response&)> done) {
    auto call = std::make_shared<UnaryCall>();
    call->request = std::move(request);
    // gRPC measures the deadline itself: real time, whatever clock the caller runs on.
    call->context.set_deadline(absl::ToChronoTime(Clock::Real()->Now() + timeout));
    start(&call->context, &call->request, &call->response,
          [call, done = std::move(done)](grpc::Status status) { done(status, call->response); });
  }
};

}  // namespace tandem::router
