// ThreadCommGroup: the in-process Communicator (communicator.h) of a group whose ranks are
// threads of one process — the CPU backend's tensor and pipeline parallelism, and every test of
// parallel layouts on machines without GPUs.
//
// Collectives are a rendezvous then a copy: every rank posts its buffer and waits (up to the
// deadline, abortable) until all ranks have posted the same collective; then each rank reduces
// or copies its share straight between the posted buffers (no waiting), and the ranks wait for
// one another once more so that no buffer is touched after its owner's call returns. That last
// wait is unconditional and cannot hang: a rank past the rendezvous only copies memory.
// AllReduceSum: rank r sums elements [r·n/size, (r+1)·n/size) over the ranks in rank order and
// writes the sum into every rank's buffer, so every rank ends with bitwise the same values.
// Send copies into a per-pair mailbox; Recv waits for it.
//
// Faults. InjectFault(rank, calls, status) makes that rank's calls-th collective or transfer
// from now (0: the next) abort the group with `status` instead of running, as a dead device or
// a crashed rank thread would; its peers, waiting in that collective, return at once. A peer
// that does not arrive within `timeout` aborts the group with DeadlineExceeded.
//
// Thread-safe: each rank's communicator is driven by its own thread; Abort, InjectFault and
// status from any thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "comm/group/collective_barrier.h"
#include "comm/group/communicator.h"

namespace tandem {

struct ThreadCommOptions {
  // How long a rank waits for its peers in one collective or for a message; measured on `clock`.
  absl::Duration timeout = absl::Seconds(60);
  Clock* clock = Clock::Real();
};

class ThreadCommGroup : public std::enable_shared_from_this<ThreadCommGroup> {
 public:
  // A group of `size` (>= 1) ranks; InvalidArgument otherwise.
  static absl::StatusOr<std::shared_ptr<ThreadCommGroup>> Create(int size,
                                                                 ThreadCommOptions options = {});

  int size() const { return size_; }
  // Rank `rank`'s communicator (each rank's exactly once; it keeps the group alive).
  std::unique_ptr<Communicator> ForRank(int rank);

  void InjectFault(int rank, int64_t calls, absl::Status status);
  void Abort(const absl::Status& reason);
  absl::Status status() const;

 private:
  friend class ThreadCommunicator;
  using Op = CollectiveOp;
  using Post = CollectivePost;
  ThreadCommGroup(int size, ThreadCommOptions options);

  // Counts the rank's call and fires an armed fault; the group's status otherwise.
  absl::Status Enter(int rank, const char* what);
  // Posts `post` and waits for every rank's; OK when all posted matching collectives.
  absl::Status Rendezvous(int rank, const Post& post, const char* what);
  // Waits (unconditionally) until every rank has finished its share of the collective.
  void Complete();
  absl::Status CollectiveAllReduce(int rank, void* data, int64_t count, DType dtype);
  absl::Status CollectiveAllGather(int rank, const void* send, void* recv, int64_t bytes);
  absl::Status SendTo(int rank, const void* data, int64_t bytes, int peer);
  absl::Status RecvFrom(int rank, void* data, int64_t bytes, int peer);
  void AbortLocked(const absl::Status& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int size_;
  const ThreadCommOptions options_;
  mutable absl::Mutex mu_;
  GroupFailure failure_ ABSL_GUARDED_BY(mu_);
  CollectiveBarrier barrier_ ABSL_GUARDED_BY(mu_);  // the current collective's two waits
  // Point-to-point messages, [src * size + dst], oldest first.
  std::vector<std::deque<std::vector<uint8_t>>> mailboxes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem
