// The KV page layout: the one definition shared by kernels, KV transfer and the allocator.
//
// A worker GPU owns one pool, allocated once at start-up:
//
//   pool  [num_layers][num_pages][2][num_kv_heads][page_size][head_dim]   (dtype, default bf16)
//                                 ^ 0 = K, 1 = V
//
// A *page id* p in [0, num_pages) names the same page slot in every layer; a request's block
// table is one list of page ids used by all layers. Page (layer, p) — page_size tokens of one
// layer's K and V for this GPU's KV heads — is one contiguous run of PageBytes() bytes, so a
// transfer of a page range of one layer is a handful of contiguous copies. Within a page, each
// head's tokens are contiguous ("HND"), so decode attention reads page_size * head_dim
// contiguous elements per (page, head).
//
// A *slot* is page * page_size + offset-in-page: where one token's K/V go in every layer.
//
// FP8 (dtype kF8E4M3, --kv-cache-dtype fp8): a page holds the e4m3 codes in the layout above,
// then one fp32 scale per (K|V, kv head, token), then zero padding to a multiple of 16 bytes:
//
//   page  [2][num_kv_heads][page_size][head_dim] e4m3 codes
//         [2][num_kv_heads][page_size]           fp32 scales   (value = code * scale; from a
//                                                 4-byte aligned offset)
//         pad to 16 bytes
//
// so a page is still one contiguous byte range (transfers, prefix cache and page copies carry
// the scales unchanged). Sizes and offsets below count units of DTypeSize(dtype) bytes: for fp8 a
// unit is one byte and PageElems() includes the scales and the padding, so
// `PageOffset(l, p) * DTypeSize(dtype)` is the page's byte offset for every dtype.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"

namespace tandem {

struct KvLayout {
  int num_layers = 0;
  int num_pages = 0;
  int page_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  DType dtype = DType::kBF16;

  static constexpr int64_t kFp8PageAlign = 16;  // bytes; fp8 pages are padded to a multiple

  bool fp8() const { return dtype == DType::kF8E4M3; }
  // Elements holding K/V values (codes for fp8) in one page: 2 * num_kv_heads * page_size * dim.
  int64_t PageCodeElems() const { return int64_t{2} * num_kv_heads * page_size * head_dim; }
  // fp8: byte offset of the scales within a page (the codes' size rounded up to 4 bytes).
  int64_t PageScaleStart() const { return (PageCodeElems() + 3) / 4 * 4; }
  // Units of one page: the codes, plus for fp8 the scales and the padding (see above).
  int64_t PageElems() const {
    if (!fp8()) return PageCodeElems();
    const int64_t bytes = PageScaleStart() + int64_t{2} * num_kv_heads * page_size * 4;
    return (bytes + kFp8PageAlign - 1) / kFp8PageAlign * kFp8PageAlign;
  }
  int64_t PageBytes() const { return PageElems() * DTypeSize(dtype); }
  int64_t LayerElems() const { return PageElems() * num_pages; }
  int64_t LayerBytes() const { return LayerElems() * DTypeSize(dtype); }
  int64_t PoolBytes() const { return LayerBytes() * num_layers; }

  // Element offset of page `page` of layer `layer` from the start of the pool.
  int64_t PageOffset(int layer, int page) const {
    return int64_t{layer} * LayerElems() + int64_t{page} * PageElems();
  }
  // Element offset, within one layer's pages, of K (kv = 0) or V (kv = 1) of one token slot.
  int64_t SlotOffset(int64_t slot, int kv, int head) const {
    const int64_t page = slot / page_size;
    const int64_t offset = slot % page_size;
    return page * PageElems() +
           ((int64_t{kv} * num_kv_heads + head) * page_size + offset) * head_dim;
  }
  // fp8 only: byte offset, within one layer's pages, of the fp32 scale of K (kv = 0) or V of
  // one token slot.
  int64_t ScaleOffset(int64_t slot, int kv, int head) const {
    const int64_t page = slot / page_size;
    const int64_t offset = slot % page_size;
    return page * PageElems() + PageScaleStart() +
           ((int64_t{kv} * num_kv_heads + head) * page_size + offset) * 4;
  }
};

}  // namespace tandem
