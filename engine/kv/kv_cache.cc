#include "engine/kv/kv_cache.h"

#include <cstdint>
#include <cstdlib>

#include "absl/strings/str_format.h"
#include "base/check.h"

namespace tandem {
namespace {

constexpr int64_t kHostAlignment = 64;

// calloc'd (large blocks come zeroed from the OS, page by page on first touch, so a big pool
// costs nothing until used), aligned by hand to kHostAlignment.
class HostKvMemory : public KvMemory {
 public:
  HostKvMemory(void* block, int64_t bytes) : block_(block), bytes_(bytes) {
    const auto address = reinterpret_cast<uintptr_t>(block);
    data_ =
        reinterpret_cast<void*>((address + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
  }
  ~HostKvMemory() override { std::free(block_); }
  void* data() override { return data_; }
  int64_t bytes() const override { return bytes_; }

 private:
  void* block_;
  void* data_;
  int64_t bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvMemory>> AllocateHostKvMemory(int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("KV pool of zero bytes");
  void* block = std::calloc(1, bytes + kHostAlignment);
  if (block == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot allocate a host KV pool of %d bytes", bytes));
  }
  return std::make_unique<HostKvMemory>(block, bytes);
}

int KvCache::NumPagesFor(KvLayout layout, int64_t memory_bytes) {
  layout.num_pages = 1;
  const int64_t per_page = layout.PoolBytes();  // one page id across all layers
  if (per_page <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(memory_bytes / per_page, INT32_MAX));
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvLayout& layout,
                                                         std::unique_ptr<KvMemory> memory) {
  if (layout.num_pages < 1 || layout.page_size < 1 || layout.num_layers < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV layout needs >= 1 page, layer and token per page (got %d, %d, %d)",
                        layout.num_pages, layout.num_layers, layout.page_size));
  }
  if (memory == nullptr || memory->bytes() < layout.PoolBytes()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV memory smaller than the pool (%d bytes)", layout.PoolBytes()));
  }
  return std::unique_ptr<KvCache>(new KvCache(layout, std::move(memory)));
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::CreateOnHost(const KvLayout& layout) {
  if (layout.num_pages < 1) return absl::InvalidArgumentError("KV cache needs >= 1 page");
  auto memory = AllocateHostKvMemory(layout.PoolBytes());
  if (!memory.ok()) return memory.status();
  return Create(layout, *std::move(memory));
}

KvCache::KvCache(const KvLayout& layout, std::unique_ptr<KvMemory> memory)
    : layout_(layout), memory_(std::move(memory)), allocator_(layout.num_pages) {}

void* KvCache::layer(int layer) {
  CHECK(layer >= 0 && layer < layout_.num_layers) << "layer " << layer;
  return static_cast<char*>(pool()) + layout_.PageOffset(layer, 0) * DTypeSize(layout_.dtype);
}

}  // namespace tandem
