// Probe (session 11, run W8; kernels/sampling/WORKLOG.md): can the sampler's first kernel launch
// the resident cluster kernel itself, from the device, only when a row needs it, instead of the
// host launching it behind every call? Times, back to back with CUDA events (median of 200):
//   a. the first kernel alone (256 CTAs x 256 threads, each writes a token);
//   b. a, then a host-launched cluster kernel (clusters of 8, 200 KB of shared memory per CTA, 16
//      clusters) behind it with programmatic dependent launch: the dispatch as it is;
//   c. a whose last CTA launches that cluster kernel into cudaStreamTailLaunch (a row fell back);
//   d. a built with that device launch but not taking it (no row fell back).
// The cluster kernel checks its cluster size and counts its CTAs; the host checks the counts.
// Not part of the build (it needs relocatable device code and cudadevrt). Build and run:
//   nvcc -std=c++17 -O3 -arch=sm_90a -rdc=true kernels/bench/runs/probe_cdp_tail_launch.cu \
//     -lcudadevrt -o .gpu-cdp/probe && .gpu-cdp/probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

constexpr int kFirstCtas = 256, kThreads = 256, kCluster = 8, kClusters = 16;
constexpr int kClusterSmem = 200 * 1024;

struct State {
  int* tokens;           // one per first-kernel CTA
  unsigned* done;        // CTAs of the first kernel that finished (reset by the last one)
  unsigned* child_ctas;  // CTAs the cluster kernel ran
  unsigned* bad;         // cluster kernel CTAs that saw a cluster size other than kCluster
};

__global__ void __cluster_dims__(kCluster, 1, 1) ClusterKernel(State st) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0) {
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    smem[0] = static_cast<unsigned char>(n);
    atomicAdd(st.child_ctas, 1u);
    if (n != kCluster) atomicAdd(st.bad, 1u);
  }
}

template <bool kDeviceLaunch>
__global__ void FirstKernel(State st, int fall_back) {
  if (threadIdx.x == 0) st.tokens[blockIdx.x] = static_cast<int>(blockIdx.x);
  if constexpr (kDeviceLaunch) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      last = atomicAdd(st.done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (last && threadIdx.x == 0) {
      *st.done = 0;
      if (fall_back) {
        ClusterKernel<<<kCluster * kClusters, kThreads, kClusterSmem, cudaStreamTailLaunch>>>(st);
      }
    }
  }
}

template <typename F>
float MedianUs(F&& f, cudaStream_t s) {
  for (int i = 0; i < 20; ++i) f();
  std::vector<cudaEvent_t> ev(402);
  for (auto& e : ev) cudaEventCreate(&e);
  for (int i = 0; i < 200; ++i) {
    cudaEventRecord(ev[2 * i], s);
    f();
    cudaEventRecord(ev[2 * i + 1], s);
  }
  cudaStreamSynchronize(s);
  std::vector<float> ms(200);
  for (int i = 0; i < 200; ++i) cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]);
  for (auto& e : ev) cudaEventDestroy(e);
  std::nth_element(ms.begin(), ms.begin() + 100, ms.end());
  return ms[100] * 1e3f;
}

int main() {
  State st;
  CK(cudaMalloc(&st.tokens, kFirstCtas * sizeof(int)));
  CK(cudaMalloc(&st.done, 3 * sizeof(unsigned)));
  st.child_ctas = st.done + 1, st.bad = st.done + 2;
  CK(cudaMemset(st.done, 0, 3 * sizeof(unsigned)));
  CK(cudaFuncSetAttribute(ClusterKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          kClusterSmem));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaLaunchAttribute pdl{};
  pdl.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  pdl.val.programmaticStreamSerializationAllowed = 1;
  auto host_pair = [&] {
    FirstKernel<false><<<kFirstCtas, kThreads, 0, s>>>(st, 0);
    cudaLaunchConfig_t c{};
    c.gridDim = dim3(kCluster * kClusters), c.blockDim = dim3(kThreads);
    c.dynamicSmemBytes = kClusterSmem, c.stream = s, c.attrs = &pdl, c.numAttrs = 1;
    cudaLaunchKernelEx(&c, ClusterKernel, st);
  };
  const float a = MedianUs([&] { FirstKernel<false><<<kFirstCtas, kThreads, 0, s>>>(st, 0); }, s);
  const float b = MedianUs(host_pair, s);
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  unsigned before[3];
  CK(cudaMemcpy(before, st.done, sizeof(before), cudaMemcpyDeviceToHost));
  const float c = MedianUs([&] { FirstKernel<true><<<kFirstCtas, kThreads, 0, s>>>(st, 1); }, s);
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  unsigned after[3];
  CK(cudaMemcpy(after, st.done, sizeof(after), cudaMemcpyDeviceToHost));
  const float d = MedianUs([&] { FirstKernel<true><<<kFirstCtas, kThreads, 0, s>>>(st, 0); }, s);
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  unsigned end[3];
  CK(cudaMemcpy(end, st.done, sizeof(end), cudaMemcpyDeviceToHost));
  const unsigned launched = (after[1] - before[1]) / (kCluster * kClusters);
  std::printf(
      "device tail launches: %u of 220 calls ran the cluster kernel; CTAs with a wrong "
      "cluster size: %u; cluster CTAs during d (must be 0): %u\n",
      launched, after[2], end[1] - after[1]);
  std::printf("a first kernel alone            %7.2f us\n", a);
  std::printf("b + host cluster kernel (PDL)   %7.2f us\n", b);
  std::printf("c + device tail launch, taken   %7.2f us\n", c);
  std::printf("d device launch built, not taken %6.2f us\n", d);
  return launched == 220 && after[2] == 0 && end[1] == after[1] ? 0 : 2;
}
