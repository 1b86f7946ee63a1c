// Paged prefill attention on sm_90a, FlashAttention-3 style: TMA loads of the K/V pages into a
// ring of shared-memory stages guarded by mbarriers, warp specialisation (one producer warp, two
// consumer warpgroups of 64 rows each with the registers moved to them by setmaxnreg), and
// wgmma for S = Q K^T (both operands from shared memory) and O += P V (P from registers, V
// transposed through its descriptor). Online softmax in fp32 with exp2. head_dim 128 only; the
// plan's items (attention_plan.h: 128 packed rows, keys [0, key_end)) are the CTA tiles.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "kernels/paged_attention/attention_common.cuh"
#include "kernels/paged_attention/prefill_sm90.h"
#include "kernels/paged_attention/prefill_sm90_consumer.cuh"
#include "kernels/paged_attention/prefill_sm90_pipeline.cuh"
#include "kernels/paged_attention/tma_encode.h"

namespace tandem::attention::sm90 {
namespace {

template <int kStages, bool kPingPong>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillSm90Kernel(const __grid_constant__ PagedAttentionArgs a,
                      const __grid_constant__ CUtensorMap kv_map, const AttentionWorkItem* items,
                      const int32_t* counts, bool snake) {
  extern __shared__ uint8_t smem_raw[];
  auto& sm = *reinterpret_cast<Smem<kStages>*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kSwizzleAtomBytes - 1) &
      ~uintptr_t{kSwizzleAtomBytes - 1});
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&sm.full_k[s], 1);
      MbarInit(&sm.full_v[s], 1);
      MbarInit(&sm.empty_k[s], kConsumerWarps);
      MbarInit(&sm.empty_v[s], kConsumerWarps);
      MbarInit(&sm.landed[s], 1);
    }
    FenceBarrierInit();
  }
  __syncthreads();
  const int num_items = counts[0];
  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    RegDealloc<kProducerRegs>();
    if (threadIdx.x < 32) Produce(a, &kv_map, items, num_items, snake, sm, threadIdx.x);
  } else {
    RegAlloc<kConsumerRegs>();
    Consume<kStages, kPingPong>(a, items, num_items, snake, sm, wg - 1, threadIdx.x - 128 * wg);
  }
}

// The K/V cache of one layer (Bf16KvRowsTensorMap, tma_encode.h), boxes of 64 dims x
// min(page_size, kKeys) rows.
absl::StatusOr<CUtensorMap> KvTensorMap(const PagedAttentionArgs& a) {
  return Bf16KvRowsTensorMap(a.kv_layer, kD, std::min(a.page_size, kKeys));
}

template <int kStages, bool kPingPong>
absl::Status Launch(const PagedAttentionArgs& a, const AttentionPlan& plan, cudaStream_t stream) {
  // Snake item order by default; TANDEM_PREFILL_ORDER=strided (benchmarks) for plain waves.
  // Read once per process: this runs for every layer of every step.
  static const bool snake = [] {
    const char* order = std::getenv("TANDEM_PREFILL_ORDER");
    return order == nullptr || std::string_view(order) != "strided";
  }();
  ASSIGN_OR_RETURN(const CUtensorMap map, KvTensorMap(a));
  constexpr int kSmem = sizeof(Smem<kStages>) + kSwizzleAtomBytes;
  static std::atomic<int> cache[kMaxDevices];
  ASSIGN_OR_RETURN(const int per_sm,
                   BlocksPerSm(PrefillSm90Kernel<kStages, kPingPong>, kThreads, kSmem, cache));
  PrefillSm90Kernel<kStages, kPingPong>
      <<<NumSms() * per_sm, kThreads, kSmem, stream>>>(a, map, plan.items(), plan.counts(), snake);
  CUDA_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::attention::sm90

namespace tandem::attention {

bool Sm90PrefillSupported(const PagedAttentionArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.dtype == DType::kBF16 && a.kv_dtype == DType::kBF16 && a.head_dim == 128 &&
         a.page_size >= 8 && PageShift(a.page_size) >= 0 && aligned(a.q) && aligned(a.kv_layer) &&
         a.q_stride % 8 == 0;
}

absl::Status LaunchPrefillSm90(const PagedAttentionArgs& a, const AttentionPlan& plan,
                               cudaStream_t stream) {
  // 3 stages of 32 KB for each of K and V (128 keys) fit beside the 32 KB of queries in 227 KB.
  // Ping-pong of the consumer warpgroups measured slower at 16k with page 16 (495-497 vs
  // 526-528 TFLOP/s) and within noise at page 64 (WORKLOG step 6): off unless
  // TANDEM_PREFILL_PINGPONG=1 (benchmarks).
  static const bool pingpong = [] {
    const char* env = std::getenv("TANDEM_PREFILL_PINGPONG");
    return env != nullptr && std::atoi(env) == 1;
  }();
  if (pingpong) {
    return sm90::Launch<3, true>(a, plan, stream);
  }
  return sm90::Launch<3, false>(a, plan, stream);
}

}  // namespace tandem::attention
