// Programmatic dependent launch (PDL, sm_90): the producer side, and the launch. CUDA only.
//
// A kernel launched with cudaLaunchAttributeProgrammaticStreamSerialization (the skinny GEMM, see
// GemmArgs::overlap_launch; the decode attention) may be scheduled before the kernel ahead of it in
// the stream has finished, as soon as every block of that kernel has called AllowDependentLaunch()
// or exited; it then runs only what does not depend on that kernel (the GEMM: its first weight
// loads) and waits in griddepcontrol.wait for that kernel's completion and memory flush before it
// reads anything the kernel wrote. So calling this early is always safe: it orders no memory and
// changes nothing for dependents launched without the attribute; it only lets a PDL dependent start
// its independent prologue sooner. Kernels that sit in front of a decode GEMM (RMSNorm,
// SiLU-and-mul) or of the decode attention (RopeKvStore; PagedAttentionArgs::overlap_launch) call
// it at their start, and so does the decode attention (before the o_proj GEMM).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace tandem {

// Host side: launches kernel<<<grid, block, smem, stream>>>(args...), with programmatic dependent
// launch when pdl is true (cudaLaunchAttributeProgrammaticStreamSerialization: the kernel may be
// scheduled once every block of the kernel ahead of it has called AllowDependentLaunch() or
// exited, and must pass griddepcontrol.wait before it reads what that kernel writes).
template <typename... Params, typename... Args>
cudaError_t LaunchMaybePdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                           cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attr;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

__device__ __forceinline__ void AllowDependentLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();  // griddepcontrol.launch_dependents
#endif
}

// The consumer side, for a kernel launched with PDL that puts its weight loads (data no kernel
// writes) in flight first: griddepcontrol.wait blocks the calling thread until the kernel ahead
// has completed and its writes are visible (a no-op without a programmatic edge), then
// launch_dependents lets the next kernel's blocks be scheduled as SMs free up. Every thread calls
// it exactly once, before its first read of what the kernel ahead wrote and its first write.
__device__ __forceinline__ void PdlWaitThenRelease() {
  cudaGridDependencySynchronize();  // griddepcontrol.wait (memory clobber)
  AllowDependentLaunch();           // griddepcontrol.launch_dependents
}

// A 16-byte load of data the kernel ahead wrote, after PdlWaitThenRelease: a plain (weak,
// L1-cached) ld.global, not ld.global.nc, whose contract (the data does not change while the
// kernel runs) is untrue for a kernel that started before its producer ended; volatile asm so
// that it stays after the wait.
__device__ __forceinline__ uint4 LoadAfterWait16(const void* p) {
  uint4 r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

}  // namespace tandem
