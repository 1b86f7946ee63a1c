#include "base/thread_pool.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {
namespace {

thread_local bool tls_in_worker = false;

class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this] { Loop(); });
    }
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  void Submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  int size() const { return static_cast<int>(workers_.size()); }

 private:
  void Loop() {
    tls_in_worker = true;
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (stop_ && tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;  // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::vector<std::thread> workers_;
};

int ConfiguredThreads() {
  if (const char* env = std::getenv("TANDEM_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

Pool& GlobalPool() {
  // The calling thread takes a share too, so the pool has one thread fewer than the budget.
  static Pool* pool = new Pool(std::max(0, ConfiguredThreads() - 1));
  return *pool;
}

}  // namespace

int NumWorkerThreads() { return GlobalPool().size() + 1; }

void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  const int64_t max_parts = (n + min_chunk - 1) / min_chunk;
  const int64_t parts = tls_in_worker ? 1 : std::min<int64_t>(NumWorkerThreads(), max_parts);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  const int64_t chunk = (n + parts - 1) / parts;
  std::mutex mu;
  std::condition_variable cv;
  int64_t remaining = parts - 1;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t begin = p * chunk;
    const int64_t end = std::min(n, begin + chunk);
    GlobalPool().Submit([&, begin, end] {
      if (begin < end) fn(begin, end);
      std::lock_guard<std::mutex> lock(mu);
      if (--remaining == 0) cv.notify_one();
    });
  }
  const bool was_worker = tls_in_worker;
  tls_in_worker = true;  // nested ParallelFor from fn runs serially
  fn(0, std::min(n, chunk));
  tls_in_worker = was_worker;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return remaining == 0; });
}

}  // namespace tandem
