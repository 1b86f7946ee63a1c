#include "engine/model/rank_threads.h"

namespace tandem {

RankThreads::RankThreads(int num_ranks) {
  {
    absl::MutexLock lock(&mu_);
    results_.resize(num_ranks);
  }
  for (int r = 0; r < num_ranks; ++r) threads_.emplace_back([this, r] { Loop(r); });
}

RankThreads::~RankThreads() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

std::vector<absl::Status> RankThreads::Run(const std::function<absl::Status(int)>& fn) {
  absl::MutexLock lock(&mu_);
  job_ = &fn;
  pending_ = size();
  ++generation_;
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; };
  mu_.Await(absl::Condition(&done));
  job_ = nullptr;
  return results_;
}

void RankThreads::Loop(int rank) {
  uint64_t seen = 0;
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || generation_ != seen; };
    mu_.Await(absl::Condition(&ready));
    if (stop_) return;
    seen = generation_;
    const std::function<absl::Status(int)>* job = job_;
    mu_.Unlock();
    absl::Status status = (*job)(rank);
    mu_.Lock();
    results_[rank] = std::move(status);
    --pending_;
  }
}

}  // namespace tandem
