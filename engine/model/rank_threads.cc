#include "engine/model/rank_threads.h"

#include <utility>

#include "base/check.h"

namespace tandem {

RankThreads::RankThreads(int num_ranks) {
  for (int r = 0; r < num_ranks; ++r) threads_.emplace_back([this, r] { Loop(r); });
}

RankThreads::~RankThreads() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

int64_t RankThreads::Submit(Job fn) {
  auto work = std::make_shared<Work>();
  work->fn = std::move(fn);
  work->results.resize(size());
  work->pending = size();
  absl::MutexLock lock(&mu_);
  const int64_t ticket = next_ticket_++;
  jobs_.emplace(ticket, std::move(work));
  return ticket;
}

std::vector<absl::Status> RankThreads::Wait(int64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(ticket);
  CHECK(it != jobs_.end()) << "no job " << ticket << " to wait for";
  Work* work = it->second.get();
  auto done = [work]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return work->pending == 0; };
  mu_.Await(absl::Condition(&done));
  std::vector<absl::Status> results = std::move(work->results);
  jobs_.erase(it);
  return results;
}

void RankThreads::Loop(int rank) {
  int64_t next = 0;  // the next ticket this rank runs
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || next < next_ticket_; };
    mu_.Await(absl::Condition(&ready));
    // Every job queued before the stop runs: the other ranks may be waiting for this one.
    if (next == next_ticket_) return;
    // Not erased before this rank has run it (Wait waits for every rank).
    std::shared_ptr<Work> work = jobs_.at(next++);
    mu_.Unlock();
    absl::Status status = work->fn(rank);
    mu_.Lock();
    work->results[rank] = std::move(status);
    --work->pending;
  }
}

}  // namespace tandem
