// KV pages between groups of different tensor / pipeline parallelism (the host KV transport
// lands pages through it: comm/tcp_kv_receiver.h, wire version 6 in comm/kv_wire.h).
//
// A group's pool stacks its ranks' pools (engine/model/parallel_model.h), rank s · TP + r being
// TP rank r of pipeline stage s:
//     [rank][layer of its stage][page][K|V][kv head of the rank][page_size][head_dim]
// stage s holding a contiguous range of layers (engine/model/tensor_shard.h StageOf: the first
// num_layers % PP stages one layer longer), and TP rank r holding Hkv / TP consecutive KV heads
// from r · Hkv / TP, or, when TP exceeds Hkv (a multiple), the one head r / (TP / Hkv) (vLLM's
// rule; tensor_shard.h). Model layer l of TP rank r is thus stacked layer
//     TP · first(s) + r · count(s) + (l - first(s))      (s the stage holding l)
// A page of one group maps onto pages of the other by layers and KV-head ranges: for one page of
// a source stacked layer, PlanHeadCopies lists the runs of heads it gives each destination
// stacked layer. Every destination (layer, head) is written by exactly one source (rank, layer):
// of the source ranks that hold a replicated head, the lowest. Groups of one shape map every
// page to itself (the transfer's fast path).
//
// Sizes come from KvLayout (PoolLayout): a page is [K|V][head] runs of equal bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/common/kv_layout.h"

namespace tandem {

// The KV side of one group: its TP and PP sizes, the model's KV heads and layers, the page shape.
struct KvGroupShape {
  int tensor_parallel = 1;
  int total_kv_heads = 0;
  int num_layers = 0;  // model layers (the pool has tensor_parallel * num_layers)
  int page_size = 0;
  int head_dim = 0;
  DType dtype = DType::kBF16;
  int pipeline_parallel = 1;

  // The group of one rank (TP = PP = 1) whose pool is `layout`.
  static KvGroupShape Single(const KvLayout& layout);

  int KvHeadsPerRank() const;
  int FirstKvHead(int tp_rank) const;
  // Stage `stage`'s model layers [StageFirstLayer, StageFirstLayer + StageNumLayers).
  int StageFirstLayer(int stage) const;
  int StageNumLayers(int stage) const;
  // The stage holding model layer `layer`.
  int StageOfLayer(int layer) const;
  // Where model layer `layer` of TP rank `tp_rank` is in the stacked pool, and back.
  int StackedLayer(int tp_rank, int layer) const;
  void Locate(int stacked_layer, int* tp_rank, int* layer) const;
  // The group's stacked pool layout with num_pages pages.
  KvLayout PoolLayout(int num_pages) const;
  // "TP 2 x PP 1" (for messages).
  std::string SizesString() const;

  bool operator==(const KvGroupShape&) const = default;
};

// InvalidArgument unless the shape is one a group has (positive sizes; TP divides the KV heads
// or is a multiple of them; 1 <= PP <= layers).
absl::Status CheckKvGroupShape(const KvGroupShape& g);
// FailedPrecondition unless two groups hold the same model's KV (heads, layers, head_dim, page
// size, dtype); TP and PP may differ.
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

// One contiguous copy of a mapped page: `bytes` from `src_offset` in the source page to
// `dst_offset` from the start of the destination pool.
struct ByteRun {
  int64_t dst_offset = 0;
  int64_t src_offset = 0;
  int64_t bytes = 0;
};

// The byte runs that land one source page through `copies` in page dst_page of a destination
// pool laid out as dst_layout (dst.PoolLayout): one run per copy of whole pages (same heads on
// both sides), else one for K and one for V.
std::vector<ByteRun> HeadCopyRuns(const KvGroupShape& src, const KvGroupShape& dst,
                                  const std::vector<HeadCopy>& copies, const KvLayout& dst_layout,
                                  int dst_page);

// Applies copies to one page by memcpy: src_page is a source page (src.PoolLayout PageBytes
// bytes), dst_pool the destination pool laid out as dst_layout, dst_page its page id.
void ApplyHeadCopies(const KvGroupShape& src, const KvGroupShape& dst,
                     const std::vector<HeadCopy>& copies, const char* src_page,
                     const KvLayout& dst_layout, char* dst_pool, int dst_page);

}  // namespace tandem
