// GrpcTarget: tandem's gRPC Generation API (proto/tandem/v1/generate.proto), one server stream
// per request on the gRPC callback API. Token timestamps are taken on the gRPC thread that
// delivers each message (so they do not wait for the io thread); completion is handed back to
// the benchmark's io_context. A message counts as a token chunk when it carries token ids or
// text; the terminal message's usage and PhaseTimings fill the record.
#pragma once

#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "loadgen/bench_clock.h"
#include "loadgen/target.h"

namespace tandem::loadgen {

struct GrpcTargetOptions {
  std::string address = "127.0.0.1:8001";  // host:port of the router's gRPC port
  std::string model;                       // empty: the one served model
  bool chat = false;
  bool ignore_eos = false;
  std::optional<double> temperature;
  std::string api_key;  // sent as "authorization: Bearer <key>" metadata
  bool keep_text = false;
  double request_timeout_s = 6 * 3600;
};

class GrpcTarget : public Target {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcTarget>> Create(boost::asio::io_context& io,
                                                            const BenchClock* clock,
                                                            GrpcTargetOptions options);
  ~GrpcTarget() override;

  boost::asio::awaitable<void> Send(const RequestSpec& spec, RequestRecord* record) override;
  void CancelAll() override;

  struct Impl;

 private:
  explicit GrpcTarget(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ListModels on `address` and return the first id (blocking).
absl::StatusOr<std::string> FetchFirstGrpcModelId(const std::string& address);

}  // namespace tandem::loadgen
