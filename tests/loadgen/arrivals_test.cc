#include "loadgen/arrivals.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace tandem::loadgen {
namespace {

// Coefficient of variation of the inter-arrival gaps (gamma: 1 / sqrt(shape)).
double GapCv(const std::vector<double>& t) {
  double sum = 0, sq = 0;
  for (size_t i = 1; i < t.size(); ++i) sum += t[i] - t[i - 1];
  double mean = sum / (t.size() - 1);
  for (size_t i = 1; i < t.size(); ++i) sq += (t[i] - t[i - 1] - mean) * (t[i] - t[i - 1] - mean);
  return std::sqrt(sq / (t.size() - 1)) / mean;
}

TEST(ArrivalsTest, DeterministicFromSeedAndLastArrivalAtNOverRate) {
  auto a = GammaArrivals(1000, 25.0, 1.0, 7);
  auto b = GammaArrivals(1000, 25.0, 1.0, 7);
  auto c = GammaArrivals(1000, 25.0, 1.0, 8);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_NEAR(a->back(), 1000 / 25.0, 1e-9);
  for (size_t i = 1; i < a->size(); ++i) ASSERT_GE((*a)[i], (*a)[i - 1]);
  EXPECT_GT(a->front(), 0.0);
}

TEST(ArrivalsTest, BurstinessShapesTheGaps) {
  // 20000 gaps: the sample CV is within ~2% of 1/sqrt(shape); bounds are 10%.
  EXPECT_NEAR(GapCv(*GammaArrivals(20000, 100.0, 1.0, 1)), 1.0, 0.1);
  EXPECT_NEAR(GapCv(*GammaArrivals(20000, 100.0, 0.25, 1)), 2.0, 0.2);
  EXPECT_NEAR(GapCv(*GammaArrivals(20000, 100.0, 100.0, 1)), 0.1, 0.01);
}

TEST(ArrivalsTest, InfiniteRateSendsEverythingAtZeroAndBadInputIsRejected) {
  auto inf = GammaArrivals(5, std::numeric_limits<double>::infinity(), 1.0, 0);
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ(*inf, std::vector<double>(5, 0.0));
  EXPECT_FALSE(GammaArrivals(5, 0.0, 1.0, 0).ok());
  EXPECT_FALSE(GammaArrivals(5, 1.0, 0.0, 0).ok());
}

}  // namespace
}  // namespace tandem::loadgen
