// CUDA PeerBarrier (peer_barrier.h): one thread of one CTA runs the protocol with libcu++'s
// system-scope atomics (the flags may live on a peer GPU, the abort and error words in
// host-mapped memory); the other lanes of the warp only keep the launch a whole warp.
#include <cuda/atomic>

#include "base/cuda_check.h"
#include "kernels/peer_barrier/peer_barrier.h"

namespace tandem {
namespace {

constexpr int kThreads = 32;
// Between two polls: short enough that a barrier whose peers are already there costs ~1 µs,
// long enough not to flood the peer's memory (and the PCIe bus, for the abort word) with loads.
constexpr unsigned kPollSleepNs = 200;

using SystemU32 = cuda::atomic_ref<uint32_t, cuda::thread_scope_system>;
using SystemI32 = cuda::atomic_ref<int32_t, cuda::thread_scope_system>;

__device__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads)
    PeerBarrierKernel(const __grid_constant__ PeerBarrierArgs a) {
  if (threadIdx.x != 0) return;
  const uint32_t e = *a.epoch + 1;
  *a.epoch = e;  // this rank's stream alone runs its barriers, one after another
  // Every earlier write of this rank (its earlier kernels' included) before the flags.
  __threadfence_system();
  for (int q = 0; q < a.num_ranks; ++q) {
    if (q != a.rank) SystemU32(a.slots[q][a.rank]).store(e, cuda::memory_order_release);
  }
  const uint64_t start = GlobalTimerNs();
  SystemI32 abort(*a.abort);
  for (int q = 0; q < a.num_ranks; ++q) {
    if (q == a.rank) continue;
    SystemU32 slot(a.slots[a.rank][q]);
    while (static_cast<int32_t>(slot.load(cuda::memory_order_acquire) - e) < 0) {
      int32_t why = kPeerBarrierOk;
      if (abort.load(cuda::memory_order_relaxed) != 0) {
        why = kPeerBarrierAborted;
      } else if (static_cast<int64_t>(GlobalTimerNs() - start) > a.timeout_ns) {
        why = kPeerBarrierTimedOut;
      }
      if (why != kPeerBarrierOk) {
        // The first reason stays (a later barrier of the rank sees the abort word it set);
        // only this rank's barriers write its word, one after another.
        SystemI32 error(*a.error);
        if (error.load(cuda::memory_order_relaxed) == kPeerBarrierOk) {
          error.store(why, cuda::memory_order_relaxed);
        }
        abort.store(1, cuda::memory_order_release);
        return;
      }
      __nanosleep(kPollSleepNs);
    }
  }
}

}  // namespace

absl::Status PeerBarrier(const PeerBarrierArgs& args, cudaStream_t stream) {
  if (absl::Status s = CheckPeerBarrier(args); !s.ok()) return s;
  PeerBarrierKernel<<<1, kThreads, 0, stream>>>(args);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace tandem
