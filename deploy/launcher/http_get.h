// A minimal blocking HTTP/1.1 GET for readiness probes (no TLS, Connection: close).
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

}  // namespace tandem::launcher
