// The benchmark's time base: the monotonic clock, as nanoseconds since Start(). All loadgen
// timestamps (arrivals, sends, token chunks) use it, so wall-clock jumps never bend a latency.
#pragma once

#include <chrono>
#include <cstdint>

namespace tandem::loadgen {

class BenchClock {
 public:
  using Clock = std::chrono::steady_clock;

  void Start() { origin_ = Clock::now(); }
  int64_t Now() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - origin_).count();
  }
  Clock::time_point At(int64_t ns) const { return origin_ + std::chrono::nanoseconds(ns); }

 private:
  Clock::time_point origin_ = Clock::now();
};

}  // namespace tandem::loadgen
