#include "worker/engine_loop.h"

#include <deque>
#include <utility>

#include "base/logging.h"
#include "engine/engine.h"

namespace tandem {

EngineLoop::EngineLoop(std::unique_ptr<Engine> engine, Handlers handlers, absl::Duration tick,
                       Clock* clock)
    : engine_(std::move(engine)), handlers_(std::move(handlers)), tick_(tick), clock_(clock) {
  stats_ = engine_->Stats();
  prefix_cache_.version = engine_->prefix_cache_version();
  prefix_cache_.hashes =
      std::make_shared<const std::vector<uint64_t>>(engine_->PrefixCacheHashes());
}

EngineLoop::~EngineLoop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::Start() {
  thread_ = std::thread([this] { Run(); });
}

void EngineLoop::Post(std::function<void(Engine&)> task) {
  absl::MutexLock l(&mu_);
  tasks_.push_back(std::move(task));
}

void EngineLoop::RunSync(const std::function<void(Engine&)>& task) {
  absl::Mutex done_mu;
  bool done = false;
  Post([&](Engine& e) {
    task(e);
    absl::MutexLock l(&done_mu);
    done = true;
  });
  absl::MutexLock l(&done_mu);
  done_mu.Await(absl::Condition(&done));
}

EngineStats EngineLoop::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

EngineLoop::PrefixCacheSnapshot EngineLoop::prefix_cache() const {
  absl::MutexLock l(&mu_);
  return prefix_cache_;
}

void EngineLoop::RunTasks() {
  std::vector<std::function<void(Engine&)>> tasks;
  {
    absl::MutexLock l(&mu_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task(*engine_);
}

void EngineLoop::Run() {
  absl::Time next_tick = clock_->Now() + tick_;
  // Async scheduling (engine.h): a Step() returns the outputs of the oldest step still in
  // flight, launched by an earlier Step() (the previous one, or with pipeline micro-batches up to
  // that many before), which began when that call did.
  int64_t async_steps_seen = engine_->Stats().num_async_steps_total;
  std::deque<absl::Time> launch_starts;  // of the steps in flight, oldest first
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stopping_) return;
      if (!engine_->HasWork()) {
        auto wake = [this]()
                        ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !tasks_.empty(); };
        clock_->AwaitWithDeadline(&mu_, absl::Condition(&wake), next_tick);
        if (stopping_) return;
      }
    }
    RunTasks();
    if (clock_->Now() >= next_tick) {
      next_tick = clock_->Now() + tick_;
      if (handlers_.on_tick) handlers_.on_tick(*engine_);
    }
    bool stepped = false;
    const absl::Time call_start = clock_->Now();
    if (engine_->HasWork()) {
      stepped = true;
      const absl::Time step_start = launch_starts.empty() ? call_start : launch_starts.front();
      absl::StatusOr<std::vector<RequestOutput>> outputs = engine_->Step();
      if (!outputs.ok()) {
        LOG(ERROR) << "engine step failed: " << outputs.status();
        if (handlers_.on_step_error) handlers_.on_step_error(*engine_, outputs.status());
      } else {
        const absl::Time handling_start = clock_->Now();
        for (const RequestOutput& out : *outputs) handlers_.on_output(*engine_, out, step_start);
        output_ns_.fetch_add(absl::ToInt64Nanoseconds(clock_->Now() - handling_start),
                             std::memory_order_relaxed);
      }
    }
    EngineStats stats = engine_->Stats();
    if (stepped) {
      for (; async_steps_seen < stats.num_async_steps_total; ++async_steps_seen) {
        launch_starts.push_back(call_start);
      }
      // The steps collected were the oldest.
      while (launch_starts.size() > static_cast<size_t>(stats.num_batches_in_flight)) {
        launch_starts.pop_front();
      }
    }
    std::shared_ptr<const std::vector<uint64_t>> hashes;
    const uint64_t version = engine_->prefix_cache_version();
    const absl::Time now = clock_->Now();
    bool changed;
    {
      absl::MutexLock l(&mu_);
      changed = version != prefix_cache_.version;
    }
    if (changed && now - prefix_cache_at_ >= kPrefixCacheRefresh) {
      hashes = std::make_shared<const std::vector<uint64_t>>(engine_->PrefixCacheHashes());
      prefix_cache_at_ = now;
    }
    absl::MutexLock l(&mu_);
    stats_ = stats;
    if (hashes != nullptr) prefix_cache_ = {version, std::move(hashes)};
  }
}

}  // namespace tandem
