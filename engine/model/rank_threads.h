// RankThreads: one thread per rank of a worker group, driven in lockstep. Run(fn) calls fn(r)
// on rank r's thread for every rank at once and returns when all have returned — what the
// group's engine loop does every step (DESIGN: one process per group, one thread per rank).
// The ranks' collectives synchronise them inside a step; Run only starts and joins the step.
//
// Owned by one thread (the engine loop's): Run is not reentrant. The threads live as long as
// the object.
#pragma once

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

class RankThreads {
 public:
  explicit RankThreads(int num_ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Each rank's status, [rank].
  std::vector<absl::Status> Run(const std::function<absl::Status(int rank)>& fn);

 private:
  void Loop(int rank);

  absl::Mutex mu_;
  const std::function<absl::Status(int)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // advanced by each Run
  int pending_ ABSL_GUARDED_BY(mu_) = 0;          // ranks still running the current job
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;  // last: joined before the state above goes
};

}  // namespace tandem
