// comm/kv_head_map.h: pages of a TP x PP group mapped onto another's pages, bytes exact; the
// stacked-layer order agrees with the engine's stage split (engine/model/tensor_shard.h).
#include "comm/kv_head_map.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/model/tensor_shard.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int32_t kUnset = -7;

// The value of one K/V element, from its place in the whole (TP 1) cache.
int32_t Value(int layer, int kv, int head, int64_t slot, int d) {
  return ((((layer * 2 + kv) * 16 + head) * 1000 + static_cast<int32_t>(slot)) * 8) + d;
}

// A group's pool holding `tokens` tokens in pages `ids` (page i of the sequence is ids[i]);
// every other element is `garbage` (the unused tail of the last page too). `swap_ranks`
// exchanges TP ranks 0 and 1's contents (a wrong head range, which the mapping must not hide);
// `swap_layers` model layers 0 and num_layers - 1 (a wrong stage order).
std::vector<int32_t> FillPool(const KvGroupShape& g, int num_pages, const std::vector<int>& ids,
                              int tokens, int32_t garbage, bool swap_ranks = false,
                              bool swap_layers = false) {
  const KvLayout l = g.PoolLayout(num_pages);
  std::vector<int32_t> pool(static_cast<size_t>(l.PoolBytes() / 4), garbage);
  for (int r = 0; r < g.tensor_parallel; ++r) {
    const int data_rank = swap_ranks && r < 2 ? 1 - r : r;
    for (int layer = 0; layer < g.num_layers; ++layer) {
      const int stacked = g.StackedLayer(r, layer);
      const int data_layer = !swap_layers                ? layer
                             : layer == 0                ? g.num_layers - 1
                             : layer == g.num_layers - 1 ? 0
                                                         : layer;
      for (int t = 0; t < tokens; ++t) {
        const int64_t slot = int64_t{ids[t / g.page_size]} * g.page_size + t % g.page_size;
        for (int kv = 0; kv < 2; ++kv) {
          for (int h = 0; h < l.num_kv_heads; ++h) {
            for (int d = 0; d < g.head_dim; ++d) {
              pool[l.PageOffset(stacked, 0) + l.SlotOffset(slot, kv, h) + d] =
                  Value(data_layer, kv, g.FirstKvHead(data_rank) + h, t, d);
            }
          }
        }
      }
    }
  }
  return pool;
}

struct Case {
  int heads, src_tp, dst_tp;
  int src_pp = 1, dst_pp = 1;
};

class KvHeadMapTest : public ::testing::TestWithParam<Case> {};

// Source pool -> destination pool through the plan of every source layer and page; returns the
// destination pool and counts how often each destination (stacked layer, head) was written.
std::vector<int32_t> Map(const KvGroupShape& src, const KvGroupShape& dst,
                         const std::vector<int32_t>& src_pool, int src_pages,
                         const std::vector<int>& src_ids, int dst_pages,
                         const std::vector<int>& dst_ids, std::vector<int>* writes) {
  const KvLayout sl = src.PoolLayout(src_pages);
  const KvLayout dl = dst.PoolLayout(dst_pages);
  std::vector<int32_t> dst_pool(static_cast<size_t>(dl.PoolBytes() / 4), kUnset);
  writes->assign(static_cast<size_t>(dl.num_layers) * dl.num_kv_heads, 0);
  for (int layer = 0; layer < sl.num_layers; ++layer) {
    absl::StatusOr<std::vector<HeadCopy>> plan = PlanHeadCopies(src, dst, layer);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) continue;
    for (const HeadCopy& c : *plan) {
      for (int h = 0; h < c.count; ++h) ++(*writes)[c.dst_layer * dl.num_kv_heads + c.dst_head + h];
    }
    for (size_t i = 0; i < src_ids.size(); ++i) {
      const char* page =
          reinterpret_cast<const char*>(src_pool.data() + sl.PageOffset(layer, src_ids[i]));
      ApplyHeadCopies(src, dst, *plan, page, dl, reinterpret_cast<char*>(dst_pool.data()),
                      dst_ids[i]);
    }
  }
  return dst_pool;
}

