// KvIpcDevice (comm/kv_ipc.h) over the CUDA runtime: legacy IPC memory handles
// (cudaIpcGetMemHandle / cudaIpcOpenMemHandle) for the pool allocation, and per layer KvPageCopy
// launches (kernels/kv_page_copy) on a per-thread non-blocking stream, each after a
// cudaStreamWaitEvent on the layer's compute event (no host wait until WaitCopies).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/cuda_check.h"
#include "base/status_macros.h"
#include "comm/kv_ipc.h"
#include "kernels/kv_page_copy/kv_page_copy.h"

namespace tandem {
namespace {

// The exported handle: the allocation's IPC handle, the pool's offset in it, the device.
struct WireHandle {
  cudaIpcMemHandle_t mem;
  int64_t offset;
  int32_t device;
};

class CudaKvIpc final : public KvIpcDevice {
 public:
  ~CudaKvIpc() override {
    absl::MutexLock l(&mu_);
    for (auto& [key, base] : opened_) cudaIpcCloseMemHandle(base);
  }

  absl::StatusOr<std::string> ExportPool(void* pool) override {
    cudaPointerAttributes attr{};
    CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, pool));
    if (attr.type != cudaMemoryTypeDevice) {
      return absl::FailedPreconditionError("the KV pool is not device memory: no CUDA IPC");
    }
    CUDA_RETURN_IF_ERROR(cudaSetDevice(attr.device));
    // The handle names the allocation that holds `pool`; the engine allocates its pool alone
    // (Ops::Allocate: one cudaMalloc), so the pool is the allocation's start: offset 0.
    WireHandle h{};
    CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h.mem, pool));
    h.offset = 0;
    h.device = attr.device;
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
  }

  absl::StatusOr<void*> OpenPool(const std::string& handle) override {
    if (handle.size() != sizeof(WireHandle)) {
      return absl::InvalidArgumentError("not a CUDA IPC pool handle");
    }
    WireHandle h;
    std::memcpy(&h, handle.data(), sizeof(h));
    const std::string key(reinterpret_cast<const char*>(&h.mem), sizeof(h.mem));
    absl::MutexLock l(&mu_);
    auto it = opened_.find(key);
    if (it == opened_.end()) {
      void* base = nullptr;
      const cudaError_t e = cudaIpcOpenMemHandle(&base, h.mem, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return absl::FailedPreconditionError(absl::StrCat(
            "cudaIpcOpenMemHandle (peer pool on device ", h.device, "): ", cudaGetErrorString(e)));
      }
      it = opened_.emplace(key, base).first;
    }
    return static_cast<void*>(static_cast<char*>(it->second) + h.offset);
  }

  absl::Status CopyLayerAsync(void* dst_pool, const KvLayout& dst, const void* src_pool,
                              const KvLayout& src, int layer, absl::Span<const int32_t> dst_pages,
                              absl::Span<const int32_t> src_pages, void* after_event) override {
    return CopyLayersAsync(dst_pool, dst, src_pool, src, layer, 1, dst_pages, src_pages,
                           after_event);
  }

  absl::Status CopyLayersAsync(void* dst_pool, const KvLayout& dst, const void* src_pool,
                               const KvLayout& src, int layer, int num_layers,
                               absl::Span<const int32_t> dst_pages,
                               absl::Span<const int32_t> src_pages, void* after_event) override {
    if (dst_pages.size() != src_pages.size() || layer < 0 || num_layers < 1 ||
        layer + num_layers > src.num_layers || num_layers > kKvPageCopyMaxLayers ||
        dst.num_layers != src.num_layers || dst.PageBytes() != src.PageBytes()) {
      return absl::InvalidArgumentError("CopyLayerAsync: pages or layouts do not match");
    }
    for (size_t i = 0; i < src_pages.size(); ++i) {
      if (src_pages[i] < 0 || src_pages[i] >= src.num_pages || dst_pages[i] < 0 ||
          dst_pages[i] >= dst.num_pages) {
        return absl::InvalidArgumentError("CopyLayerAsync: a page outside its pool");
      }
    }
    ASSIGN_OR_RETURN(cudaStream_t stream, ThreadStream(src_pool));
    // The copy reads the layer only once the compute stream stored it (the engine's event).
    if (after_event != nullptr) {
      CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(after_event), 0));
    }
    const int64_t elem = DTypeSize(src.dtype);
    // One kernel launch per kKvPageCopyMaxPages pages, not one copy per run: on the H200 it
    // moved 8k tokens of Qwen3-8B KV at 394.8 GB/s scattered where per-run copies reached 10.3
    // (kernels/kv_page_copy/WORKLOG.md). CUDA pages (head_dim 64 or 128) are multiples of 16
    // bytes; KvPageCopy refuses anything else.
    KvPageCopyArgs a;
    a.dst_layer = static_cast<char*>(dst_pool) + dst.PageOffset(layer, 0) * elem;
    a.src_layer = static_cast<const char*>(src_pool) + src.PageOffset(layer, 0) * elem;
    a.page_bytes = src.PageBytes();
    // Every layer in one launch: the copy streams from layer to layer with no drain between.
    a.num_layers = num_layers;
    a.dst_layer_bytes = dst.LayerBytes();
    a.src_layer_bytes = src.LayerBytes();
    for (size_t i = 0; i < src_pages.size(); i += kKvPageCopyMaxPages) {
      a.num_pages = static_cast<int>(std::min<size_t>(kKvPageCopyMaxPages, src_pages.size() - i));
      std::copy_n(dst_pages.begin() + i, a.num_pages, a.dst_pages);
      std::copy_n(src_pages.begin() + i, a.num_pages, a.src_pages);
      RETURN_IF_ERROR(KvPageCopy(a, stream));
    }
    return absl::OkStatus();
  }

  absl::Status WaitCopies() override {
    cudaStream_t stream = thread_stream();
    if (stream == nullptr) return absl::OkStatus();  // this thread never copied
    CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    return absl::OkStatus();
  }

 private:
  // A non-blocking stream per transfer thread, on the device of `src_pool`.
  static cudaStream_t& thread_stream() {
    thread_local cudaStream_t stream = nullptr;
    return stream;
  }
  static absl::StatusOr<cudaStream_t> ThreadStream(const void* src_pool) {
    cudaStream_t& stream = thread_stream();
    if (stream == nullptr) {
      cudaPointerAttributes attr{};
      CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, src_pool));
      CUDA_RETURN_IF_ERROR(cudaSetDevice(attr.device));
      CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    }
    return stream;
  }

  absl::Mutex mu_;
  std::map<std::string, void*> opened_ ABSL_GUARDED_BY(mu_);  // handle bytes -> mapped base
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvIpcDevice>> MakeCudaKvIpc() {
  return std::unique_ptr<KvIpcDevice>(new CudaKvIpc());
}

}  // namespace tandem
