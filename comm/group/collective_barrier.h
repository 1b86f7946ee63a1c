// The pieces shared by the in-process communicator groups (thread_communicator.h over host
// memory, peer_communicator.h over device memory).
//
// GroupFailure: the group's status (OK until its first failure, which it keeps) and the faults
// tests inject per rank (InjectFault). Not a lock of its own: guarded by the group's mutex.
//
// CollectiveBarrier: the two waits of one collective in an in-process communicator group
// (thread_communicator.h over host memory, peer_communicator.h over device memory). Every rank
// posts its call and waits until all have (Arrive: the last arrival checks that they called the
// same collective with the same size), does its share of the work, then waits until every rank
// has done its share (Leave) before its buffers may be reused.
//
// Not a lock of its own: every call is made with the group's mutex held, and a wait ends early
// when the group's status (guarded by that mutex) turns non-OK. A failed Arrive leaves the
// barrier unusable; the caller aborts its group with the returned status.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "kernels/common/dtype.h"

namespace tandem {

class GroupFailure {
 public:
  explicit GroupFailure(int size) : fault_calls_(size, -1), faults_(size) {}
  // OK, or the group's first failure.
  const absl::Status& status() const { return status_; }
  // Fails the group with `reason` (Aborted for an OK one) unless it has failed already.
  void Fail(const absl::Status& reason);
  // Arms `rank`'s fault: its `calls`-th call from now (0: the next) fails the group with `status`.
  void Inject(int rank, int64_t calls, absl::Status status);
  // Counts a call `what` of `rank`: the group's status, after firing the rank's armed fault when
  // it is due ("rank R in WHAT: ...").
  absl::Status Enter(int rank, const char* what);

 private:
  absl::Status status_;
  std::vector<int64_t> fault_calls_;  // [rank]; -1: none armed
  std::vector<absl::Status> faults_;  // [rank]
};

enum class CollectiveOp { kAllReduce, kAllGather };
const char* CollectiveOpName(CollectiveOp op);

// One rank's call: `count` elements of `dtype` (all-reduce) or bytes (all-gather).
struct CollectivePost {
  CollectiveOp op = CollectiveOp::kAllReduce;
  int64_t count = 0;
  DType dtype = DType::kF32;
  const void* send = nullptr;
  void* recv = nullptr;
};

class CollectiveBarrier {
 public:
  // `mu` guards this barrier and `group_status`; both outlive it. A rank waits at most `timeout`
  // on `clock` for its peers to arrive.
  CollectiveBarrier(int size, absl::Mutex* mu, const absl::Status* group_status, Clock* clock,
                    absl::Duration timeout);

  // Posts `post` for `rank` and waits for every rank's. OK when all posted matching calls (the
  // posts are then readable until Leave); InvalidArgument for a mismatch, DeadlineExceeded when
  // a peer does not arrive in time (both naming `what`), or the group's status once it failed.
  absl::Status Arrive(int rank, const CollectivePost& post, const char* what);
  // The ranks' posts of the collective that every rank has arrived at, [rank].
  const std::vector<CollectivePost>& posts() const { return posts_; }
  // Waits (unconditionally) until every rank has left.
  void Leave();

 private:
  const int size_;
  absl::Mutex* const mu_;
  const absl::Status* const group_status_;
  Clock* const clock_;
  const absl::Duration timeout_;
  // Guarded by *mu_. The posts [rank], how many arrived, and a generation that the last arrival
  // advances (waiters leave when it moves); the same for leaving.
  std::vector<CollectivePost> posts_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  int left_ = 0;
  uint64_t leave_generation_ = 0;
};

}  // namespace tandem