// How many elements of the destination's written tokens differ from the whole cache's.
int64_t Mismatches(const KvGroupShape& dst, const std::vector<int32_t>& pool, int num_pages,
                   const std::vector<int>& ids, int tokens) {
  const KvLayout l = dst.PoolLayout(num_pages);
  int64_t bad = 0;
  for (int r = 0; r < dst.tensor_parallel; ++r) {
    for (int layer = 0; layer < dst.num_layers; ++layer) {
      for (int t = 0; t < tokens; ++t) {
        const int64_t slot = int64_t{ids[t / dst.page_size]} * dst.page_size + t % dst.page_size;
        for (int kv = 0; kv < 2; ++kv) {
          for (int h = 0; h < l.num_kv_heads; ++h) {
            for (int d = 0; d < dst.head_dim; ++d) {
              const int32_t got =
                  pool[l.PageOffset(dst.StackedLayer(r, layer), 0) + l.SlotOffset(slot, kv, h) + d];
              if (got != Value(layer, kv, dst.FirstKvHead(r) + h, t, d)) ++bad;
            }
          }
        }
      }
    }
  }
  return bad;
}

TEST_P(KvHeadMapTest, BytesExactWithPartialLastPage) {
  const Case c = GetParam();
  KvGroupShape src{c.src_tp,        c.heads,        /*num_layers=*/3,
                   /*page_size=*/4, /*head_dim=*/5, DType::kI32,      c.src_pp};
  KvGroupShape dst = src;
  dst.tensor_parallel = c.dst_tp;
  dst.pipeline_parallel = c.dst_pp;
  ASSERT_TRUE(CheckMappable(src, dst).ok());
  const int tokens = 13;  // 4 pages, the last holding 1 token
  const std::vector<int> src_ids = {5, 0, 3, 2};
  const std::vector<int> dst_ids = {1, 6, 4, 0};
  const std::vector<int32_t> src_pool = FillPool(src, 6, src_ids, tokens, /*garbage=*/-3);
  std::vector<int> writes;
  const std::vector<int32_t> dst_pool = Map(src, dst, src_pool, 6, src_ids, 7, dst_ids, &writes);
  EXPECT_EQ(Mismatches(dst, dst_pool, 7, dst_ids, tokens), 0);
  // Every destination head of every layer is written by exactly one source rank.
  for (size_t i = 0; i < writes.size(); ++i) EXPECT_EQ(writes[i], 1) << "head slot " << i;
  // Pages outside the transfer are untouched.
  const KvLayout dl = dst.PoolLayout(7);
  for (int layer = 0; layer < dl.num_layers; ++layer) {
    for (int p : {2, 3, 5}) {
      for (int64_t e = 0; e < dl.PageElems(); ++e) {
        ASSERT_EQ(dst_pool[dl.PageOffset(layer, p) + e], kUnset)
            << "layer " << layer << " page " << p;
      }
    }
  }
  // The tail of the partial last page carries the source's bytes (whole pages move).
  EXPECT_EQ(dst_pool[dl.PageOffset(0, 0) + dl.SlotOffset(1, 0, 0)], -3);
  // A wrong head range (the source's ranks 0 and 1 exchanged) is seen, unless both hold the
  // same replicated head.
  if (c.src_tp >= 2 && src.FirstKvHead(0) != src.FirstKvHead(1)) {
    const std::vector<int32_t> swapped = FillPool(src, 6, src_ids, tokens, -3, true);
    const std::vector<int32_t> wrong = Map(src, dst, swapped, 6, src_ids, 7, dst_ids, &writes);
    EXPECT_GT(Mismatches(dst, wrong, 7, dst_ids, tokens), 0);
  }
  // A wrong layer order (the first and last model layers exchanged) is seen.
  const std::vector<int32_t> relayered = FillPool(src, 6, src_ids, tokens, -3, false, true);
  const std::vector<int32_t> wrong = Map(src, dst, relayered, 6, src_ids, 7, dst_ids, &writes);
  EXPECT_GT(Mismatches(dst, wrong, 7, dst_ids, tokens), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, KvHeadMapTest,
    ::testing::Values(Case{4, 2, 1}, Case{4, 1, 2}, Case{4, 2, 2}, Case{4, 4, 2}, Case{4, 2, 4},
                      Case{1, 2, 1}, Case{1, 1, 2}, Case{2, 4, 1}, Case{2, 1, 4}, Case{2, 4, 2},
                      Case{2, 2, 4}, Case{3, 3, 1}, Case{3, 1, 3}, Case{3, 6, 1}, Case{3, 1, 6},
                      // Pipeline stages (3 layers: uneven splits).
                      Case{4, 2, 1, 2, 1}, Case{4, 1, 2, 1, 2}, Case{4, 2, 2, 2, 1},
                      Case{4, 2, 2, 1, 3}, Case{2, 1, 1, 3, 2}, Case{1, 2, 1, 3, 1},
                      Case{1, 1, 2, 1, 2}, Case{2, 4, 2, 2, 3}));

// The stacked order: stage by stage, within a stage TP rank by rank (parallel_model.h), as the
// engine splits layers (StageOf).
TEST(KvHeadMap, StackedLayersFollowTheEnginesStages) {
  for (int layers = 1; layers <= 7; ++layers) {
    for (int pp = 1; pp <= layers; ++pp) {
      for (int tp : {1, 2, 3}) {
        const KvGroupShape g{tp, 6, layers, 4, 8, DType::kBF16, pp};
        ASSERT_TRUE(CheckKvGroupShape(g).ok());
        std::vector<int> seen(static_cast<size_t>(tp * layers), 0);
        int next = 0;  // the stacked layer the engine gives the next (stage, rank, layer)
        for (int s = 0; s < pp; ++s) {
          const StageLayers st = StageOf(layers, pp, s);
          EXPECT_EQ(g.StageFirstLayer(s), st.first);
          EXPECT_EQ(g.StageNumLayers(s), st.count);
          for (int r = 0; r < tp; ++r) {
            for (int l = st.first; l < st.first + st.count; ++l, ++next) {
              EXPECT_EQ(g.StageOfLayer(l), s);
              const int stacked = g.StackedLayer(r, l);
              EXPECT_EQ(stacked, next) << "layers " << layers << " pp " << pp << " tp " << tp;
              int back_rank = -1, back_layer = -1;
              g.Locate(stacked, &back_rank, &back_layer);
              EXPECT_EQ(back_rank, r);
              EXPECT_EQ(back_layer, l);
              ++seen[static_cast<size_t>(stacked)];
            }
          }
        }
        for (int n : seen) EXPECT_EQ(n, 1);
      }
    }
  }
}

// Groups of one shape: each page to itself, one whole-page run. Same TP, other PP: whole pages
// to other stacked layers (no head split).
TEST(KvHeadMap, SameShapeIsTheIdentityAndSameTpMovesWholePages) {
  const KvGroupShape a{2, 4, 3, 4, 5, DType::kBF16, 1};
  const KvLayout la = a.PoolLayout(8);
  for (int l = 0; l < la.num_layers; ++l) {
    absl::StatusOr<std::vector<HeadCopy>> p = PlanHeadCopies(a, a, l);
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(p->size(), 1u);
    EXPECT_EQ((*p)[0].dst_layer, l);
    const std::vector<ByteRun> runs = HeadCopyRuns(a, a, *p, la, 3);
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs[0].bytes, la.PageBytes());
    EXPECT_EQ(runs[0].src_offset, 0);
    EXPECT_EQ(runs[0].dst_offset, la.PageOffset(l, 3) * 2);
  }
  KvGroupShape b = a;
  b.pipeline_parallel = 3;                    // stacked: [r0 l0][r1 l0][r0 l1][r1 l1][r0 l2][r1 l2]
  const int want_dst[] = {0, 2, 4, 1, 3, 5};  // of a's [r0 l0][r0 l1][r0 l2][r1 l0] ...
  for (int l = 0; l < la.num_layers; ++l) {
    absl::StatusOr<std::vector<HeadCopy>> p = PlanHeadCopies(a, b, l);
    ASSERT_TRUE(p.ok());
    ASSERT_EQ(p->size(), 1u);
    EXPECT_EQ((*p)[0].dst_layer, want_dst[l]) << l;
    EXPECT_EQ(HeadCopyRuns(a, b, *p, b.PoolLayout(8), 0).size(), 1u);
  }
  // TP 2 -> 1: each source page gives half a destination page, K and V apart.
  KvGroupShape one = a;
  one.tensor_parallel = 1;
  absl::StatusOr<std::vector<HeadCopy>> p = PlanHeadCopies(a, one, 3);  // rank 1, layer 0
  ASSERT_TRUE(p.ok());
  const KvLayout lo = one.PoolLayout(8);
  const std::vector<ByteRun> runs = HeadCopyRuns(a, one, *p, lo, 2);
  ASSERT_EQ(runs.size(), 2u);
  const int64_t head_bytes = 4 * 5 * 2;
  EXPECT_EQ(runs[0].bytes, 2 * head_bytes);
  EXPECT_EQ(runs[0].src_offset, 0);
  EXPECT_EQ(runs[0].dst_offset, lo.PageOffset(0, 2) * 2 + 2 * head_bytes);  // K heads 2, 3
  EXPECT_EQ(runs[1].src_offset, 2 * head_bytes);                            // the rank's V
  EXPECT_EQ(runs[1].dst_offset, lo.PageOffset(0, 2) * 2 + 6 * head_bytes);  // V heads 2, 3
}

