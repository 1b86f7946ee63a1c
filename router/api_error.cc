#include "router/api_error.h"

#include "absl/strings/cord.h"
#include "absl/types/optional.h"

namespace tandem::router {
namespace {
constexpr char kParamPayload[] = "tandem.router/param";
}  // namespace

absl::Status InvalidParam(absl::string_view param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(message), param);
}

absl::Status WithParam(absl::Status status, absl::string_view param) {
  if (!status.ok() && !param.empty()) status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

std::string ParamOf(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kParamPayload);
  return payload ? std::string(*payload) : std::string();
}

int HttpStatusFor(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kPermissionDenied:
      return 403;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kCancelled:
      return 499;
    case absl::StatusCode::kUnimplemented:
      return 501;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    default:
      return 500;
  }
}

std::string ErrorTypeFor(int http_status) {
  switch (http_status) {
    case 400:
      return "BadRequestError";
    case 401:
      return "AuthenticationError";
    case 403:
      return "PermissionDeniedError";
    case 404:
      return "NotFoundError";
    case 405:
      return "MethodNotAllowedError";
    case 413:
      return "RequestTooLargeError";
    case 429:
      return "RateLimitError";
    case 501:
      return "NotImplementedError";
    case 503:
      return "ServiceUnavailableError";
    case 504:
      return "GatewayTimeoutError";
    default:
      return "InternalServerError";
  }
}

}  // namespace tandem::router
