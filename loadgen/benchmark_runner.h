// BenchmarkRunner: releases requests at their scheduled times (open loop), optionally gated by
// a --max-concurrency cap, and collects one RequestRecord per request that was sent.
//
// Timing contract (no coordinated omission): request i is *scheduled* at arrivals_s[i]; it is
// *released* at max(scheduled, the moment a concurrency slot freed up) — without a cap,
// released == scheduled. Latencies are measured from the release time, not from when the
// loadgen got round to writing the request (send_ns, kept as a health diagnostic), so neither a
// slow server nor a busy loadgen can slow arrivals down or hide time. Closed loop is
// rate = inf with a cap: every request is scheduled at 0 and released when a slot frees.
// Single-threaded: everything runs on the io_context thread that calls Run().
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <utility>  // first: Boost 1.74's asio/awaitable.hpp uses std::exchange unincluded
#include <vector>

#include "loadgen/bench_clock.h"
#include "loadgen/request_record.h"
#include "loadgen/target.h"

namespace tandem::loadgen {

struct RunOptions {
  int max_concurrency = 0;  // 0: no cap
  bool progress = false;    // live progress line on stderr
  double progress_interval_s = 1.0;
  bool handle_sigint = false;  // Ctrl-C stops the run and keeps what was measured
};

struct RunResult {
  std::vector<RequestRecord> records;  // requests that were sent, by index
  double duration_s = 0;               // from t = 0 to the last completion (or the interrupt)
  bool interrupted = false;
  int not_sent = 0;  // requests never released because the run was interrupted
};

class BenchmarkRunner {
 public:
  // `clock` is restarted by Run(); the target must use the same clock.
  BenchmarkRunner(boost::asio::io_context& io, BenchClock* clock, Target* target);
  ~BenchmarkRunner();

  // Runs `io` on the calling thread until every request has finished or Stop() was called.
  // arrivals_s[i]: request i's scheduled time in seconds (non-decreasing).
  RunResult Run(const std::vector<RequestSpec>& specs, const std::vector<double>& arrivals_s,
                const RunOptions& options);
  // Thread-safe: stop releasing requests, cancel the in-flight ones; Run() then returns.
  void Stop();
  bool stop_requested() const { return stop_requested_; }

  struct State;

 private:
  boost::asio::io_context& io_;
  BenchClock* clock_;
  Target* target_;
  State* state_ = nullptr;  // lives during Run()
  std::atomic<bool> stop_requested_{false};
};

}  // namespace tandem::loadgen
