// AcceptBackoff: what a server's accept loop does after accept(2) fails. Running out of file
// descriptors or kernel memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) lasts until something else
// closes one, and the pending connection stays in the backlog, so accepting again at once would
// fail again at once: a loop at full core that logs every failure. The loop waits instead, longer
// each time (up to max_delay) until an accept succeeds, and logs at most once per log_interval,
// with the count of the failures it did not log. Other errors (a connection reset before it
// was accepted) are retried at once, and also rate-limited in the log.
//
// Not thread-safe: one per accept loop, used on the loop's strand.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "base/clock.h"

namespace tandem {

class AcceptBackoff {
 public:
  struct Options {
    absl::Duration initial_delay = absl::Milliseconds(10);
    absl::Duration max_delay = absl::Milliseconds(500);
    absl::Duration log_interval = absl::Seconds(10);
    Clock* clock = Clock::Real();  // the log's rate limit
  };
  struct Decision {
    absl::Duration delay;  // wait this long before accepting again (zero: at once)
    bool log = false;      // write `message` to the log
    std::string message;
  };

  AcceptBackoff() : AcceptBackoff(Options()) {}
  explicit AcceptBackoff(Options options) : options_(options) {}

  // accept(2) failed with errno `error` (described by `what`).
  Decision OnFailure(int error, const std::string& what);
  // An accept succeeded: the next failure starts from initial_delay again.
  void OnSuccess() { delay_ = absl::ZeroDuration(); }

  static bool IsResourceExhaustion(int error);

 private:
  const Options options_;
  absl::Duration delay_ = absl::ZeroDuration();
  absl::Time last_log_ = absl::InfinitePast();
  int64_t unlogged_ = 0;
};

}  // namespace tandem
