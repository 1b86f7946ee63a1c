#include "base/accept_backoff.h"

#include <cerrno>

#include "absl/strings/str_cat.h"

namespace tandem {

bool AcceptBackoff::IsResourceExhaustion(int error) {
  return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM;
}

AcceptBackoff::Decision AcceptBackoff::OnFailure(int error, const std::string& what) {
  Decision decision;
  if (IsResourceExhaustion(error)) {
    delay_ = delay_ == absl::ZeroDuration() ? options_.initial_delay
                                            : std::min(delay_ * 2, options_.max_delay);
    decision.delay = delay_;
  }
  const absl::Time now = options_.clock->Now();
  if (now - last_log_ < options_.log_interval) {
    ++unlogged_;
    return decision;
  }
  decision.log = true;
  decision.message = absl::StrCat("accept failed: ", what);
  if (unlogged_ > 0) absl::StrAppend(&decision.message, " (and ", unlogged_, " more not logged)");
  if (decision.delay > absl::ZeroDuration()) {
    absl::StrAppend(&decision.message, "; retrying in ", absl::FormatDuration(decision.delay));
  }
  last_log_ = now;
  unlogged_ = 0;
  return decision;
}

}  // namespace tandem
