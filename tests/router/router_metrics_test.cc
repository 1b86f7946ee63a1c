// RouterMetrics: every finished_reason series of tandem:request_success_total exists at 0 before
// any request, so a client that differences its first and last scrape (aiperf's server metrics)
// counts every request; counting one reason moves only that series.
#include "router/router_metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "router/worker_registry.h"

namespace tandem::router {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Series(const std::string& reason, int value) {
  return "tandem:request_success_total{model_name=\"tiny\",finished_reason=\"" + reason + "\"} " +
         std::to_string(value) + "\n";
}

TEST(RouterMetricsTest, EveryFinishedReasonIsExportedFromTheStart) {
  WorkerRegistry registry(RegistryOptions{});
  RouterMetrics metrics("tiny", 64);
  const std::string before = metrics.Render(registry);
  for (const char* reason : kFinishedReasons) EXPECT_THAT(before, HasSubstr(Series(reason, 0)));
  metrics.CountOutcome("length");
  metrics.CountOutcome("length");
  const std::string after = metrics.Render(registry);
  EXPECT_THAT(after, HasSubstr(Series("length", 2)));
  EXPECT_THAT(after, HasSubstr(Series("stop", 0)));
  EXPECT_THAT(after, Not(HasSubstr(Series("length", 0))));
}

}  // namespace
}  // namespace tandem::router
