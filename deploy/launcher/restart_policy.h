// RestartPolicy: when the launcher starts a process that died again, and when it stops trying.
// A process that ran for at least `rapid` before dying is restarted after `initial_backoff`; one
// that died sooner (a "rapid crash") waits twice as long as the last time, up to `max_backoff`,
// and after `max_rapid_crashes` rapid crashes in a row it is given up on (the launcher says so,
// with the process's log). A decision is a value; the caller applies it (deploy/launcher/
// cluster.h, Supervise). Thread-compatible.
#pragma once

#include "absl/time/time.h"

namespace tandem::launcher {

struct RestartOptions {
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration rapid = absl::Seconds(10);
  int max_rapid_crashes = 5;
};

struct RestartDecision {
  bool give_up = false;
  absl::Time restart_at;  // when not giving up
  int rapid_crashes = 0;  // in a row, this one included
};

class RestartPolicy {
 public:
  explicit RestartPolicy(RestartOptions options = {}) : options_(options) {}

  // The process started at `started` was found dead at `now`.
  RestartDecision OnExit(absl::Time started, absl::Time now);

 private:
  RestartOptions options_;
  int rapid_crashes_ = 0;
};

}  // namespace tandem::launcher
