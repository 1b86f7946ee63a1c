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

}  // namespace tandem
