// The CPU reference of PeerBarrier (peer_barrier.h): the kernel's protocol with C++20
// std::atomic_ref, seq-cst fence and release stores before the spin, acquire loads in it.
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/clock.h"
#include "kernels/peer_barrier/peer_barrier.h"

namespace tandem {

absl::Status CheckPeerBarrier(const PeerBarrierArgs& a) {
  if (a.num_ranks < 1 || a.num_ranks > kMaxPeerBarrierRanks || a.rank < 0 ||
      a.rank >= a.num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("PeerBarrier of rank ", a.rank, " of ",
                                                   a.num_ranks, " (1 to ", kMaxPeerBarrierRanks,
                                                   " ranks)"));
  }
  if (a.epoch == nullptr || a.abort == nullptr || a.error == nullptr || a.timeout_ns <= 0) {
    return absl::InvalidArgumentError("PeerBarrier without its epoch, abort or error word");
  }
  for (int q = 0; q < a.num_ranks; ++q) {
    if (a.slots[q] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("PeerBarrier: rank ", q, "'s slots are null"));
    }
  }
  return absl::OkStatus();
}

void PeerBarrierRef(const PeerBarrierArgs& a) {
  const uint32_t e = ++*a.epoch;  // only this rank's "stream" (thread) touches it
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int q = 0; q < a.num_ranks; ++q) {
    if (q != a.rank)
      std::atomic_ref<uint32_t>(a.slots[q][a.rank]).store(e, std::memory_order_release);
  }
  // Real time, as the kernel's %globaltimer: the deadline is the group's wall-clock timeout.
  Clock* clock = Clock::Real();
  const absl::Time deadline = clock->Now() + absl::Nanoseconds(a.timeout_ns);
  std::atomic_ref<int32_t> abort(*a.abort);
  for (int q = 0; q < a.num_ranks; ++q) {
    if (q == a.rank) continue;
    std::atomic_ref<uint32_t> slot(a.slots[a.rank][q]);
    while (static_cast<int32_t>(slot.load(std::memory_order_acquire) - e) < 0) {
      int32_t why = kPeerBarrierOk;
      if (abort.load(std::memory_order_acquire) != 0) {
        why = kPeerBarrierAborted;
      } else if (clock->Now() > deadline) {
        why = kPeerBarrierTimedOut;
      }
      if (why != kPeerBarrierOk) {
        // The first reason stays (a later barrier of the rank sees the abort word it set).
        std::atomic_ref<int32_t> error(*a.error);
        if (error.load(std::memory_order_relaxed) == kPeerBarrierOk) {
          error.store(why, std::memory_order_release);
        }
        abort.store(1, std::memory_order_release);
        return;
      }
      std::this_thread::yield();
    }
  }
}

}  // namespace tandem
