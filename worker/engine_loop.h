// EngineLoop: the one thread that owns an Engine (engine/engine.h is not thread-safe). RPC
// threads hand work to it with Post(); between steps the loop runs every posted task, then one
// Engine::Step() if there is work, and passes each RequestOutput to the worker's handler. All
// per-request state of a worker service is touched only from tasks and handlers, i.e. on this
// thread, so it needs no lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "engine/engine.h"

namespace tandem {

class EngineLoop {
 public:
  struct Handlers {
    // Each output of a step (on the loop thread). `step_start` is when that step began.
    std::function<void(Engine&, const RequestOutput&, absl::Time step_start)> on_output;
    // Step() failed: the engine is broken for good (engine/engine.h: it ended every request and
    // freed their pages; it will refuse new ones). The role fails its requests and the worker
    // turns unhealthy (WorkerService::OnEngineBroken).
    std::function<void(Engine&, const absl::Status&)> on_step_error;
    // Called about every `tick` of `clock` (deadlines, TTLs).
    std::function<void(Engine&)> on_tick;
  };

  // `clock` times the ticks and the step starts; it must outlive the loop.
  EngineLoop(std::unique_ptr<Engine> engine, Handlers handlers,
             absl::Duration tick = absl::Milliseconds(50), Clock* clock = Clock::Real());
  ~EngineLoop();  // stops the thread; posted tasks not yet run are dropped

  void Start();
  // Runs `task` on the loop thread before the next step. Thread-safe.
  void Post(std::function<void(Engine&)> task);
  // Runs `task` on the loop thread and waits for it. Never call from the loop thread.
  void RunSync(const std::function<void(Engine&)>& task);

  // The engine's stats as of the last step (thread-safe snapshot).
  EngineStats stats() const;
  // Time the loop thread spent in on_output handlers (thread-safe).
  int64_t output_handling_ns_total() const { return output_ns_.load(std::memory_order_relaxed); }
  // The page hashes of the engine's prefix cache as of a recent step (refreshed at most every
  // kPrefixCacheRefresh while they change), and their version. Thread-safe.
  struct PrefixCacheSnapshot {
    uint64_t version = 0;
    std::shared_ptr<const std::vector<uint64_t>> hashes;  // never null
  };
  PrefixCacheSnapshot prefix_cache() const;
  static constexpr absl::Duration kPrefixCacheRefresh = absl::Milliseconds(100);
  // Engine constants (read-only after Create; safe from any thread).
  const Engine& engine() const { return *engine_; }

 private:
  void Run();
  void RunTasks();

  std::unique_ptr<Engine> engine_;
  Handlers handlers_;
  absl::Duration tick_;
  Clock* const clock_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  std::vector<std::function<void(Engine&)>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  PrefixCacheSnapshot prefix_cache_ ABSL_GUARDED_BY(mu_);
  absl::Time prefix_cache_at_ = absl::InfinitePast();  // loop thread only
  std::atomic<int64_t> output_ns_{0};
};

}  // namespace tandem
