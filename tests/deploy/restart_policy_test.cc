// Finding 6 of [hardening]: the launcher's restart decisions (deploy/launcher/restart_policy.h),
// on hand-made times.
#include "deploy/launcher/restart_policy.h"

#include "gtest/gtest.h"

namespace tandem::launcher {
namespace {

TEST(RestartPolicy, BacksOffOnRapidCrashesAndGivesUpAfterTheLimit) {
  RestartOptions o;
  o.initial_backoff = absl::Milliseconds(200);
  o.max_backoff = absl::Milliseconds(500);
  o.rapid = absl::Seconds(10);
  o.max_rapid_crashes = 4;
  RestartPolicy policy(o);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  // Each run lasts 1 s: rapid. Backoff 200, 400, 500 (capped) ms, then give up at the 4th.
  absl::Time start = t0;
  const absl::Duration want[] = {absl::Milliseconds(200), absl::Milliseconds(400),
                                 absl::Milliseconds(500)};
  for (int i = 0; i < 3; ++i) {
    const absl::Time died = start + absl::Seconds(1);
    const RestartDecision d = policy.OnExit(start, died);
    ASSERT_FALSE(d.give_up) << i;
    EXPECT_EQ(d.rapid_crashes, i + 1);
    EXPECT_EQ(d.restart_at - died, want[i]) << i;
    start = d.restart_at;
  }
  const RestartDecision last = policy.OnExit(start, start + absl::Seconds(1));
  EXPECT_TRUE(last.give_up);
  EXPECT_EQ(last.rapid_crashes, 4);
}

TEST(RestartPolicy, ALongRunResetsTheCount) {
  RestartOptions o;
  o.max_rapid_crashes = 2;
  RestartPolicy policy(o);
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  EXPECT_EQ(policy.OnExit(t0, t0 + absl::Seconds(1)).rapid_crashes, 1);
  // Ran for exactly `rapid`: not a rapid crash; the count starts over, first backoff again.
  const absl::Time died = t0 + absl::Seconds(20);
  const RestartDecision d = policy.OnExit(died - o.rapid, died);
  EXPECT_FALSE(d.give_up);
  EXPECT_EQ(d.rapid_crashes, 0);
  EXPECT_EQ(d.restart_at - died, o.initial_backoff);
  EXPECT_FALSE(policy.OnExit(died, died + absl::Seconds(1)).give_up);  // 1st rapid crash again
  EXPECT_TRUE(policy.OnExit(died, died + absl::Seconds(2)).give_up);
}

}  // namespace
}  // namespace tandem::launcher
