#include "loadgen/benchmark_runner.h"

#include <unistd.h>

#include <boost/asio.hpp>
#include <csignal>
#include <cstdio>
#include <deque>

#include "absl/strings/str_format.h"

namespace tandem::loadgen {

namespace asio = boost::asio;
using boost::system::error_code;

constexpr auto kAwait = asio::use_awaitable;

struct BenchmarkRunner::State {
  State(asio::io_context& io)
      : dispatch_timer(io), slot_wakeup(io), progress_timer(io), signals(io) {}
  const std::vector<RequestSpec>* specs = nullptr;
  std::vector<int64_t> arrivals_ns;
  RunOptions options;
  std::vector<RequestRecord> records;
  std::vector<bool> sent;
  int dispatched = 0, in_flight = 0, finished = 0, failed = 0;
  int64_t output_tokens = 0;
  std::deque<int64_t> free_slots;  // when each free concurrency slot became free
  asio::steady_timer dispatch_timer, slot_wakeup, progress_timer;
  asio::signal_set signals;
  bool stopping = false, dispatch_done = false, done = false;
  int64_t end_ns = 0;
};

BenchmarkRunner::BenchmarkRunner(asio::io_context& io, BenchClock* clock, Target* target)
    : io_(io), clock_(clock), target_(target) {}
BenchmarkRunner::~BenchmarkRunner() = default;

namespace {

void PrintProgress(const BenchmarkRunner::State& s, int64_t now_ns, bool final_line) {
  double t = now_ns / 1e9;
  std::fprintf(stderr,
               "\r[%7.1fs] sent %d/%zu | finished %d (failed %d) | in flight %d | %.1f req/s | "
               "%.0f tok/s%s",
               t, s.dispatched, s.specs->size(), s.finished, s.failed, s.in_flight,
               t > 0 ? s.finished / t : 0.0, t > 0 ? s.output_tokens / t : 0.0,
               final_line ? "\n" : "   ");
  std::fflush(stderr);
}

}  // namespace

namespace {

// Ends the run when nothing is left to release and nothing is in flight.
void MaybeFinish(BenchmarkRunner::State& s, const BenchClock& clock) {
  if (s.done || !s.dispatch_done || s.in_flight > 0) return;
  s.done = true;
  if (s.end_ns == 0) s.end_ns = clock.Now();
  s.progress_timer.cancel();
  s.slot_wakeup.cancel();
  error_code ignored;
  s.signals.cancel(ignored);
  if (s.options.progress) PrintProgress(s, s.end_ns, true);
}

asio::awaitable<void> RunOne(BenchmarkRunner::State& s, const BenchClock& clock, Target& target,
                             int i) {
  RequestRecord& rec = s.records[i];
  if (s.stopping) {
    // Stopped between the spawn and this coroutine's first step: the target's CancelAll could
    // not see this request, so it must not start now (it would run to its end after the stop).
    rec.send_ns = clock.Now();
    rec.success = false;
    rec.cause = FailureCause::kCancelled;
    rec.error = "cancelled";
  } else {
    co_await target.Send((*s.specs)[i], &rec);
  }
  rec.end_ns = clock.Now();
  --s.in_flight;
  ++s.finished;
  if (!rec.success) ++s.failed;
  if (rec.success) s.output_tokens += rec.output_tokens;
  if (s.options.max_concurrency > 0) {
    s.free_slots.push_back(rec.end_ns);
    s.slot_wakeup.cancel();
  }
  MaybeFinish(s, clock);
}

asio::awaitable<void> Dispatch(BenchmarkRunner::State& s, const BenchClock& clock, Target& target) {
  error_code ec;
  for (size_t i = 0; i < s.arrivals_ns.size() && !s.stopping; ++i) {
    int64_t due = s.arrivals_ns[i];
    if (clock.Now() < due) {
      s.dispatch_timer.expires_at(clock.At(due));
      co_await s.dispatch_timer.async_wait(asio::redirect_error(kAwait, ec));
      if (s.stopping) break;
    }
    int64_t released = due;
    if (s.options.max_concurrency > 0) {
      while (s.free_slots.empty() && !s.stopping) {
        s.slot_wakeup.expires_at(asio::steady_timer::time_point::max());
        co_await s.slot_wakeup.async_wait(asio::redirect_error(kAwait, ec));
      }
      if (s.stopping) break;
      released = std::max(due, s.free_slots.front());
      s.free_slots.pop_front();
    }
    RequestRecord& rec = s.records[i];
    rec.index = static_cast<int>(i);
    rec.scheduled_ns = due;
    rec.released_ns = released;
    s.sent[i] = true;
    ++s.dispatched;
    ++s.in_flight;
    asio::co_spawn(s.dispatch_timer.get_executor(), RunOne(s, clock, target, i), asio::detached);
  }
  s.dispatch_done = true;
  MaybeFinish(s, clock);
}

asio::awaitable<void> Progress(BenchmarkRunner::State& s, const BenchClock& clock) {
  error_code ec;
  auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s.options.progress_interval_s));
  auto next = clock.At(0);
  while (!s.done) {
    next += period;
    s.progress_timer.expires_at(next);
    co_await s.progress_timer.async_wait(asio::redirect_error(kAwait, ec));
    if (s.done) break;
    PrintProgress(s, clock.Now(), false);
  }
}

}  // namespace

void BenchmarkRunner::Stop() {
  stop_requested_ = true;
  asio::post(io_, [this] {
    State* s = state_;
    if (s == nullptr || s->stopping || s->done) return;
    s->stopping = true;
    s->end_ns = clock_->Now();
    s->dispatch_timer.cancel();
    s->slot_wakeup.cancel();
    target_->CancelAll();
  });
}

RunResult BenchmarkRunner::Run(const std::vector<RequestSpec>& specs,
                               const std::vector<double>& arrivals_s, const RunOptions& options) {
  State s(io_);
  s.specs = &specs;
  s.options = options;
  for (double t : arrivals_s) s.arrivals_ns.push_back(static_cast<int64_t>(t * 1e9));
  s.records.resize(specs.size());
  s.sent.assign(specs.size(), false);
  for (int i = 0; i < options.max_concurrency; ++i) s.free_slots.push_back(0);
  if (options.handle_sigint) {
    s.signals.add(SIGINT);
    s.signals.async_wait([this, &s](const error_code& ec, int) {
      if (ec) return;
      error_code ignored;
      s.signals.remove(SIGINT, ignored);  // a second Ctrl-C kills the process
      std::fprintf(stderr, "\nInterrupted: stopping and writing what was measured so far.\n");
      Stop();
    });
  }
  io_.restart();
  state_ = &s;
  clock_->Start();
  asio::co_spawn(io_, Dispatch(s, *clock_, *target_), asio::detached);
  if (options.progress) asio::co_spawn(io_, Progress(s, *clock_), asio::detached);
  io_.run();
  state_ = nullptr;

  RunResult result;
  result.duration_s = s.end_ns / 1e9;
  result.interrupted = s.stopping;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (s.sent[i]) {
      result.records.push_back(std::move(s.records[i]));
    } else {
      ++result.not_sent;
    }
  }
  return result;
}

}  // namespace tandem::loadgen
