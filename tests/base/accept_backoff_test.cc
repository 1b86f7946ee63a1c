// AcceptBackoff: waits that grow while descriptors are out, reset on success; a log line per
// interval with the count of failures it did not log; other errors retried at once.
#include "base/accept_backoff.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>

#include "tests/base/fake_clock.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

TEST(AcceptBackoffTest, OutOfDescriptorsWaitsLongerEachTimeAndLogsOncePerInterval) {
  testing::FakeClock clock;
  AcceptBackoff::Options options;
  options.clock = &clock;
  AcceptBackoff backoff(options);
  AcceptBackoff::Decision first = backoff.OnFailure(EMFILE, "Too many open files");
  EXPECT_EQ(first.delay, absl::Milliseconds(10));
  EXPECT_TRUE(first.log);
  EXPECT_THAT(first.message, HasSubstr("Too many open files"));
  std::vector<absl::Duration> delays;
  int logged = 0;
  for (int i = 0; i < 100; ++i) {  // 100 more failures within the same second
    AcceptBackoff::Decision d = backoff.OnFailure(ENFILE, "table full");
    delays.push_back(d.delay);
    logged += d.log;
  }
  EXPECT_EQ(logged, 0);
  EXPECT_EQ(delays[0], absl::Milliseconds(20));
  EXPECT_EQ(delays[5], absl::Milliseconds(500));  // capped
  EXPECT_EQ(delays.back(), absl::Milliseconds(500));
  clock.Advance(absl::Seconds(10));
  AcceptBackoff::Decision later = backoff.OnFailure(EMFILE, "Too many open files");
  EXPECT_TRUE(later.log);
  EXPECT_THAT(later.message, HasSubstr("100 more not logged"));
  backoff.OnSuccess();
  EXPECT_EQ(backoff.OnFailure(EMFILE, "x").delay, absl::Milliseconds(10));
}

TEST(AcceptBackoffTest, OtherErrorsRetryAtOnce) {
  testing::FakeClock clock;
  AcceptBackoff::Options options;
  options.clock = &clock;
  AcceptBackoff backoff(options);
  EXPECT_EQ(backoff.OnFailure(ECONNABORTED, "aborted").delay, absl::ZeroDuration());
  EXPECT_FALSE(backoff.OnFailure(ECONNABORTED, "aborted").log);  // rate-limited too
  EXPECT_TRUE(AcceptBackoff::IsResourceExhaustion(ENOBUFS));
  EXPECT_FALSE(AcceptBackoff::IsResourceExhaustion(ECONNRESET));
}

}  // namespace
}  // namespace tandem
