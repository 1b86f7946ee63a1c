#include "base/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ParallelForTest, CoversEveryIndexExactlyOnce) {
  for (int64_t n : {0, 1, 7, 19, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(n);
    ParallelFor(n, 3, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ParallelForTest, NestedCallsRunAndDoNotDeadlock) {
  std::atomic<int64_t> total{0};
  ParallelFor(8, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      ParallelFor(100, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    }
  });
  EXPECT_EQ(total.load(), 800);
}

}  // namespace
}  // namespace tandem
