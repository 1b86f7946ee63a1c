// Errors as the API reports them: an absl::Status whose code picks the HTTP status and gRPC code
// (docs/style.md: InvalidArgument → 400, Unauthenticated → 401, NotFound → 404, ResourceExhausted →
// 429, Unavailable → 503, DeadlineExceeded → 504) plus the offending request field ("param" in
// the OpenAI envelope), carried as a status payload so it survives RETURN_IF_ERROR.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem::router {

// InvalidArgument naming the request field `param`.
absl::Status InvalidParam(absl::string_view param, absl::string_view message);
// Attaches `param` to any status.
absl::Status WithParam(absl::Status status, absl::string_view param);
// The param attached to `status`, or "" if none.
std::string ParamOf(const absl::Status& status);

// HTTP status for an error status (500 for codes with no better mapping).
int HttpStatusFor(const absl::Status& status);
// OpenAI-style error type for an HTTP status ("BadRequestError", "NotFoundError", ...).
std::string ErrorTypeFor(int http_status);

}  // namespace tandem::router
