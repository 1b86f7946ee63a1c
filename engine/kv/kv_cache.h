// KvCache: the paged KV pool of one worker GPU (or of the CPU backend), allocated once at
// start-up, plus the BlockAllocator that hands out its page ids. The memory layout is
// kernels/common/kv_layout.h; where the bytes live (host or device) is a KvMemory's business.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/kv/block_allocator.h"
#include "kernels/common/kv_layout.h"

namespace tandem {

// Owns one allocation of pool memory. Implementations: host memory (CPU backend, tests) and,
// later, device memory (cudaMalloc) for the CUDA backend.
class KvMemory {
 public:
  virtual ~KvMemory() = default;
  virtual void* data() = 0;
  virtual int64_t bytes() const = 0;
};

// Zero-filled, 64-byte aligned host memory. ResourceExhausted if the allocation fails.
absl::StatusOr<std::unique_ptr<KvMemory>> AllocateHostKvMemory(int64_t bytes);

class KvCache {
 public:
  // How many pages of `layout` (whose num_pages is ignored) fit in `memory_bytes`.
  static int NumPagesFor(KvLayout layout, int64_t memory_bytes);

  // `layout.num_pages` >= 1; `memory` holds at least layout.PoolBytes().
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvLayout& layout,
                                                         std::unique_ptr<KvMemory> memory);
  // Host memory (the CPU backend).
  static absl::StatusOr<std::unique_ptr<KvCache>> CreateOnHost(const KvLayout& layout);

  const KvLayout& layout() const { return layout_; }
  void* pool() { return memory_->data(); }
  // Start of layer `layer`'s pages: [num_pages][2][num_kv_heads][page_size][head_dim].
  void* layer(int layer);
  BlockAllocator& allocator() { return allocator_; }
  const BlockAllocator& allocator() const { return allocator_; }

 private:
  KvCache(const KvLayout& layout, std::unique_ptr<KvMemory> memory);

  KvLayout layout_;
  std::unique_ptr<KvMemory> memory_;
  BlockAllocator allocator_;
};

}  // namespace tandem
