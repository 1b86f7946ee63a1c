// The benchmark's time base: the monotonic clock, as nanoseconds since Start(). All loadgen
// timestamps (arrivals, sends, token chunks) use it, so wall-clock jumps never bend a latency.
//
// Not base/clock.h on purpose: the loadgen measures a real server's latencies in real time, its
// waits are asio steady_timers on the io_context (At() gives their expiry), which a FakeClock
// could not drive, and its tests check it against a scripted server running in real time. A
// Clock speaks absl::Time (wall time, for deadlines shared with absl::Mutex and gRPC).
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
