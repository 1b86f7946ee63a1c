// KV pages between groups of different tensor parallelism (not wired into the transfer yet).
//
// A TP group's pool stacks its ranks' pools (engine/model/parallel_model.h):
//     [rank][layer][page][K|V][kv head of the rank][page_size][head_dim]
// rank r holding Hkv / TP consecutive KV heads from r * Hkv / TP, or, when TP exceeds Hkv (a
// multiple), the one head r / (TP / Hkv) (vLLM's rule; engine/model/tensor_shard.h FirstKvHead).
// A page of one group maps onto pages of the other by KV-head ranges: for one page of a source
// stacked layer, PlanHeadCopies lists the runs of heads it gives each destination stacked layer.
// Every destination (layer, head) is written by exactly one source (rank, layer): of the source
// ranks that hold a replicated head, the lowest.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/common/kv_layout.h"

namespace tandem {

// The KV side of one group: its TP size, the model's KV heads and layers (of the group's one
// stage), and the page shape.
struct KvGroupShape {
  int tensor_parallel = 1;
  int total_kv_heads = 0;
  int num_layers = 0;  // model layers (the pool has tensor_parallel * num_layers)
  int page_size = 0;
  int head_dim = 0;
  DType dtype = DType::kBF16;

  int KvHeadsPerRank() const;
  int FirstKvHead(int rank) const;
  // The group's stacked pool layout with num_pages pages.
  KvLayout PoolLayout(int num_pages) const;
};

// InvalidArgument unless the shape is one a TP group has (positive sizes; TP divides the KV
// heads or is a multiple of them).
absl::Status CheckKvGroupShape(const KvGroupShape& g);
// FailedPrecondition unless two groups hold the same model's KV (heads, layers, head_dim, page
// size, dtype); TP may differ.
absl::Status CheckMappable(const KvGroupShape& src, const KvGroupShape& dst);

// Heads [src_head, src_head + count) of the source rank's page go to heads [dst_head, ...) of
// destination stacked layer dst_layer (heads are indices within each rank's page).
struct HeadCopy {
  int dst_layer = 0;
  int src_head = 0;
  int dst_head = 0;
  int count = 0;
};

// The copies one page of source stacked layer src_layer gives (empty: its heads are another
// source rank's to give). Shapes must have passed CheckMappable; InvalidArgument on a bad layer.
absl::StatusOr<std::vector<HeadCopy>> PlanHeadCopies(const KvGroupShape& src,
                                                     const KvGroupShape& dst, int src_layer);

// Applies copies to one page: src_page is a source page (src.PoolLayout PageBytes bytes),
// dst_pool the destination pool laid out as dst_layout (dst.PoolLayout), dst_page its page id.
void ApplyHeadCopies(const KvGroupShape& src, const KvGroupShape& dst,
                     const std::vector<HeadCopy>& copies, const char* src_page,
                     const KvLayout& dst_layout, char* dst_pool, int dst_page);

}  // namespace tandem
