// sm_90 building blocks of the Hopper prefill kernel (paged_attention_prefill_sm90.cu) and of the
// stream decode kernel's TMA stages (fp8_tma_tile.cuh): mbarriers,
// the bulk tensor copy (TMA), proxy fences, named barriers and register reallocation. Thin PTX
// wrappers; every shared-memory address is a 32-bit shared-window address (CvtaShared).
#pragma once

#include <cuda.h>  // CUtensorMap (the type only: no libcuda link)
#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::attention::sm90 {

__device__ __forceinline__ uint32_t CvtaShared(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarrier with `count` expected arrivals per phase.
__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(CvtaShared(bar)), "r"(count));
}

// Makes the initialised barriers visible to the async proxy (TMA complete_tx) and other threads.
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of transaction (the TMA copies that follow).
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(CvtaShared(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(CvtaShared(bar)) : "memory");
}

// Spins until the phase with parity `parity` of `bar` has completed. A freshly initialised
// barrier counts as having completed the phase of parity 1 (producers start waiting on that).
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(CvtaShared(bar)),
      "r"(parity)
      : "memory");
}

// 2D tile copy global -> shared through `map` at (inner, outer) coordinates; completes `bytes`
// of transaction on `bar`. The box size and swizzle are the map's.
__device__ __forceinline__ void TmaLoad2d(void* smem_dst, const CUtensorMap* map, int inner,
                                          int outer, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(CvtaShared(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(CvtaShared(bar))
      : "memory");
}

// 3D tile copy global -> shared through `map` at coordinates (c0, c1, c2), innermost first;
// completes `bytes` of transaction on `bar` (the map's box size).
__device__ __forceinline__ void TmaLoad3d(void* smem_dst, const CUtensorMap* map, int c0, int c1,
                                          int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(CvtaShared(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(CvtaShared(bar))
      : "memory");
}

// Bulk copy of `bytes` contiguous bytes global -> shared (both 16-byte aligned, bytes a multiple
// of 16), completing `bytes` of transaction on `bar`.
__device__ __forceinline__ void BulkLoad(void* smem_dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(CvtaShared(smem_dst)),
      "l"(src), "r"(bytes), "r"(CvtaShared(bar))
      : "memory");
}

// Orders this thread's ordinary shared-memory writes before later async-proxy reads (wgmma
// operands, TMA) that a barrier makes wait for them.
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Barrier `id` (1..15; 0 is __syncthreads) over `threads` threads.
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at barrier `id` without waiting (the producer side of a NamedBarrierSync).
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Register reallocation between warpgroups; needs a register cap at entry
// (__launch_bounds__(threads, 1)) and every warp of the warpgroup executing it.
template <int kRegs>
__device__ __forceinline__ void RegAlloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void RegDealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace tandem::attention::sm90
