#include "base/listen_error.h"

#include "absl/strings/cord.h"

namespace tandem {
namespace {
constexpr char kPayloadUrl[] = "tandem/port-taken";
}  // namespace

absl::Status PortTakenError(absl::string_view message) {
  absl::Status s = absl::UnavailableError(message);
  s.SetPayload(kPayloadUrl, absl::Cord("1"));
  return s;
}

bool IsPortTaken(const absl::Status& status) { return status.GetPayload(kPayloadUrl).has_value(); }

}  // namespace tandem
