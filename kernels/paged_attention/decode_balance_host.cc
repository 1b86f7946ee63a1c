// Evening out the decode CTAs' work (decode_balance.h).
#include <algorithm>

#include "base/check.h"
#include "kernels/paged_attention/decode_balance.h"

namespace tandem {

int64_t StridedMakespan(std::span<const int32_t> tiles, int slots) {
  CHECK_GE(slots, 1);
  std::vector<int64_t> load(std::min<size_t>(tiles.size(), static_cast<size_t>(slots)), 0);
  for (size_t u = 0; u < tiles.size(); ++u) load[u % slots] += tiles[u];
  return load.empty() ? 0 : *std::max_element(load.begin(), load.end());
}

void BalanceDecodeTiles(std::span<const int32_t> tiles, int slots,
                        std::vector<DecodeUnitPiece>& out) {
  CHECK_GE(slots, 1);
  out.clear();
  int64_t total = 0;
  for (const int32_t t : tiles) {
    CHECK_GE(t, 0);
    total += t;
  }
  // CTA c's range ends at stream tile end_of(c); `pos` walks the stream, `slot` the CTAs.
  const auto end_of = [&](int c) { return total * (c + 1) / slots; };
  int64_t pos = 0;
  int slot = 0;
  for (size_t u = 0; u < tiles.size(); ++u) {
    const int64_t unit_begin = pos, unit_end = pos + tiles[u];
    while (pos < unit_end) {
      while (end_of(slot) <= pos) ++slot;  // CTAs whose range is empty or already filled
      const int64_t piece_end = std::min(unit_end, end_of(slot));
      out.push_back({static_cast<int32_t>(u), static_cast<int32_t>(pos - unit_begin),
                     static_cast<int32_t>(piece_end - unit_begin), slot});
      pos = piece_end;
    }
  }
}

}  // namespace tandem
