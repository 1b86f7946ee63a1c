// CUDA IPC for the KV transport, when a prefill and a decode worker share a GPU (or are NVLink
// peers): the decode worker exports its device KV pool once, a prefill worker maps it once per
// peer and copies pages straight into the reserved pages, device to device. The control path
// stays the TCP transport's connection (comm/kv_wire.h: the hello asks for IPC, the receiver
// answers with the pool handle and the transfer's page ids and grants the write of the whole
// reservation once; the sender enqueues each layer's copy as the layer is computed, ordered by
// an event, with no host wait, and confirms once after one stream synchronize), so the
// page-ownership rules are the TCP transport's: the pages stay `reserved` until the transfer's
// verdict, and KvReceiver::Cancel's `released` runs only once no byte lands any more.
//
// This is the device half behind an interface, so that comm/ needs no CUDA: the implementation
// is engine/cuda/cuda_kv_ipc.cc (built with TANDEM_CUDA; without it every call is Unimplemented).
// Thread-safe: transfer threads call it concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/common/kv_layout.h"

namespace tandem {

// Which data path a KV transfer takes (WorkerOptions::kv_transport, the layout's
// `kv_transport:`): tcp: page bytes over the socket (staged through host memory for a device
// pool); ipc: CUDA IPC, and a transfer fails (FailedPrecondition, saying why) where it is
// impossible; nccl: NCCL between two GPUs (comm/nccl_kv_transport.h), likewise; auto: NCCL
// where both workers have it and their pools are on different GPUs, else IPC where the sender
// can map the decode pool (the same GPU, or a peer), else TCP.
enum class KvTransportKind { kTcp, kIpc, kAuto, kNccl };
absl::StatusOr<KvTransportKind> ParseKvTransportKind(const std::string& name);
const char* KvTransportKindName(KvTransportKind kind);

class KvIpcDevice {
 public:
  virtual ~KvIpcDevice() = default;
  // Decode side, once at start-up: an opaque handle (a few dozen bytes) naming the device
  // allocation that holds `pool` and the pool's offset in it. FailedPrecondition if `pool` is
  // not device memory that can be exported.
  virtual absl::StatusOr<std::string> ExportPool(void* pool) = 0;
  // Prefill side: the exported pool mapped into this process (mapped once per handle and kept
  // until destruction). FailedPrecondition when the peer's device cannot be mapped from here
  // (another GPU without peer access, the same process).
  virtual absl::StatusOr<void*> OpenPool(const std::string& handle) = 0;
  // Enqueues the copy of layer `layer` of the pages `src_pages` of `src_pool` (this process's
  // pool, laid out as `src`) to the pages `dst_pages` of `dst_pool` (a mapped peer pool, laid out
  // as `dst`: the same page shape, its own num_pages) on the calling thread's copy stream, ordered
  // after `after_event` (a device event of this process, e.g. KvPushListener's for the layer;
  // null: the source pages are stored now). Returns without waiting for the copy: the source
  // and destination pages stay in use until WaitCopies returns.
  virtual absl::Status CopyLayerAsync(void* dst_pool, const KvLayout& dst, const void* src_pool,
                                      const KvLayout& src, int layer,
                                      absl::Span<const int32_t> dst_pages,
                                      absl::Span<const int32_t> src_pages, void* after_event) = 0;
  // CopyLayerAsync of the same pages in `num_layers` consecutive layers from `layer` on, in
  // one launch where the device can (the CUDA one does: no drain between layers). Default: one
  // CopyLayerAsync per layer.
  virtual absl::Status CopyLayersAsync(void* dst_pool, const KvLayout& dst, const void* src_pool,
                                       const KvLayout& src, int layer, int num_layers,
                                       absl::Span<const int32_t> dst_pages,
                                       absl::Span<const int32_t> src_pages, void* after_event) {
    for (int l = layer; l < layer + num_layers; ++l) {
      if (absl::Status st = CopyLayerAsync(dst_pool, dst, src_pool, src, l, dst_pages, src_pages,
                                           l == layer ? after_event : nullptr);
          !st.ok()) {
        return st;
      }
    }
    return absl::OkStatus();
  }
  // Waits until every copy the calling thread enqueued has landed (one stream synchronize); the
  // first error of any of them.
  virtual absl::Status WaitCopies() = 0;
};

// The CUDA implementation (engine/cuda/cuda_kv_ipc.cc), or Unimplemented in a build without
// CUDA.
absl::StatusOr<std::unique_ptr<KvIpcDevice>> MakeCudaKvIpc();

}  // namespace tandem
