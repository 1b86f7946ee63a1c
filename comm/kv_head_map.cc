#include "comm/kv_head_map.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {

KvGroupShape KvGroupShape::Single(const KvLayout& layout) {
  KvGroupShape g;
  g.tensor_parallel = 1;
  g.pipeline_parallel = 1;
  g.total_kv_heads = layout.num_kv_heads;
  g.num_layers = layout.num_layers;
  g.page_size = layout.page_size;
  g.head_dim = layout.head_dim;
  g.dtype = layout.dtype;
  return g;
}

int KvGroupShape::KvHeadsPerRank() const {
  return total_kv_heads >= tensor_parallel ? total_kv_heads / tensor_parallel : 1;
}

int KvGroupShape::FirstKvHead(int tp_rank) const {
  if (total_kv_heads >= tensor_parallel) return tp_rank * (total_kv_heads / tensor_parallel);
  return tp_rank / (tensor_parallel / total_kv_heads);
}

// As engine/model/tensor_shard.cc StageOf (kv_head_map_test checks they agree).
int KvGroupShape::StageFirstLayer(int stage) const {
  const int base = num_layers / pipeline_parallel, extra = num_layers % pipeline_parallel;
  return stage * base + std::min(stage, extra);
}

int KvGroupShape::StageNumLayers(int stage) const {
  const int base = num_layers / pipeline_parallel, extra = num_layers % pipeline_parallel;
  return base + (stage < extra ? 1 : 0);
}

int KvGroupShape::StageOfLayer(int layer) const {
  int s = 0;
  while (s + 1 < pipeline_parallel && StageFirstLayer(s + 1) <= layer) ++s;
  return s;
}

int KvGroupShape::StackedLayer(int tp_rank, int layer) const {
  const int s = StageOfLayer(layer);
  const int first = StageFirstLayer(s);
  return tensor_parallel * first + tp_rank * StageNumLayers(s) + (layer - first);
}

void KvGroupShape::Locate(int stacked_layer, int* tp_rank, int* layer) const {
  int s = 0;
  while (s + 1 < pipeline_parallel && tensor_parallel * StageFirstLayer(s + 1) <= stacked_layer) {
    ++s;
  }
  const int within = stacked_layer - tensor_parallel * StageFirstLayer(s);
  *tp_rank = within / StageNumLayers(s);
  *layer = StageFirstLayer(s) + within % StageNumLayers(s);
}

KvLayout KvGroupShape::PoolLayout(int num_pages) const {
  KvLayout l;
  l.num_layers = tensor_parallel * num_layers;
  l.num_pages = num_pages;
  l.page_size = page_size;
  l.num_kv_heads = KvHeadsPerRank();
  l.head_dim = head_dim;
  l.dtype = dtype;
  return l;
}

std::string KvGroupShape::SizesString() const {
  return absl::StrCat("TP ", tensor_parallel, " x PP ", pipeline_parallel);
}

absl::Status CheckKvGroupShape(const KvGroupShape& g) {
  if (g.tensor_parallel <= 0 || g.pipeline_parallel <= 0 || g.total_kv_heads <= 0 ||
      g.num_layers <= 0 || g.page_size <= 0 || g.head_dim <= 0) {
    return absl::InvalidArgumentError("KV group shape: every size must be positive");
  }
  const bool split = g.total_kv_heads % g.tensor_parallel == 0;
  const bool replicated = g.tensor_parallel % g.total_kv_heads == 0;
  if (!split && !replicated) {
    return absl::InvalidArgumentError(absl::StrCat("KV group shape: TP ", g.tensor_parallel,
                                                   " neither divides nor is a multiple of ",
                                                   g.total_kv_heads, " KV heads"));
  }
  if (g.pipeline_parallel > g.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("KV group shape: PP ", g.pipeline_parallel,
                                                   " exceeds the ", g.num_layers, " layers"));
  }
  return absl::OkStatus();
}

