// RankThreads: one thread per rank of a worker group, fed jobs in order. Submit(fn) queues a job
// that calls fn(r) on rank r's thread for every rank; each rank runs the jobs one after another
// in submission order, independently of the other ranks, and Wait(ticket) returns once every
// rank has run that job. Run(fn) is Submit + Wait: what the group's engine loop does for a
// synchronous step (DESIGN: one process per group, one thread per rank). Several jobs queued at
// once are how a pipeline-parallel group keeps micro-batches in flight: stage 0's ranks start
// job k + 1 while the next stage's still run job k (parallel_model.h). The ranks' collectives and
// transfers synchronise them inside a job.
//
// Owned by one thread (the engine loop's): Submit, Wait and Run are not reentrant. Every
// submitted job runs, even when the object goes: the destructor waits for the queue to drain
// (a rank that skipped a job would leave its peers waiting in a receive). The threads live as
// long as the object.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

class RankThreads {
 public:
  using Job = std::function<absl::Status(int rank)>;

  explicit RankThreads(int num_ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Queues `fn` behind every job submitted before; returns its ticket for Wait.
  int64_t Submit(Job fn);
  // Each rank's status of job `ticket`, [rank], once all have run it; each ticket once.
  std::vector<absl::Status> Wait(int64_t ticket);
  std::vector<absl::Status> Run(Job fn) { return Wait(Submit(std::move(fn))); }

 private:
  struct Work {
    Job fn;
    std::vector<absl::Status> results;  // [rank]
    int pending = 0;                    // ranks that have not run it yet
  };
  void Loop(int rank);

  absl::Mutex mu_;
  std::map<int64_t, std::shared_ptr<Work>> jobs_ ABSL_GUARDED_BY(mu_);  // not yet waited for
  int64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // last: joined before the state above goes
};

}  // namespace tandem
