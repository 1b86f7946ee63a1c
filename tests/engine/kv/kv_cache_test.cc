#include "engine/kv/kv_cache.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace tandem {
namespace {

KvLayout SmallLayout() {
  KvLayout layout;
  layout.num_layers = 3;
  layout.page_size = 4;
  layout.num_kv_heads = 2;
  layout.head_dim = 8;
  layout.dtype = DType::kBF16;
  return layout;
}

TEST(KvCacheTest, NumPagesFromMemoryBudget) {
  const KvLayout layout = SmallLayout();
  // One page id spans every layer: 3 layers * 2 (K, V) * 2 heads * 4 tokens * 8 dims * 2 bytes.
  const int64_t per_page = 3 * 2 * 2 * 4 * 8 * 2;
  EXPECT_EQ(KvCache::NumPagesFor(layout, per_page * 10), 10);
  EXPECT_EQ(KvCache::NumPagesFor(layout, per_page * 10 + per_page - 1), 10);
  EXPECT_EQ(KvCache::NumPagesFor(layout, per_page - 1), 0);
}

TEST(KvCacheTest, HostPoolIsZeroedAndLayersAreContiguous) {
  KvLayout layout = SmallLayout();
  layout.num_pages = 5;
  absl::StatusOr<std::unique_ptr<KvCache>> cache = KvCache::CreateOnHost(layout);
  ASSERT_TRUE(cache.ok()) << cache.status();
  KvCache& c = **cache;
  EXPECT_EQ(c.allocator().num_pages(), 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.pool()) % 64, 0u);
  const auto* bytes = static_cast<const uint8_t*>(c.pool());
  for (int64_t i = 0; i < layout.PoolBytes(); ++i) ASSERT_EQ(bytes[i], 0) << i;
  EXPECT_EQ(static_cast<char*>(c.layer(2)) - static_cast<char*>(c.pool()), 2 * layout.LayerBytes());
}

TEST(KvCacheTest, RejectsEmptyPoolAndShortMemory) {
  KvLayout layout = SmallLayout();
  layout.num_pages = 0;
  EXPECT_EQ(KvCache::CreateOnHost(layout).status().code(), absl::StatusCode::kInvalidArgument);
  layout.num_pages = 4;
  absl::StatusOr<std::unique_ptr<KvMemory>> small = AllocateHostKvMemory(64);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(KvCache::Create(layout, *std::move(small)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
