// The workspace a FlashInfer plan writes and its run reads (flashinfer_peer_{cc,tc}.cu): a float
// buffer on the device (split-KV partial outputs and their log-sum-exps), an int buffer on the
// device (work items: request, tile and output indices) and its page-locked host twin, which the
// plan fills and copies to the device. Owned, freed on destruction; not copyable.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "kernels/bench/peers/flashinfer_peer.h"

namespace tandem::peer {

struct PeerWorkspace {
  void* float_buffer = nullptr;       // device, float_bytes
  void* int_buffer = nullptr;         // device, int_bytes
  void* pinned_int_buffer = nullptr;  // page-locked host, int_bytes
  size_t float_bytes = 0;
  size_t int_bytes = 0;

  PeerWorkspace() = default;
  PeerWorkspace(const PeerWorkspace&) = delete;
  PeerWorkspace& operator=(const PeerWorkspace&) = delete;
  ~PeerWorkspace() {
    cudaFree(float_buffer);
    cudaFree(int_buffer);
    cudaFreeHost(pinned_int_buffer);
  }

  // Allocates at least the sizes a plan asked for (its *WorkspaceSize functions). Returns "" or
  // the error.
  std::string Allocate(size_t float_size, size_t int_size) {
    constexpr size_t kMinBytes = 256;  // never a zero-size buffer: plans index from its start
    float_bytes = std::max(float_size, kMinBytes);
    int_bytes = std::max(int_size, kMinBytes);
    cudaError_t e = cudaMalloc(&float_buffer, float_bytes);
    if (e == cudaSuccess) e = cudaMalloc(&int_buffer, int_bytes);
    if (e == cudaSuccess) e = cudaMallocHost(&pinned_int_buffer, int_bytes);
    return e == cudaSuccess ? "" : std::string("workspace: ") + cudaGetErrorString(e);
  }
};

}  // namespace tandem::peer
