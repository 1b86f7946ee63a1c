#include "deploy/launcher/restart_policy.h"

#include <algorithm>

namespace tandem::launcher {

RestartDecision RestartPolicy::OnExit(absl::Time started, absl::Time now) {
  RestartDecision d;
  if (now - started >= options_.rapid) {
    rapid_crashes_ = 0;
    d.restart_at = now + options_.initial_backoff;
    return d;
  }
  d.rapid_crashes = ++rapid_crashes_;
  if (rapid_crashes_ >= options_.max_rapid_crashes) {
    d.give_up = true;
    return d;
  }
  absl::Duration backoff = options_.initial_backoff;
  for (int i = 1; i < rapid_crashes_ && backoff < options_.max_backoff; ++i) backoff *= 2;
  d.restart_at = now + std::min(backoff, options_.max_backoff);
  return d;
}

}  // namespace tandem::launcher
