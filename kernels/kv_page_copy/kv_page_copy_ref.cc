#include <cstring>

#include "kernels/kv_page_copy/kv_page_copy.h"

namespace tandem {

absl::Status KvPageCopyRef(const KvPageCopyArgs& a) {
  if (a.num_pages < 0 || a.num_pages > kKvPageCopyMaxPages || a.page_bytes < 0 ||
      a.num_layers < 0 || a.num_layers > kKvPageCopyMaxLayers) {
    return absl::InvalidArgumentError("KvPageCopy: page or layer count or size out of range");
  }
  for (int64_t l = 0; l < a.num_layers; ++l) {
    for (int i = 0; i < a.num_pages; ++i) {
      std::memcpy(static_cast<char*>(a.dst_layer) + l * a.dst_layer_bytes +
                      int64_t{a.dst_pages[i]} * a.page_bytes,
                  static_cast<const char*>(a.src_layer) + l * a.src_layer_bytes +
                      int64_t{a.src_pages[i]} * a.page_bytes,
                  static_cast<size_t>(a.page_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
