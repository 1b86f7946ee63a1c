#include "base/clock.h"

#include "absl/time/clock.h"

namespace tandem {
namespace {

class RealClock final : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }
  void SleepUntil(absl::Time deadline) override { absl::SleepFor(deadline - absl::Now()); }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& condition,
                         absl::Time deadline) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu->AwaitWithDeadline(condition, deadline);
  }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* const clock = new RealClock();  // never destroyed: threads may outlive main
  return clock;
}

}  // namespace tandem