absl::Status CheckMappable(const KvGroupShape& src, const KvGroupShape& dst) {
  if (absl::Status st = CheckKvGroupShape(src); !st.ok()) return st;
  if (absl::Status st = CheckKvGroupShape(dst); !st.ok()) return st;
  if (src.total_kv_heads != dst.total_kv_heads || src.num_layers != dst.num_layers ||
      src.page_size != dst.page_size || src.head_dim != dst.head_dim || src.dtype != dst.dtype) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV of the two groups differs beyond TP / PP (KV heads ", src.total_kv_heads, " vs ",
        dst.total_kv_heads, ", layers ", src.num_layers, " vs ", dst.num_layers, ", page size ",
        src.page_size, " vs ", dst.page_size, ", head_dim ", src.head_dim, " vs ", dst.head_dim,
        ", dtype ", std::string(DTypeName(src.dtype)), " vs ", std::string(DTypeName(dst.dtype)),
        ")"));
  }
  // An FP8 page holds its codes, then its scales (kv_layout.h): the per-head runs of
  // HeadCopyRuns would cut through them. Whole pages (same TP, other PP) map fine.
  if (src.dtype == DType::kF8E4M3 && src.tensor_parallel != dst.tensor_parallel) {
    return absl::FailedPreconditionError(absl::StrCat(
        "FP8 KV pages between groups of different tensor_parallel (", src.tensor_parallel, " vs ",
        dst.tensor_parallel, ") are not mapped: use the same TP, or --kv-cache-dtype bf16"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HeadCopy>> PlanHeadCopies(const KvGroupShape& src,
                                                     const KvGroupShape& dst, int src_layer) {
  if (src_layer < 0 || src_layer >= src.tensor_parallel * src.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("source layer ", src_layer, " outside 0..",
                                                   src.tensor_parallel * src.num_layers - 1));
  }
  // One shape: every page to itself (replicated heads too: each rank's own copy).
  if (src == dst) return std::vector<HeadCopy>{{src_layer, 0, 0, src.KvHeadsPerRank()}};
  int rank = 0, layer = 0;
  src.Locate(src_layer, &rank, &layer);
  const int first = src.FirstKvHead(rank);
  const int count = src.KvHeadsPerRank();
  // A replicated head is given by the lowest source rank that holds it.
  if (rank > 0 && src.FirstKvHead(rank - 1) == first) return std::vector<HeadCopy>{};
  std::vector<HeadCopy> copies;
  for (int d = 0; d < dst.tensor_parallel; ++d) {
    const int d_first = dst.FirstKvHead(d);
    const int d_count = dst.KvHeadsPerRank();
    const int lo = std::max(first, d_first);
    const int hi = std::min(first + count, d_first + d_count);
    if (lo >= hi) continue;
    copies.push_back(HeadCopy{dst.StackedLayer(d, layer), lo - first, lo - d_first, hi - lo});
  }
  return copies;
}

std::vector<ByteRun> HeadCopyRuns(const KvGroupShape& src, const KvGroupShape& dst,
                                  const std::vector<HeadCopy>& copies, const KvLayout& dst_layout,
                                  int dst_page) {
  const KvLayout src_layout = src.PoolLayout(1);
  const int src_heads = src_layout.num_kv_heads;
  const int dst_heads = dst_layout.num_kv_heads;
  // A page is [K|V][head] runs of equal size (kv_layout.h): per-head bytes from the layout's.
  const int64_t head_bytes = src_layout.PageBytes() / (2 * int64_t{src_heads});
  const int64_t elem = DTypeSize(dst.dtype);
  std::vector<ByteRun> runs;
  for (const HeadCopy& c : copies) {
    const int64_t page = dst_layout.PageOffset(c.dst_layer, dst_page) * elem;
    if (c.count == src_heads && c.count == dst_heads) {  // the whole page
      runs.push_back(ByteRun{page, 0, dst_layout.PageBytes()});
      continue;
    }
    for (int kv = 0; kv < 2; ++kv) {
      runs.push_back(ByteRun{page + (int64_t{kv} * dst_heads + c.dst_head) * head_bytes,
                             (int64_t{kv} * src_heads + c.src_head) * head_bytes,
                             head_bytes * c.count});
    }
  }
  return runs;
}

void ApplyHeadCopies(const KvGroupShape& src, const KvGroupShape& dst,
                     const std::vector<HeadCopy>& copies, const char* src_page,
                     const KvLayout& dst_layout, char* dst_pool, int dst_page) {
  for (const ByteRun& r : HeadCopyRuns(src, dst, copies, dst_layout, dst_page)) {
    std::memcpy(dst_pool + r.dst_offset, src_page + r.src_offset, static_cast<size_t>(r.bytes));
  }
}

}  // namespace tandem
