// A minimal blocking HTTP/1.1 client for readiness probes and tests (no TLS, no chunked
// decoding, Connection: close).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::launcher {

struct HttpResponse {
  int status = 0;
  std::string body;
};

absl::StatusOr<HttpResponse> HttpGet(const std::string& host_port, const std::string& path,
                                     absl::Duration timeout);
// POST with a JSON body (Content-Type: application/json).
absl::StatusOr<HttpResponse> HttpPostJson(const std::string& host_port, const std::string& path,
                                          const std::string& json, absl::Duration timeout);

}  // namespace tandem::launcher
