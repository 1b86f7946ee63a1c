#include "engine/kv/kv_cache.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/check.h"

namespace tandem {
namespace {

constexpr int64_t kHostAlignment = 64;

class HostKvMemory : public KvMemory {
 public:
  HostKvMemory(void* data, int64_t bytes) : data_(data), bytes_(bytes) {}
  ~HostKvMemory() override { std::free(data_); }
  void* data() override { return data_; }
  int64_t bytes() const override { return bytes_; }

 private:
  void* data_;
  int64_t bytes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvMemory>> AllocateHostKvMemory(int64_t bytes) {
  if (bytes <= 0) return absl::InvalidArgumentError("KV pool of zero bytes");
  const int64_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* data = std::aligned_alloc(kHostAlignment, rounded);
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot allocate a host KV pool of %d bytes", bytes));
  }
  std::memset(data, 0, rounded);
  return std::make_unique<HostKvMemory>(data, rounded);
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
