// KvPageCopy: copies whole pages of one layer from one KV pool to another on the same device
// (the CUDA IPC transfer: the decode worker's pool mapped into the prefill worker). One launch
// moves every page of a batch, where one cudaMemcpyAsync per scattered page costs a launch each
// (measured on the H200: 10.3 GB/s that way for 8k tokens of scattered 64 KiB pages).
//
// A layer's pages are contiguous, PageBytes() apart (kernels/common/kv_layout.h): page p of the
// layer starts at layer_base + p * page_bytes on either side.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/common/stream.h"

namespace tandem {

// Pages one launch carries (its page ids travel in the kernel parameters: 8 KiB).
inline constexpr int kKvPageCopyMaxPages = 1024;
// Layers one launch carries (the grid's z dimension).
inline constexpr int kKvPageCopyMaxLayers = 65535;

struct KvPageCopyArgs {
  void* dst_layer = nullptr;        // page 0 of the layer in the destination pool
  const void* src_layer = nullptr;  // page 0 of the layer in the source pool
  int64_t page_bytes = 0;           // a multiple of 16; both bases 16-byte aligned
  int num_pages = 0;                // <= kKvPageCopyMaxPages
  // The same pages of `num_layers` consecutive layers in one launch (<= kKvPageCopyMaxLayers):
  // layer k's page 0 is at dst_layer + k * dst_layer_bytes and src_layer + k * src_layer_bytes
  // (each pool's KvLayout::LayerBytes(), multiples of 16). One launch streams every layer with
  // no gap between them, where one launch per layer drains and refills the GPU 36 times.
  int num_layers = 1;
  int64_t dst_layer_bytes = 0;
  int64_t src_layer_bytes = 0;
  int32_t dst_pages[kKvPageCopyMaxPages];
  int32_t src_pages[kKvPageCopyMaxPages];
};

// dst page dst_pages[i] = src page src_pages[i], for i < num_pages, in each of the num_layers
// layers. InvalidArgument for a count or alignment outside the contract (page ids are the caller's
// to check against its pools).
absl::Status KvPageCopy(const KvPageCopyArgs& args, cudaStream_t stream);
// The CPU reference over host pointers (tests).
absl::Status KvPageCopyRef(const KvPageCopyArgs& args);

}  // namespace tandem