TEST(KvHeadMap, RefusesOtherModelsAndBadShapes) {
  const KvGroupShape a{2, 4, 3, 4, 5, DType::kBF16};
  KvGroupShape b = a;
  b.tensor_parallel = 1;
  EXPECT_TRUE(CheckMappable(a, b).ok());
  KvGroupShape c = b;
  c.total_kv_heads = 2;
  EXPECT_EQ(CheckMappable(a, c).code(), absl::StatusCode::kFailedPrecondition);
  c = b;
  c.num_layers = 4;
  EXPECT_EQ(CheckMappable(a, c).code(), absl::StatusCode::kFailedPrecondition);
  c = b;
  c.page_size = 8;
  EXPECT_EQ(CheckMappable(a, c).code(), absl::StatusCode::kFailedPrecondition);
  c = b;
  c.dtype = DType::kF32;
  EXPECT_EQ(CheckMappable(a, c).code(), absl::StatusCode::kFailedPrecondition);
  c = b;
  c.tensor_parallel = 3;  // neither divides 4 nor a multiple of it
  EXPECT_EQ(CheckMappable(a, c).code(), absl::StatusCode::kInvalidArgument);
  c = b;
  c.head_dim = 0;
  EXPECT_EQ(CheckMappable(a, c).code(), absl::StatusCode::kInvalidArgument);
  c = b;
  c.pipeline_parallel = 2;  // other stages: mappable
  EXPECT_TRUE(CheckMappable(a, c).ok());
  // FP8 pages (codes, then scales) map as whole pages only: other PP yes, other TP no.
  KvGroupShape f8 = a;
  f8.dtype = DType::kF8E4M3;
  c = f8;
  c.pipeline_parallel = 2;
  c.num_layers = a.num_layers;
  EXPECT_TRUE(CheckMappable(f8, c).ok());
  c = f8;
  c.tensor_parallel = 1;
  EXPECT_EQ(CheckMappable(f8, c).code(), absl::StatusCode::kFailedPrecondition);
  c.pipeline_parallel = 4;  // more stages than layers
  EXPECT_EQ(CheckMappable(a, c).code(), absl::StatusCode::kInvalidArgument);
  c.pipeline_parallel = 0;
  EXPECT_EQ(CheckMappable(a, c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanHeadCopies(a, b, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanHeadCopies(a, b, 6).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(PlanHeadCopies(a, b, 5).ok());
}

// The plan itself for TP 2 -> TP 1 and back (4 KV heads, 3 layers).
TEST(KvHeadMap, PlansOfTwoToOneAndBack) {
  const KvGroupShape two{2, 4, 3, 4, 5, DType::kBF16};
  KvGroupShape one = two;
  one.tensor_parallel = 1;
  absl::StatusOr<std::vector<HeadCopy>> p = PlanHeadCopies(two, one, 4);  // rank 1, layer 1
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->size(), 1u);
  EXPECT_EQ((*p)[0].dst_layer, 1);
  EXPECT_EQ((*p)[0].src_head, 0);
  EXPECT_EQ((*p)[0].dst_head, 2);
  EXPECT_EQ((*p)[0].count, 2);
  p = PlanHeadCopies(one, two, 2);  // layer 2 of the whole pool
  ASSERT_TRUE(p.ok());
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].dst_layer, 2);
  EXPECT_EQ((*p)[0].src_head, 0);
  EXPECT_EQ((*p)[1].dst_layer, 5);
  EXPECT_EQ((*p)[1].src_head, 2);
  EXPECT_EQ((*p)[1].dst_head, 0);
  EXPECT_EQ((*p)[1].count, 2);
}

}  // namespace
}  // namespace tandem
