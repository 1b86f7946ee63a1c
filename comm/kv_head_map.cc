#include "comm/kv_head_map.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {

int KvGroupShape::KvHeadsPerRank() const {
  return total_kv_heads >= tensor_parallel ? total_kv_heads / tensor_parallel : 1;
}

int KvGroupShape::FirstKvHead(int rank) const {
  if (total_kv_heads >= tensor_parallel) return rank * (total_kv_heads / tensor_parallel);
  return rank / (tensor_parallel / total_kv_heads);
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

absl::Status CheckKvGroupShape(const KvGroupShape& g) {
  if (g.tensor_parallel <= 0 || g.total_kv_heads <= 0 || g.num_layers <= 0 || g.page_size <= 0 ||
      g.head_dim <= 0) {
    return absl::InvalidArgumentError("KV group shape: every size must be positive");
  }
  const bool split = g.total_kv_heads % g.tensor_parallel == 0;
  const bool replicated = g.tensor_parallel % g.total_kv_heads == 0;
  if (!split && !replicated) {
    return absl::InvalidArgumentError(absl::StrCat("KV group shape: TP ", g.tensor_parallel,
                                                   " neither divides nor is a multiple of ",
                                                   g.total_kv_heads, " KV heads"));
  }
  return absl::OkStatus();
}

absl::Status CheckMappable(const KvGroupShape& src, const KvGroupShape& dst) {
  if (absl::Status st = CheckKvGroupShape(src); !st.ok()) return st;
  if (absl::Status st = CheckKvGroupShape(dst); !st.ok()) return st;
  if (src.total_kv_heads != dst.total_kv_heads || src.num_layers != dst.num_layers ||
      src.page_size != dst.page_size || src.head_dim != dst.head_dim || src.dtype != dst.dtype) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV of the two groups differs beyond TP (KV heads ", src.total_kv_heads,
                     " vs ", dst.total_kv_heads, ", layers ", src.num_layers, " vs ",
                     dst.num_layers, ", page size ", src.page_size, " vs ", dst.page_size,
                     ", head_dim ", src.head_dim, " vs ", dst.head_dim, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HeadCopy>> PlanHeadCopies(const KvGroupShape& src,
                                                     const KvGroupShape& dst, int src_layer) {
  if (src_layer < 0 || src_layer >= src.tensor_parallel * src.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("source layer ", src_layer, " outside 0..",
                                                   src.tensor_parallel * src.num_layers - 1));
  }
  const int rank = src_layer / src.num_layers;
  const int layer = src_layer % src.num_layers;
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
    copies.push_back(HeadCopy{d * dst.num_layers + layer, lo - first, lo - d_first, hi - lo});
  }
  return copies;
}

void ApplyHeadCopies(const KvGroupShape& src, const KvGroupShape& dst,
                     const std::vector<HeadCopy>& copies, const char* src_page,
                     const KvLayout& dst_layout, char* dst_pool, int dst_page) {
  const int64_t elem = DTypeSize(dst.dtype);
  const int64_t head_bytes = int64_t{src.page_size} * src.head_dim * elem;
  const int src_heads = src.KvHeadsPerRank();
  const int dst_heads = dst.KvHeadsPerRank();
  for (const HeadCopy& c : copies) {
    char* page = dst_pool + dst_layout.PageOffset(c.dst_layer, dst_page) * elem;
    for (int kv = 0; kv < 2; ++kv) {
      std::memcpy(page + (int64_t{kv} * dst_heads + c.dst_head) * head_bytes,
                  src_page + (int64_t{kv} * src_heads + c.src_head) * head_bytes,
                  static_cast<size_t>(head_bytes * c.count));
    }
  }
}

}  // namespace tandem
